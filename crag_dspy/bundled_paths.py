"""How the bundled data's files are named to users: by what they are, not where the package sits.

``--program default`` and ``--domain default`` resolve to files under :data:`~crag_dspy.settings.
DEFAULT_DATA_DIR` (the checkout's ``data/`` or the installed package's ``bundled/``), and the errors
about them are written with the path they were read from. An absolute path of the installation tells a
user nothing they typed, and shows where (and under which account) the software is installed.
:func:`show_bundled_paths` names such paths relative to the bundled data at the CLIs' one error line
(:func:`crag_dspy.cli.error_line`); a user's own paths stay as given.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import settings

__all__ = ["bundled_name", "show_bundled_paths"]


def bundled_name(path: str | Path, data_dir: Path | None = None) -> str | None:
    """What ``path`` is in the bundled data (``data_dir``, by default :data:`~crag_dspy.settings.
    DEFAULT_DATA_DIR` as it is now): "the bundled program for domain 'default'" for a domain's
    ``program.json``, "bundled data/<domain>/<file>" for any other file or folder in it; None for a path
    outside it."""
    data_dir = data_dir or settings.DEFAULT_DATA_DIR
    try:
        parts = Path(path).relative_to(data_dir).parts
    except ValueError:
        return None
    if len(parts) == 2 and parts[1] == "program.json":
        return f"the bundled program for domain {parts[0]!r}"
    return "/".join(("bundled data", *parts))


def show_bundled_paths(text: str, data_dir: Path | None = None) -> str:
    """``text`` with each path inside ``data_dir`` replaced by its :func:`bundled_name`. A path ends at
    white space, a colon (``corpus.jsonl:3: not valid JSON``), a quote, a comma, a semicolon or a
    bracket, and a sentence's full stop stays; a name that only starts like the folder (``data2/``) is
    left alone."""
    data_dir = data_dir or settings.DEFAULT_DATA_DIR
    root = re.escape(str(data_dir))
    pattern = re.compile(rf"{root}(?:[/\\][^\s:'\",;()\[\]]+)?(?![\w-])")

    def shown(match: re.Match[str]) -> str:
        path = match.group(0).rstrip("/\\.")
        trailing = match.group(0)[len(path) :]  # a sentence's full stop stays
        return (bundled_name(path, data_dir) or path) + trailing

    return pattern.sub(shown, text)
