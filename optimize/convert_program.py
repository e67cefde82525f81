"""``python -m optimize.convert_program OLD.json [NEW.json]``: a format-6 program file as format 7.

One-off: format 7 is DSPy's own save format (the state at the top level, the config beside it,
crag-dspy's fields in ``metadata``, :mod:`crag_dspy.program`). The state, config and compile metadata
are copied as they are, so the converted program routes and answers exactly as before. Without NEW
the file is converted in place; a trained evaluator's folder beside it needs no change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dspy.utils.saving import get_dependency_versions

from crag_dspy.program import (
    PROGRAM_FORMAT,
    PROGRAM_FORMAT_VERSION,
    ProgramError,
    read_program,
    read_program_json,
)

__all__ = ["convert", "main"]

_FORMAT_6_KEYS = ("state", "config", "metadata", "dspy_version", "crag_dspy_version", "created")


def convert(document: dict[str, Any]) -> dict[str, Any]:
    """A format-6 program document (state, config and metadata in an envelope) as format 7."""
    if (
        not isinstance(document, dict)
        or document.get("format") != PROGRAM_FORMAT
        or document.get("format_version") != 6
    ):
        raise ValueError("not a format-6 crag-dspy program")
    missing = [key for key in _FORMAT_6_KEYS if key not in document]
    if missing:
        raise ValueError(f"a format-6 program needs {', '.join(missing)}")
    if not all(isinstance(document[key], dict) for key in ("state", "config", "metadata")):
        raise ValueError("a format-6 program's state, config and metadata are objects")
    versions = {**get_dependency_versions(), "dspy": document["dspy_version"]}
    return {
        **document["state"],
        "config": document["config"],
        "metadata": {
            "dependency_versions": versions,
            "format": PROGRAM_FORMAT,
            "format_version": PROGRAM_FORMAT_VERSION,
            "crag_dspy_version": document["crag_dspy_version"],
            "created": document["created"],
            **document["metadata"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m optimize.convert_program", description=__doc__.split("\n")[0]
    )
    parser.add_argument("old", type=Path, help="format-6 program JSON")
    parser.add_argument("new", type=Path, nargs="?", help="where to write it (default: in place)")
    args = parser.parse_args(argv)
    new = args.new or args.old
    try:
        converted = convert(read_program_json(args.old))
    except ProgramError as exc:
        parser.error(str(exc))
    except ValueError as exc:  # after ProgramError, which is a ValueError too
        parser.error(f"{args.old}: cannot convert: {exc}")
    new.parent.mkdir(parents=True, exist_ok=True)
    # Written beside NEW and checked there first: a conversion this crag-dspy cannot read must not
    # replace a file, least of all the old program when converting in place.
    tmp = new.with_name(new.name + ".converting")
    tmp.write_text(json.dumps(converted, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    try:
        read_program(tmp)
    except ProgramError as exc:
        tmp.unlink()
        parser.error(f"{args.old}: the converted program would not load: {str(exc).split(': ', 1)[-1]}")
    tmp.replace(new)
    print(f"{args.old} -> {new} (format {PROGRAM_FORMAT_VERSION})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
