"""``serve --workers N``: N uvicorn worker processes, each loading the program and opening its backends.

uvicorn starts its workers as fresh interpreters that import an app factory by name, so a worker gets
its settings the way the parent did: the parent puts its command line in :data:`ARGV_ENV` (flags carry
no secrets; the service's keys and provider keys stay in the inherited environment, as in the parent),
and :func:`worker_app` parses it with the same parser and builds the same app.
"""

from __future__ import annotations

import json
import os

from fastapi import FastAPI

from ..settings import Settings

__all__ = ["ARGV_ENV", "embedded_lm_refusal", "worker_app"]

# Not CRAG_*: Settings warns about CRAG_ variables that are no setting.
ARGV_ENV = "_CRAG_SERVE_ARGV"


def embedded_lm_refusal(settings: Settings, workers: int) -> str | None:
    """Why ``workers`` processes must not run ``settings``' LM, or None when they may."""
    if workers <= 1 or settings.lm != "embedded":
        return None
    return (
        f"--workers {workers} with the embedded LM would start {workers} copies of the model in this "
        "machine's memory (about 1.8 GB each for the 1.5B, each answering one question at a time on the "
        "same CPU cores), which is slower, not faster. Run the model once in an OpenAI-compatible server "
        "(llama.cpp's llama-server with --parallel, vLLM, or a hosted API) and point the workers at it: "
        "--lm openai/<model> --lm-api-base http://<host>:<port>/v1. Or serve with one worker (the default); "
        "docs/scale-out.md"
    )


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn's factory): the parent's command line, loaded again."""
    from ..cli import program_from_args, settings_from_args
    from ..redaction import configure_logging
    from .api import create_app
    from .cli import build_parser, enable_access_log
    from .policy import policy_for
    from .service import ProgramService

    try:
        argv = json.loads(os.environ[ARGV_ENV])
    except (KeyError, ValueError) as exc:
        raise RuntimeError(
            f"{ARGV_ENV} does not hold the serve command line: start workers with serve --workers N"
        ) from exc
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    policy, _ = policy_for(
        settings_from_args(args), args.host, insecure=args.insecure
    )  # warned by the parent
    # The parent opened the same program a moment ago: the store is complete, so nothing is ingested
    # or parsed here (and N workers never ingest the same domain at once).
    loaded = program_from_args(args, progress=False)
    enable_access_log()
    return create_app(ProgramService(loaded), policy)
