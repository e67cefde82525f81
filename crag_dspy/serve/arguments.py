"""The flags of ``crag-dspy serve`` (``python -m crag_dspy.serve``), apart from the server: this module
imports no server package, so ``--help`` works before the ``serve`` extra is installed."""

from __future__ import annotations

import argparse

from ..cli import (
    add_flag_policy_argument,
    add_lm_arguments,
    add_program_arguments,
    add_storage_arguments,
    command_prog,
)

__all__ = ["build_parser"]


def build_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """The flags of ``crag-dspy serve`` / ``python -m crag_dspy.serve``; ``epilog`` ends its help."""
    parser = argparse.ArgumentParser(
        prog=command_prog("serve", "crag_dspy.serve"),
        epilog=epilog,
        description="Serve a CRAG program, or one per domain, over HTTP: POST /ask (answer + full trace), "
        "GET /health, GET /program, the OpenAPI schema at /openapi.json, and a page at / that shows "
        "CRAG's decision.",
    )
    add_program_arguments(parser, several=True)
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    add_flag_policy_argument(parser)
    g = parser.add_argument_group("server")
    g.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1, this machine only)"
    )
    g.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes, each with the program and its backends loaded (default: 1). Needs an LM "
        "server (--lm with --lm-api-base, or a hosted API), not the embedded LM. Each worker runs "
        "CRAG_SERVE_WORKERS questions at once and keeps its own rate limits (docs/scale-out.md)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback without API keys (CRAG_API_KEYS); anyone who reaches the port can "
        "use the LM. Without it, a --host other than loopback needs keys",
    )
    return parser
