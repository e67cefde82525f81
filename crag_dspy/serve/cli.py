"""``python -m crag_dspy.serve``: load a program once, then serve the API and the page with uvicorn."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from ..cli import (
    add_lm_arguments,
    add_program_arguments,
    add_storage_arguments,
    program_from_args,
    settings_from_args,
    user_error_types,
)
from ..redaction import configure_logging, redact
from .api import create_app
from .policy import policy_for
from .service import ProgramService

__all__ = ["build_parser", "main"]

log = logging.getLogger("crag_dspy.serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m crag_dspy.serve",
        description="Serve a CRAG program over HTTP: POST /ask (answer + full trace), GET /health, "
        "GET /program, the OpenAPI schema at /openapi.json, and a page at / that shows CRAG's decision.",
    )
    add_program_arguments(parser)
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    g = parser.add_argument_group("server")
    g.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1, this machine only)"
    )
    g.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    g.add_argument(
        "--insecure",
        action="store_true",
        help="listen beyond loopback without API keys (CRAG_API_KEYS); anyone who reaches the port can "
        "use the LM. Without it, a --host other than loopback needs keys",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)  # every handler redacts credentials
    if not 1 <= args.port <= 65535:
        print(f"error: --port must be in 1..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        # Exposure first: refusing to listen must not wait for a model to load.
        policy, warnings = policy_for(settings_from_args(args), args.host, insecure=args.insecure)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        # Everything that can fail on bad input (program file, domain, LM settings, store) fails here,
        # before the server listens.
        loaded = program_from_args(args)
    except user_error_types() as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)  # e.g. a --chroma-host with user:password@
        return 2
    # The access log is the service's record of use: it is written whatever the verbosity.
    logging.getLogger("crag_dspy.serve.access").setLevel(logging.INFO)
    what = f"program {loaded.path}" if loaded.compiled else "the uncompiled default program (no --program)"
    print(
        f"serving {what} for domain {loaded.domain!r} on http://{args.host}:{args.port}/",
        file=sys.stderr,
        flush=True,
    )
    app = create_app(ProgramService(loaded), policy)
    # uvicorn's own access lines would repeat ours without the request id, key id and action.
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    return 0
