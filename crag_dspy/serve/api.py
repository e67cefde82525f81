"""The FastAPI app: ``POST /ask``, ``POST /ask/stream``, ``GET /health``, ``GET /program``, the page at ``/`` and ``/openapi.json``
(with ``/docs`` and ``/redoc`` without keys; with keys the schema needs one and those pages are off).

One app serves one program or several, one per domain (:class:`~crag_dspy.serve.domains.Domains`): a
request names its domain, the first served is the default.

A request passes, in order: the access log (an id, one JSON line), the trusted-host check, the body
limit (413), the API key (401; failed ones count against the rate limit of the client's address, 429
past it), the caller's rate limit (429), request validation (422), then the
bounded queue (503 when full) and the deadline (504). :class:`~crag_dspy.serve.policy.ServePolicy`
sets them all.
"""

# No `from __future__ import annotations`: FastAPI reads the dependencies in the signatures at
# runtime, and `authenticate` is local to create_app.
import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from fastapi.responses import JSONResponse as _JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..events import StageEvent
from ..faults import describe_error
from ..flag_policy import WITHHELD_ANSWER, OnFlag, without_answer
from ..trace import CRAGTrace
from ..validation import QuestionError, normalize_question, replace_surrogates
from ..version import __version__
from .access_log import AccessLog, question_hash
from .admission import DeadlineExceeded, ModelQueue, QueueFull
from .auth import Caller, identify
from .body_limit import BodyLimit
from .client_trace import client_trace
from .domains import Domains, UnknownDomain
from .policy import ServePolicy
from .ratelimit import RateLimiter
from .schemas import (
    DOMAIN_MAX_CHARS,
    QUESTION_MAX_CHARS,
    AskRequest,
    AskResponse,
    ErrorResponse,
    Health,
    ProgramInfo,
    ValidationErrorResponse,
    ask_request_model,
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


# Stage events that carry the answer or its citations before the flag policy has judged it.
_WITHHELD_EVENTS = frozenset({"answer", "citations"})

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


def _trace_for(
    caller: Caller, debug: bool, trace: CRAGTrace | None, withhold: bool = False, answer: str | None = None
):
    """The trace as this caller may see it: full only when it asked (``?debug=1``) and may. Else with
    ``withhold``, without the answer, which becomes ``answer`` (flag_policy's ``without_answer``): a
    client showing ``trace.answer`` must not show a withheld value. The full trace keeps it, for the
    operator to tell a planted value from a withheld true one."""
    if trace is None:
        return None
    if debug and caller.debug:
        return trace
    return client_trace(without_answer(trace, answer) if withhold else trace)


def _snapshot(trace: CRAGTrace) -> CRAGTrace:
    # The run goes on in its thread and still writes to ``trace``; pydantic-core copies it in one step
    # under the GIL, so the copy is a consistent state of the run.
    return CRAGTrace.model_validate(trace.model_dump())


class JSONResponse(_JSONResponse):
    """A JSON response that never fails to encode: a lone surrogate (in text an LM or a web page sent,
    which the clients clean where it enters) is U+FFFD, not a UnicodeEncodeError and a 500."""

    def render(self, content: object) -> bytes:
        return super().render(replace_surrogates(content))


def _error(status: int, body: ErrorResponse, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"), headers=headers)


def _sse(event: str, data: dict) -> str:
    """One server-sent event: its name and one line of JSON."""
    # Sent as UTF-8: a lone surrogate would end the stream with an encoding error (see JSONResponse).
    return f"event: {event}\ndata: {json.dumps(replace_surrogates(data), ensure_ascii=False)}\n\n"


def _answer_body(answer: AskResponse, caller: Caller, debug: bool) -> dict:
    """The JSON body of an answer as this caller may see it."""
    full = debug and caller.debug
    withheld = answer.status == "withheld"
    trace = _trace_for(caller, debug, answer.trace, withheld, WITHHELD_ANSWER)
    body = answer.model_copy(update={"trace": trace, "full_trace": full})
    return body.model_dump(mode="json")


def _failure(
    exc: Exception, caller: Caller, debug: bool, started: list[CRAGTrace], on_flag: OnFlag = "warn"
) -> tuple[int, ErrorResponse, dict[str, str] | None]:
    """The status, body and headers of a question that got no answer: the queue was full (503), the
    deadline passed (504, with the trace so far) or a dependency failed (503 naming it). Under
    ``withhold`` the trace carries no answer: the run ended before the flag policy judged it."""
    unjudged = on_flag == "withhold"
    if isinstance(exc, QueueFull):
        log.warning("503 (queue): %s", exc)
        return 503, ErrorResponse(detail=str(exc)), {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, DeadlineExceeded):
        log.warning("504: %s", exc)
        trace = _snapshot(started[0]) if started else None
        return 504, ErrorResponse(detail=str(exc), trace=_trace_for(caller, debug, trace, unjudged)), None
    if isinstance(exc, DependencyError):
        log.error("503 (%s): %s", exc.dependency, exc)
        body = ErrorResponse(
            detail=str(exc), dependency=exc.dependency, trace=_trace_for(caller, debug, exc.trace, unjudged)
        )
        return 503, body, None
    raise TypeError(f"not a failure of a question: {type(exc).__name__}") from exc


async def _until_disconnected(http: Request) -> None:
    """Return once the client has closed its connection (the body has been read: the next message
    the server gives is the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def _question_refused(exc: QuestionError) -> JSONResponse:
    """The 422 of a question the schema let through but CRAG refuses (e.g. only control characters):
    the client's input, so logged at INFO without a traceback."""
    log.info("422: %s", exc)
    error = {"type": "question_error", "loc": ["body", "question"], "msg": str(exc)}
    body = ValidationErrorResponse(detail=f"invalid request: question: {exc}", errors=[error])
    return JSONResponse(status_code=422, content=body.model_dump(mode="json"))


def _too_much_history(request: AskRequest, service: ProgramService) -> JSONResponse | None:
    """The 422 of a request whose history has more turns than its domain's program takes (the schema
    bounds it by the most any domain served takes), in the shape of every invalid request; else None."""
    most, given = service.crag.config.max_history_turns, len(request.history)
    if given <= most:
        return None
    message = f"List should have at most {most} items for domain {service.loaded.domain!r}, not {given}"
    log.info("422: history: %s", message)
    error = {"type": "too_long", "loc": ["body", "history"], "msg": message}
    body = ValidationErrorResponse(detail=f"invalid request: history: {message}", errors=[error])
    return JSONResponse(status_code=422, content=body.model_dump(mode="json"))


def _rate_limited(why: str, wait: int) -> HTTPException:
    """A 429 saying ``why`` and when to retry (``wait`` seconds, also in ``Retry-After``)."""
    return HTTPException(429, f"{why}: retry in {wait} s", headers={"Retry-After": str(wait)})


def _unknown_domain(exc: UnknownDomain, where: str) -> JSONResponse:
    """The 422 of a request that named a domain not served, in the shape of every invalid request."""
    log.info("422: %s", exc)
    loc = ["body", "domain"] if where == "body" else ["query", "domain"]
    error = {"type": "unknown_domain", "loc": loc, "msg": str(exc)}
    body = ValidationErrorResponse(detail=f"invalid request: domain: {exc}", errors=[error])
    return JSONResponse(status_code=422, content=body.model_dump(mode="json"))


def create_app(
    service: ProgramService | Sequence[ProgramService] | Domains, policy: ServePolicy | None = None
) -> FastAPI:
    """An ASGI app serving ``service``; run it with any ASGI server (``python -m crag_dspy.serve`` uses uvicorn).

    ``service`` is one program, or several on different domains (the first is the default): a request
    chooses one with its ``domain`` field; all share the keys, the rate limit, the queue and the deadline.
    ``policy`` defaults to the loopback developer's (no keys, the full trace on ``?debug=1``); listen
    beyond this machine only with one that has keys (:func:`~crag_dspy.serve.policy.policy_for`).
    """
    policy = policy or ServePolicy()
    domains = Domains.of(service)
    # The request model states the history limit; with several domains, the largest (each checks its own).
    Ask = ask_request_model(max(domains.choose(n).crag.config.max_history_turns for n in domains.names))

    def ask_request(request: Ask) -> AskRequest:  # type: ignore[valid-type]  # a model made at run time
        """The request body, validated by the model that states this server's history limit."""
        return request

    queue = ModelQueue(policy.workers, policy.queue)
    limiter = RateLimiter(policy.rate_limit) if policy.rate_limit else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        queue.close()

    app = FastAPI(
        title="crag-dspy",
        version=__version__,
        summary="Corrective RAG over a compiled DSPy program: answers with the decision trace.",
        description=(
            "Ask with `POST /ask`. Every answer carries CRAG's trace: each document's grade, the action "
            "taken against the two thresholds, the kept knowledge strips and the sources of the dropped "
            "ones, the web query and result links, fallbacks, errors, timings and LM usage; the raw "
            "passages and web contents only with `?debug=1` for a debug key. Invalid requests get 422; a "
            "503 names the dependency that failed (`lm` or `store`) or says the queue is full; 504: no "
            "answer within the deadline. Send the API key as `Authorization: Bearer <key>` or "
            "`X-API-Key`. The page at `/` is a small UI over the same API."
        ),
        lifespan=lifespan,
        # With keys the schema is served behind them (below); the Swagger and ReDoc pages are off, as a
        # browser opening them could not send a key with the schema request they make.
        openapi_url=None if policy.keys_required else "/openapi.json",
        docs_url=None if policy.keys_required else "/docs",
        redoc_url=None if policy.keys_required else "/redoc",
    )
    app.state.queue = queue  # for operators' probes and tests: how many questions are admitted
    app.state.domains = domains
    # The last added runs first: every request gets an id and an access line, refused ones too.
    # Innermost: a foreign Host is refused before any body is read; 413 from Content-Length or while
    # streaming, in the JSON shape of every error (Starlette's own limit answers text/plain).
    app.add_middleware(BodyLimit, max_bytes=policy.max_body_bytes)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(policy.allowed_hosts))
    app.add_middleware(AccessLog)
    page = (_STATIC / "index.html").read_text(encoding="utf-8")
    script = (_STATIC / "app.js").read_text(encoding="utf-8")
    bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")
    api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the key itself")

    def authenticate(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
        header_key: Annotated[str | None, Security(api_key_header)],
    ) -> Caller:
        address = request.client.host if request.client else "-"
        # Failed authentications count against the rate limit per client address, or keys could be
        # guessed at full speed. Checked before the key: were only wrong keys refused with a 429, a right
        # one would still tell itself by its 200.
        failures = f"failed-auth:{address}"
        if limiter is not None and (wait := limiter.wait(failures)) is not None:
            raise _rate_limited(
                f"too many requests without a valid key from this address ({limiter.spec})", wait
            )
        presented = header_key or (credentials.credentials if credentials else None)
        caller = identify(presented, policy)
        if caller is None:
            if limiter is not None:
                limiter.hit(failures)
            problem = "the API key is not valid" if presented else "an API key is required"
            raise HTTPException(
                401,
                f"{problem}: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        request.state.key_id = caller.key_id
        if limiter is not None:
            wait = limiter.hit(f"key:{caller.key_id}" if caller.key_id else f"addr:{address}")
            if wait is not None:
                raise _rate_limited(f"rate limit of {limiter.spec} reached", wait)
        return caller

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail = "; ".join(_describe(e) for e in exc.errors())
        # pydantic's error objects may hold the offending input or exception objects: keep the JSON-safe part.
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
        body = ValidationErrorResponse(detail=f"invalid request: {detail}", errors=errors)
        return JSONResponse(status_code=422, content=body.model_dump(mode="json"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a body it cannot parse (JSON nested too deep for the parser, ...) with a bare
        # 400; it is invalid input like any other, so a 422 in the shape of every invalid request.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            cause = exc.__cause__
            why = "nested too deeply" if isinstance(cause, RecursionError) else type(cause).__name__
            log.info("422: the body could not be parsed (%s)", why)
            message = f"the body is not valid JSON ({why})"
            error = {"type": "json_invalid", "loc": ["body"], "msg": message}
            body = ValidationErrorResponse(detail=f"invalid request: {message}", errors=[error])
            return JSONResponse(status_code=422, content=body.model_dump(mode="json"))
        return await http_exception_handler(request, exc)

    @app.exception_handler(QuestionError)
    async def _unaskable(request: Request, exc: QuestionError) -> JSONResponse:
        return _question_refused(exc)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, ErrorResponse(detail=f"internal error: {describe_error(exc)}"))

    def admitted(
        request: AskRequest, http: Request, caller: Caller, debug: bool
    ) -> ProgramService | Response:
        """What /ask and /ask/stream check alike before a run: the debug key, the domain asked for and the
        history's length. The domain's service, or the response that refuses the request."""
        if debug and not caller.debug:
            raise HTTPException(403, "the full trace (?debug=1) needs a debug key (CRAG_DEBUG_API_KEYS)")
        http.state.question_hash = question_hash(request.question)
        try:
            service = domains.choose(request.domain)
        except UnknownDomain as exc:
            return _unknown_domain(exc, "body")
        if (refused := _too_much_history(request, service)) is not None:
            return refused
        http.state.domain = service.loaded.domain
        return service

    @app.post(
        "/ask",
        response_model=AskResponse,
        summary="Answer a question and return CRAG's trace",
        responses={
            401: {"model": ErrorResponse, "description": "no API key, or not a valid one"},
            403: {"model": ErrorResponse, "description": "?debug=1 without a debug key"},
            413: {"model": ErrorResponse, "description": "the body is over the size limit"},
            422: {
                "model": ValidationErrorResponse,
                "description": f"question missing, blank, not a string or over {QUESTION_MAX_CHARS} chars, "
                "or empty once control characters are removed; a domain not served",
            },
            429: {"model": ErrorResponse, "description": "the caller's rate limit; see Retry-After"},
            500: {"model": ErrorResponse, "description": "a bug: the detail names the exception"},
            503: {
                "model": ErrorResponse,
                "description": "the LM or the store failed (`dependency` says which), or the queue is full "
                "(see Retry-After)",
            },
            504: {"model": ErrorResponse, "description": "no answer within the deadline; the trace so far"},
        },
    )
    async def ask(
        request: Annotated[AskRequest, Depends(ask_request)],
        http: Request,
        caller: Annotated[Caller, Depends(authenticate)],
        debug: Annotated[
            bool, Query(description="the full trace (raw passages, web contents): debug keys only")
        ] = False,
    ) -> Response:
        service = admitted(request, http, caller, debug)
        if isinstance(service, Response):
            return service
        history = [turn.model_dump() for turn in request.history]
        started: list[CRAGTrace] = []
        cancel = threading.Event()
        try:
            # CRAG runs on the queue's threads; this coroutine only waits, so the deadline is kept
            # while an LM call is under way. Past it the run stops as its next stage starts.
            future, running = queue.submit(
                lambda: service.ask(
                    request.question,
                    history=history,
                    on_start=started.append,
                    cancel=cancel,
                    on_flag=policy.on_flag,
                )
            )
            waiting = asyncio.ensure_future(
                queue.wait(future, running, policy.request_timeout_s, on_timeout=cancel.set)
            )
            # A client that leaves stops its run too, as on /ask/stream: an abandoned question would
            # keep its queue place (503 busy for others) and spend LM calls on an answer nobody reads.
            gone = asyncio.ensure_future(_until_disconnected(http))
            try:
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not waiting.done():
                cancel.set()  # a running question stops as its next stage starts
                future.cancel()  # a waiting one never runs
                waiting.cancel()
                log.info("the client left before its answer; the run stops at its next stage")
                return Response(status_code=499)  # nginx's "client closed request": nobody reads it
            answer = waiting.result()
        except (QueueFull, DeadlineExceeded, DependencyError) as exc:
            status, body, headers = _failure(exc, caller, debug, started, policy.on_flag)
            http.state.action = body.trace.action if body.trace else None
            return _error(status, body, headers)
        http.state.action = answer.action
        return JSONResponse(_answer_body(answer, caller, debug))

    @app.post(
        "/ask/stream",
        summary="Answer a question, telling each stage as it happens (server-sent events)",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {"text/event-stream": {}},
                "description": "`event: stage` per stage event (retrieved, graded, action, web_query, "
                "strips_kept, answer, citations; JSON: kind, data, seconds); `event: token` per piece of the "
                "answer's draft as the LM writes it (JSON: text; when the LM streams, never with on_flag "
                "'withhold'; the `answer` event's answer is final: it may add a unit or be \"I don't "
                'know"); then `event: answer` with the body `POST /ask` returns, or `event: error` with '
                "`status` (503, 504; 422 for a history CRAG refuses, 500 for a bug) and its error body",
            },
            401: {"model": ErrorResponse, "description": "no API key, or not a valid one"},
            403: {"model": ErrorResponse, "description": "?debug=1 without a debug key"},
            422: {
                "model": ValidationErrorResponse,
                "description": "as for POST /ask (a domain not served too)",
            },
            429: {"model": ErrorResponse, "description": "the caller's rate limit; see Retry-After"},
            503: {"model": ErrorResponse, "description": "the queue is full (see Retry-After)"},
        },
    )
    async def ask_stream(
        request: Annotated[AskRequest, Depends(ask_request)],
        http: Request,
        caller: Annotated[Caller, Depends(authenticate)],
        debug: Annotated[
            bool, Query(description="the full trace (raw passages, web contents): debug keys only")
        ] = False,
    ) -> Response:
        service = admitted(request, http, caller, debug)
        if isinstance(service, Response):
            return service
        try:
            # Refused before the stream begins, as /ask refuses it: once the 200 is sent, a 422 can
            # only be an event.
            normalize_question(request.question, max_chars=None)
        except QuestionError as exc:
            return _question_refused(exc)
        history = [turn.model_dump() for turn in request.history]
        loop = asyncio.get_running_loop()
        # (event name, data) in the order the run's thread sent them; the stream below sends them.
        events: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        started: list[CRAGTrace] = []
        cancel = threading.Event()

        def send(name: str, data: dict) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (name, data))  # from the run's thread

        def on_event(event: StageEvent) -> None:
            if policy.on_flag == "withhold" and event.kind in _WITHHELD_EVENTS:
                return  # the answer may yet be withheld: it reaches the client in the final event only
            send("stage", event.model_dump(mode="json"))

        def on_token(text: str) -> None:
            send("token", {"text": text})

        # A withheld answer must not reach the client as tokens either.
        tokens = on_token if policy.on_flag != "withhold" else None
        try:
            # Admitted (or refused with a 503) before the stream begins, with the keys, limits and
            # deadline of POST /ask.
            future, running = queue.submit(
                lambda: service.ask(
                    request.question,
                    history=history,
                    on_start=started.append,
                    cancel=cancel,
                    on_event=on_event,
                    on_token=tokens,
                    on_flag=policy.on_flag,
                )
            )
        except QueueFull as exc:
            status, body, headers = _failure(exc, caller, debug, started, policy.on_flag)
            return _error(status, body, headers)
        answer = asyncio.ensure_future(
            queue.wait(future, running, policy.request_timeout_s, on_timeout=cancel.set)
        )

        async def stream() -> AsyncIterator[str]:
            try:
                while not answer.done() or not events.empty():
                    next_event = asyncio.ensure_future(events.get())
                    await asyncio.wait({next_event, answer}, return_when=asyncio.FIRST_COMPLETED)
                    if next_event.done():
                        yield _sse(*next_event.result())
                    else:
                        next_event.cancel()
                try:
                    done = answer.result()
                except (DeadlineExceeded, DependencyError) as exc:
                    status, body, _ = _failure(exc, caller, debug, started, policy.on_flag)
                    yield _sse("error", {"status": status, **body.model_dump(mode="json")})
                except QuestionError as exc:  # the client's input (e.g. its history): no traceback
                    log.info("422: %s", exc)
                    body = ErrorResponse(detail=f"invalid request: {exc}")
                    yield _sse("error", {"status": 422, **body.model_dump(mode="json")})
                except Exception as exc:  # the 200 is sent: a bug can only end the stream as an event
                    log.exception("unhandled error on POST /ask/stream")
                    body = ErrorResponse(detail=f"internal error: {describe_error(exc)}")
                    yield _sse("error", {"status": 500, **body.model_dump(mode="json")})
                else:
                    yield _sse("answer", _answer_body(done, caller, debug))
            finally:
                # The client left before the answer: the run stops as its next stage starts.
                if not answer.done():
                    cancel.set()
                    answer.cancel()

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.get(
        "/health", response_model=Health, summary="Liveness and what is loaded (makes no LM call; no key)"
    )
    def health() -> Health:
        return domains.default.health().model_copy(update={"domains": domains.names})

    # Load balancers' probes often send HEAD (a 405 to them is a dead service); the same answer, its body
    # dropped by the server. Not in the schema: a second operation of the same name would clash there.
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get(
        "/program",
        response_model=ProgramInfo,
        summary="The program of a domain served (the default one unless ?domain=): thresholds, scores",
        responses={
            401: {"model": ErrorResponse, "description": "no API key, or not a valid one"},
            422: {"model": ValidationErrorResponse, "description": "a domain not served"},
        },
    )
    def program(
        caller: Annotated[Caller, Depends(authenticate)],
        domain: Annotated[
            str | None, Query(max_length=DOMAIN_MAX_CHARS, description="which domain (default: the first)")
        ] = None,
    ) -> Response:
        try:
            chosen = domains.choose(domain)
        except UnknownDomain as exc:
            return _unknown_domain(exc, "query")
        info = chosen.info().model_copy(update={"domains": domains.names})
        return JSONResponse(info.model_dump(mode="json"))

    if policy.keys_required:

        @app.get("/openapi.json", include_in_schema=False)
        def openapi_schema(caller: Annotated[Caller, Depends(authenticate)]) -> JSONResponse:
            return JSONResponse(app.openapi())

    @app.get("/", include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page, headers=_PAGE_HEADERS)

    @app.get("/app.js", include_in_schema=False)
    def page_script() -> Response:
        return Response(script, media_type="text/javascript", headers=_PAGE_HEADERS)

    return app
