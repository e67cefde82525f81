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

from crag_dspy.program import PROGRAM_FORMAT, PROGRAM_FORMAT_VERSION, read_program

__all__ = ["convert", "main"]


def convert(document: dict[str, Any]) -> dict[str, Any]:
    """A format-6 program document (state, config and metadata in an envelope) as format 7."""
    if document.get("format") != PROGRAM_FORMAT or document.get("format_version") != 6:
        raise ValueError("not a format-6 crag-dspy program")
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
    converted = convert(json.loads(args.old.read_text(encoding="utf-8")))
    new.parent.mkdir(parents=True, exist_ok=True)
    new.write_text(json.dumps(converted, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    read_program(new)  # the converted file must be one this crag-dspy reads
    print(f"{args.old} -> {new} (format {PROGRAM_FORMAT_VERSION})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
