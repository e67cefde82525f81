"""``serve --workers N``: which LMs several worker processes may run, and how they get their settings.

uvicorn starts its workers as fresh interpreters that import an app factory by name, so a worker gets
its settings the way the parent did: the parent puts its command line in :data:`ARGV_ENV` (flags carry
no secrets; the service's keys and provider keys stay in the inherited environment, as in the parent),
and :func:`crag_dspy.serve.cli.worker_app` parses it with the same parser and builds the same app.
"""

from __future__ import annotations

from ..settings import Settings

__all__ = ["ARGV_ENV", "embedded_lm_refusal"]

# Not CRAG_*: Settings warns about CRAG_ variables that are no setting.
ARGV_ENV = "_CRAG_SERVE_ARGV"


def embedded_lm_refusal(settings: Settings, workers: int) -> str | None:
    """Why ``workers`` processes must not run ``settings``' LM, or None when they may."""
    if workers <= 1 or settings.lm != "embedded":
        return None
    return (
        f"--workers {workers} with the embedded LM would start {workers} copies of the model in this "
        "machine's memory (about 1.8 GB each for the default embedded model, each answering one question at a time on the "
        "same CPU cores), which is slower, not faster. Run the model once in an OpenAI-compatible server "
        "(llama.cpp's llama-server with --parallel, vLLM, or a hosted API) and point the workers at it: "
        "--lm openai/<model> --lm-api-base http://<host>:<port>/v1. Or serve with one worker (the default); "
        "docs/scale-out.md"
    )
