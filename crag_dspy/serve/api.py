"""The FastAPI app: ``POST /ask``, ``GET /health``, ``GET /program``, the page at ``/`` and ``/openapi.json``."""

from __future__ import annotations

import logging
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from ..faults import describe_error
from ..validation import QuestionError
from ..version import __version__
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

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_STATIC = files(__package__) / "static"
# The page's script is a file of its own so that the policy can forbid inline scripts.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


_NOT_AN_OBJECT = 'the body must be a JSON object such as {"question": "..."} sent as application/json'


def _describe(error: dict) -> str:
    """One of pydantic's errors as a phrase: ``question: String should have at most 2000 characters``."""
    kind, loc = error.get("type"), tuple(error.get("loc", ()))
    if kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "")
        position = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"the body is not valid JSON{position}{f' ({reason})' if reason else ''}"
    if loc == ("body",) and kind in {"model_attributes_type", "dict_type", "missing"}:
        return _NOT_AN_OBJECT
    where = ".".join(str(p) for p in loc if p != "body") or "body"
    return f"{where}: {error.get('msg', 'invalid')}"


def create_app(service: ProgramService) -> FastAPI:
    """An ASGI app serving ``service``; run it with any ASGI server (``python -m crag_dspy.serve`` uses uvicorn)."""
    app = FastAPI(
        title="crag-dspy",
        version=__version__,
        summary="Corrective RAG over a compiled DSPy program: answers with the full decision trace.",
        description=(
            "Ask with `POST /ask`. Every answer carries CRAG's trace: each document's grade, the action "
            "taken against the two thresholds, kept and dropped knowledge strips, the web query and "
            "results, fallbacks, errors, timings and LM usage. Invalid requests get 422; a 503 names the "
            "dependency that failed (`lm` or `store`). The page at `/` is a small UI over the same API."
        ),
    )
    page = (_STATIC / "index.html").read_text(encoding="utf-8")
    script = (_STATIC / "app.js").read_text(encoding="utf-8")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(_describe(e) for e in exc.errors())
        # pydantic's error objects may hold the offending input or exception objects: keep the JSON-safe part.
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
        body = ValidationErrorResponse(detail=f"invalid request: {detail}", errors=errors)
        return JSONResponse(status_code=422, content=body.model_dump(mode="json"))

    @app.exception_handler(QuestionError)
    async def _unaskable(request: Request, exc: QuestionError) -> JSONResponse:
        # A question the schema let through but CRAG refuses (e.g. only control characters): the client's
        # input, so a 422 like any invalid request, without an error log or a traceback.
        log.info("422: %s", exc)
        error = {"type": "question_error", "loc": ["body", "question"], "msg": str(exc)}
        body = ValidationErrorResponse(detail=f"invalid request: question: {exc}", errors=[error])
        return JSONResponse(status_code=422, content=body.model_dump(mode="json"))

    @app.exception_handler(DependencyError)
    async def _dependency(request: Request, exc: DependencyError) -> JSONResponse:
        log.error("503 (%s): %s", exc.dependency, exc)
        body = ErrorResponse(detail=str(exc), dependency=exc.dependency, trace=exc.trace)
        return JSONResponse(status_code=503, content=body.model_dump(mode="json"))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = ErrorResponse(detail=f"internal error: {describe_error(exc)}")
        return JSONResponse(status_code=500, content=body.model_dump(mode="json"))

    @app.post(
        "/ask",
        response_model=AskResponse,
        summary="Answer a question and return CRAG's full trace",
        responses={
            422: {
                "model": ValidationErrorResponse,
                "description": f"question missing, blank, not a string or over {QUESTION_MAX_CHARS} chars, "
                "or empty once control characters are removed",
            },
            500: {"model": ErrorResponse, "description": "a bug: the detail names the exception"},
            503: {
                "model": ErrorResponse,
                "description": "the LM or the store failed; `dependency` says which",
            },
        },
    )
    def ask(request: AskRequest) -> AskResponse:
        # A plain `def`: FastAPI runs it in its thread pool, so a slow LM call never blocks other requests.
        return service.ask(request.question)

    @app.get("/health", response_model=Health, summary="Liveness and what is loaded (makes no LM call)")
    def health() -> Health:
        return service.health()

    @app.get("/program", response_model=ProgramInfo, summary="The program served: thresholds, domain, scores")
    def program() -> ProgramInfo:
        return service.info()

    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @app.get("/app.js", include_in_schema=False)
    def page_script() -> Response:
        return Response(script, media_type="text/javascript", headers=_PAGE_HEADERS)

    return app
