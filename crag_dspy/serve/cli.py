"""``python -m crag_dspy.serve``: load the programs once (one per domain), then serve the API and the page
with uvicorn; with ``--workers N``, N uvicorn worker processes each build the same app (:func:`worker_app`)."""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import socket
import sys

from fastapi import FastAPI

from ..app import LoadedProgram
from ..cli import error_line, interruptible, settings_from_args, user_error_types
from ..redaction import configure_logging
from .api import create_app
from .arguments import build_parser
from .connections import run_server, serve_config
from .domains import Domains
from .policy import policy_for
from .programs import load_programs
from .service import ProgramService
from .workers import ARGV_ENV, embedded_lm_refusal

__all__ = ["bind_refusal", "build_parser", "main", "worker_app"]

log = logging.getLogger("crag_dspy.serve")


def enable_access_log() -> None:
    """The access log is the service's record of use: it is written whatever the verbosity."""
    logging.getLogger("crag_dspy.serve.access").setLevel(logging.INFO)


@interruptible  # during start-up (ingest, model load); once serving, uvicorn handles Ctrl-C itself
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)  # every handler redacts credentials
    if not 1 <= args.port <= 65535:
        print(f"error: --port must be in 1..65535, got {args.port}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"error: --workers must be at least 1, got {args.workers}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
        refusal = embedded_lm_refusal(settings, args.workers)
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
        # Exposure first: refusing to listen must not wait for a model to load.
        policy, warnings = policy_for(settings, args.host, insecure=args.insecure)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        # A port in use would otherwise be found by uvicorn after the whole load (exit 3, its own log).
        refused = bind_refusal(args.host, args.port)
        if refused:
            print(f"error: {refused}", file=sys.stderr)
            return 2
        # Everything that can fail on bad input (program file, domain, LM settings, store) fails here,
        # before the server listens; with workers, a store that needs an ingest gets it here, once.
        domains = Domains([ProgramService(one) for one in load_programs(args)])
        for name in domains.names:
            domains.choose(name).warm_up()
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)  # e.g. a --chroma-host with user:password@
        return 2
    enable_access_log()
    what = "; ".join(_served(name, domains.choose(name).loaded) for name in domains.names)
    processes = f" with {args.workers} worker processes" if args.workers > 1 else ""
    default = f" (default {domains.names[0]!r}: a request's 'domain' chooses)" if len(domains) > 1 else ""
    print(
        f"serving {what} on http://{args.host}:{args.port}/{processes}{default}",
        file=sys.stderr,
        flush=True,
    )
    if args.workers == 1:
        app = create_app(domains, policy)
        started = run_server(serve_config(app, settings, host=args.host, port=args.port, log_level="info"))
        return 0 if started else 1
    if settings.rate_limit.strip().lower() not in ("", "none"):
        print(
            f"note: the rate limit ({settings.rate_limit}) and the queue are per worker process: a client "
            f"may get up to {args.workers}x the rate in all",
            file=sys.stderr,
            flush=True,
        )
    del domains  # the workers load their own; this process only supervises them
    gc.collect()
    os.environ[ARGV_ENV] = json.dumps(argv)
    config = serve_config(
        "crag_dspy.serve.cli:worker_app",
        settings,
        factory=True,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level="info",
    )
    return 0 if run_server(config) else 1


def bind_refusal(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host``:``port`` (in use, an address not of this machine),
    or None. Bound and released at once, as uvicorn binds it (SO_REUSEADDR): a port another server
    listens on is refused, one left in TIME_WAIT is not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            hint = (
                " (another server listens there: stop it or choose another --port)"
                if (exc.errno == errno.EADDRINUSE)
                else ""
            )
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"
    return None


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn's factory): the parent's command line, loaded again."""
    try:
        argv = json.loads(os.environ[ARGV_ENV])
    except (KeyError, ValueError) as exc:
        raise RuntimeError(
            f"{ARGV_ENV} does not hold the serve command line: start workers with serve --workers N"
        ) from exc
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    policy, _ = policy_for(settings_from_args(args), args.host, insecure=args.insecure)  # parent warned
    # The parent opened the same program a moment ago: the store is complete, so nothing is ingested
    # or parsed here (and N workers never ingest the same domain at once).
    services = [ProgramService(one) for one in load_programs(args, progress=False)]
    for service in services:
        service.warm_up()
    enable_access_log()
    return create_app(Domains(services), policy)


def _served(name: str, loaded: LoadedProgram) -> str:
    """How the start-up line names one program served: its file, or the uncompiled default."""
    what = f"program {loaded.path}" if loaded.compiled else "the uncompiled default program (no --program)"
    return f"{what} for domain {name!r}"
