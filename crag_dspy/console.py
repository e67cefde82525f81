"""The ``crag-dspy`` command: ``ingest | ask | synthesize | compile | evaluate | serve | engine`` (also
``python -m crag_dspy``).

``ingest``, ``ask`` and ``engine`` are :mod:`crag_dspy.cli`'s. ``synthesize``, ``compile``, ``evaluate`` and
``serve`` hand their arguments, untouched, to the ``main`` of ``python -m optimize.synthesize``,
``python -m optimize.compile``, ``python -m optimize.evaluate`` and ``python -m crag_dspy.serve``: one parser each, so both spellings take the same flags, print the same
help and exit with the same codes. This module sits above all four, so none of them imports another's CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from . import cli

__all__ = ["DELEGATED", "main"]


def _synthesize(argv: list[str]) -> int:
    from optimize.synthesize import main as synthesize_main

    return synthesize_main(argv)


def _compile(argv: list[str]) -> int:
    from optimize.compile import main as compile_main

    return compile_main(argv)


def _evaluate(argv: list[str]) -> int:
    from optimize.evaluate import main as evaluate_main

    return evaluate_main(argv)


def _serve(argv: list[str]) -> int:
    from .serve import MISSING_EXTRA

    if MISSING_EXTRA is not None:  # as python -m crag_dspy.serve says it: one line, no traceback
        if {"-h", "--help"} & set(argv):
            # The flags are documented whether or not the extra is installed: reading them is how one
            # finds out what serving needs. The parser imports no server package.
            from .serve.arguments import build_parser

            build_parser(epilog=f"Not installed here: {MISSING_EXTRA}").parse_args(argv)
        print(f"error: {MISSING_EXTRA}", file=sys.stderr)
        return 2
    from .serve.cli import main as serve_main

    return serve_main(argv)


DELEGATED: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "synthesize": (
        _synthesize,
        "write labelled questions and relevance pairs from a domain's documents (python -m optimize.synthesize)",
    ),
    "compile": (_compile, "compile a program for a domain (same as python -m optimize.compile)"),
    "evaluate": (_evaluate, "evaluate a program against baselines (same as python -m optimize.evaluate)"),
    "serve": (_serve, "serve a program over HTTP, needs the serve extra (same as python -m crag_dspy.serve)"),
}
"""Subcommands whose arguments go, untouched, to another module's ``main``: (run, one-line help)."""


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its exit code (0 done, 2 bad input or setup, 1 a backend failed)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        with cli.via_console():  # their usage lines say "crag-dspy <command>", as typed
            return DELEGATED[argv[0]][0](argv[1:])
    return cli.main(
        argv, parser=cli.build_parser({name: summary for name, (_, summary) in DELEGATED.items()})
    )
