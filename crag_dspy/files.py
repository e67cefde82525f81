"""Files that users name, read without hanging or filling memory: regular files only, of bounded size.

Programs, history files and domain folders come from command lines, uploads and archives. A named pipe
blocks a read (or its open) for ever and a device node (``/dev/zero``) never ends, so neither is opened,
and a regular file is read only up to a limit. Anything else is named by what it is.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["file_kind", "link_outside", "not_regular", "read_regular_file"]


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) that is neither a regular file nor a folder is, for messages."""
    for test, kind in (
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "unknown"


def link_outside(path: Path, root: Path, folder: str) -> str | None:
    """Why ``path`` is not read when it, or a folder on its way, is a symbolic link leading out of ``root``
    (the resolved ``folder``: "corpus folder", "program folder") or nowhere; None for any other path.
    Folders from uploads and archives must not make ``/etc/passwd`` a document or a program."""
    target = path.resolve()
    if target.is_relative_to(root) and (target.exists() or not path.is_symlink()):
        return None
    if not target.exists():
        return f"{path}: a broken link ({target}): not read"
    kind = "folder" if target.is_dir() else "file"
    return f"{path}: a link to a {kind} outside the {folder} ({target}): not read"


def not_regular(path: Path) -> str | None:
    """Why ``path`` is not read when it exists and is neither a regular file nor a folder (a symbolic
    link is followed): ``<path>: not a regular file (a named pipe): not read``; None for anything else."""
    try:
        mode = path.stat().st_mode
    except OSError:  # missing, or a broken link: the caller says what is missing
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"{path}: not a regular file ({file_kind(mode)}): not read"


def read_regular_file(
    path: Path,
    max_bytes: int,
    noun: str,
    error: Callable[[str], Exception],
    *,
    form: str = "a JSON file",
    limit: str = "the limit",
) -> bytes:
    """The bytes of the regular file at ``path`` (a symbolic link to one is followed), at most
    ``max_bytes``. Anything else raises ``error`` with a message naming ``path`` and the ``noun`` the file
    should be ("program", "history file"), which is ``form``: a device, FIFO or socket (never opened), a
    file over the limit (refused by its size before a byte is read; ``limit`` says which limit), or one the
    system cannot read."""

    def irregular(mode: int) -> Exception:
        return error(f"{path}: not a regular file ({file_kind(mode)}); a {noun} is {form}")

    def too_large() -> Exception:
        return error(f"{path}: {noun} is larger than {max_bytes} bytes ({limit})")

    try:
        if not stat.S_ISREG(mode := path.stat().st_mode):
            raise irregular(mode)
        # O_NONBLOCK: a file swapped for a FIFO after the check above still cannot block the open.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise irregular(status.st_mode)
            if status.st_size > max_bytes:  # a 5 GB file is refused at once, not after max_bytes are read
                raise too_large()
            raw = file.read(max_bytes + 1)  # and a file that grew since is still read no further
    except OSError as exc:
        raise error(f"{path}: cannot read {noun} ({exc.strerror})") from None
    if len(raw) > max_bytes:
        raise too_large()
    return raw
