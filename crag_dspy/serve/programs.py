"""The programs a ``serve`` command line names: each ``--program`` (a file, a bundled domain's name or a
folder of program JSONs) loaded on its own domain, ready for :class:`~crag_dspy.serve.domains.Domains`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..app import LoadedProgram
from ..cli import program_from_args
from ..files import link_outside
from ..program import ProgramError

__all__ = ["load_programs", "program_paths"]


def program_paths(given: Sequence[Path] | None) -> list[Path | None]:
    """The program files ``--program`` names, in order: a folder gives its ``*.json`` files by name (a
    link among them leading out of the folder is refused); no ``--program`` gives ``[None]`` (the
    uncompiled default program)."""
    if not given:
        return [None]
    paths: list[Path | None] = []
    for path in given:
        if path.is_dir():
            found = sorted(p for p in path.glob("*.json") if p.is_file())
            if not found:
                raise ProgramError(f"--program {path}: the folder holds no program JSON (*.json)")
            paths += [_inside(p, path) for p in found]
        else:
            paths.append(path)
    return paths


def _inside(program: Path, folder: Path) -> Path:
    """``program`` (a file of ``folder``), refused when it is a link leading out of the folder, as the
    corpus's links are: a folder of programs may come from an archive, and ``b.json -> /etc/passwd`` was
    opened and parsed."""
    outside = link_outside(program, folder.resolve(), "program folder")
    if outside is not None:
        raise ProgramError(
            f"--program {folder}: {outside}; copy the file into the folder instead of linking to it"
        )
    return program


def load_programs(args: argparse.Namespace, *, lm=None, progress: bool = True) -> list[LoadedProgram]:
    """One :class:`LoadedProgram` per program ``args.program`` names (a list: serve's repeatable flag),
    each on the domain it was compiled for; the other flags (store, LM, thresholds) apply to all.

    Several programs may not share one domain flag: ``--domain``/``--domain-dir`` would put them all on
    one domain, where a request could not choose between them.
    """
    paths = program_paths(args.program)
    if len(paths) > 1 and (args.domain is not None or args.domain_dir is not None):
        raise ProgramError(
            f"--domain/--domain-dir name one domain, and {len(paths)} programs were given: with several "
            "programs each runs on the domain it was compiled for; drop the flag, or serve one program"
        )
    loaded = []
    for path in paths:
        one = argparse.Namespace(**{**vars(args), "program": path})
        loaded.append(program_from_args(one, lm=lm, progress=progress))
    return loaded
