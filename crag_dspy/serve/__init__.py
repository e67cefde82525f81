"""Serve a CRAG program over HTTP: a JSON API (``POST /ask`` with the full trace, ``GET /health``,
``GET /program``, ``/openapi.json``) and a page at ``/`` that shows CRAG's decision.

Run it with ``python -m crag_dspy.serve --program runs/default/program.json``; embed it in your own
ASGI stack with ``create_app(ProgramService(open_program(path)), policy)`` (``policy_for`` reads the
keys and limits from the settings), or several domains at once with a list of services
(``--program a.json --program b.json``). Needs the ``serve`` extra.
"""

try:
    import fastapi  # noqa: F401
    import limits  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:
    # Not raised here: `python -m crag_dspy.serve` imports this package before its __main__ can print
    # this as one line; importing any of the names below raises it instead.
    MISSING_EXTRA: str | None = (
        f"crag_dspy.serve needs FastAPI, uvicorn and limits ({exc.name} is missing): pip install 'crag-dspy[serve]'"
    )
else:
    MISSING_EXTRA = None

__all__ = [
    "QUESTION_MAX_CHARS",
    "AskRequest",
    "AskResponse",
    "ClientTrace",
    "DependencyError",
    "Domains",
    "ErrorResponse",
    "ExposureError",
    "Health",
    "ProgramInfo",
    "ProgramService",
    "ServePolicy",
    "UnknownDomain",
    "ValidationErrorResponse",
    "client_trace",
    "create_app",
    "policy_for",
]

if MISSING_EXTRA is None:
    from .api import create_app
    from .client_trace import ClientTrace, client_trace
    from .domains import Domains, UnknownDomain
    from .policy import ExposureError, ServePolicy, policy_for
    from .schemas import (
        QUESTION_MAX_CHARS,
        AskRequest,
        AskResponse,
        ErrorResponse,
        Health,
        ProgramInfo,
        ValidationErrorResponse,
    )
    from .service import DependencyError, ProgramService
else:

    def __getattr__(name: str):
        if name in __all__:
            raise ImportError(MISSING_EXTRA)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
