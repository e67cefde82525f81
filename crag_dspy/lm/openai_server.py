"""A loopback OpenAI-compatible ``/v1/chat/completions`` endpoint over an in-process engine.

The embedded model is reached like any hosted OpenAI-compatible server (``dspy.LM`` via LiteLLM), so
both share one code path, log-probabilities and usage included. Only what that path uses is
implemented: chat completions with ``max_tokens``, ``temperature``, ``seed``, ``stop``, ``logprobs``,
``top_logprobs`` and ``stream`` (OpenAI's ``chat.completion.chunk`` server-sent events, one per
generated piece of text, ``stream_options.include_usage`` for a last chunk with the usage).

Loopback is not private: any local user or process (and a browser page tricked into posting to it) can
reach the port. So every request but ``/health`` must carry the server's key (``Authorization: Bearer``),
random per process and known only to the ``dspy.LM`` it was handed to. A request whose client has gone
(timed out, disconnected) stops generating at the engine's next check instead of holding the one
model for a retry that queues behind it.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from .ik_engine import Cancelled, Completion, ContextOverflow, EngineError

__all__ = [
    "ChatEngine",
    "OpenAIServer",
    "StreamRequest",
    "client_gone",
    "completion_chunk",
    "completion_response",
    "parse_request",
    "parse_stream",
]

log = logging.getLogger(__name__)

# llama.cpp's server defaults, so that a request without them behaves as it did there.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_MAX_TOKENS = 512


class ChatEngine(Protocol):
    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int | None = None,
        stop: list[str] = ...,
        seed: int | None = None,
        cancelled: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> Completion:
        """``cancelled`` is asked between steps of the work; when it says True the engine raises
        :class:`~crag_dspy.lm.ik_engine.Cancelled` (an engine that cannot stop may ignore it).

        ``on_text`` (passed for streamed requests only) gets the completion's text as it is generated,
        in pieces that join to the returned ``Completion.text``; an engine that cannot generate
        incrementally may ignore it, and the server then streams the whole text as one piece."""
        ...


def client_gone(connection: socket.socket) -> bool:
    """True when the peer of ``connection`` has closed it or reset it.

    A waiting client sends nothing until it has its answer, so a readable socket means end of file (or
    a reset): peeking one byte tells, without taking data from a client that did send more.
    """
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:
            return False
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):  # reset, or already closed on our side
        return True


class BadRequest(ValueError):
    """The request cannot be served as sent (HTTP 400)."""


@dataclass(frozen=True)
class StreamRequest:
    """A request for a streamed completion; ``include_usage``: a last chunk carries the usage."""

    include_usage: bool = False


def parse_stream(body: dict[str, Any]) -> StreamRequest | None:
    """Whether an OpenAI chat-completion request body asks for a streamed answer, and how."""
    if not body.get("stream"):
        return None
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object such as {\"include_usage\": true}")
    return StreamRequest(include_usage=bool(options.get("include_usage")))


def parse_request(body: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments of an OpenAI chat-completion request body (streamed or not: see
    :func:`parse_stream`)."""
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    top = body.get("top_logprobs")
    try:
        if int(max_tokens) < 1:
            raise BadRequest("max_tokens must be at least 1")
        return {
            "messages": messages,
            "max_tokens": int(max_tokens),
            "temperature": float(body.get("temperature", DEFAULT_TEMPERATURE)),
            "top_logprobs": (int(top) if top is not None else 1) if body.get("logprobs") else None,
            "stop": [str(s) for s in stop],
            "seed": int(body["seed"]) if body.get("seed") is not None else None,
        }
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad request parameter: {exc}") from exc


def _logprob(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _logprobs(completion: Completion) -> dict[str, Any] | None:
    if completion.logprobs is None:
        return None
    return {
        "content": [
            {**_logprob(e.token, e.logprob), "top_logprobs": [_logprob(t, lp) for t, lp in e.top]}
            for e in completion.logprobs
        ]
    }


def _usage(completion: Completion) -> dict[str, Any]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": completion.cached_tokens},
    }


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def completion_response(completion: Completion, model: str) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object for ``completion``."""
    return {
        "id": _completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": completion.text},
                "finish_reason": completion.finish_reason,
                "logprobs": _logprobs(completion),
            }
        ],
        "usage": _usage(completion),
    }


def completion_chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, str] | None,
    *,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion.chunk`` object: one choice with ``delta`` (``{"role": ...}``,
    ``{"content": ...}``, or ``{}`` with the ``finish_reason``), or with ``delta`` None, no choice and
    the ``usage`` (the last chunk when the request asked for ``stream_options.include_usage``). Every
    chunk of one completion has the same ``completion_id`` and ``created``."""
    choices = []
    if delta is not None:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}]
    chunk = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


class _ChunkStream:
    """One streamed completion written to ``handler``'s client: server-sent events in a chunked HTTP
    body (the connection stays open for the client's next request).

    The status line and headers go out with the first piece of text, not before: a request refused
    before any text (a prompt longer than the context, a model that failed to load) still gets its
    HTTP error status and JSON body, which clients report better than an error inside a stream."""

    def __init__(self, handler: _Handler, model: str, request: StreamRequest):
        self._handler, self._model, self._request = handler, model, request
        self._id, self._created = _completion_id(), int(time.time())
        self.started = False
        self._sent = ""  # the text streamed so far

    def _write(self, data: bytes) -> None:
        try:
            self._handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self._handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as exc:
            # Raised through the engine: generation stops and the model is free for the next request.
            raise Cancelled("request withdrawn by its client while its answer streamed") from exc

    def _event(self, payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        self._write(f"data: {data}\n\n".encode())

    def _chunk(self, delta: dict[str, str] | None, **fields: Any) -> None:
        self._event(completion_chunk(self._id, self._created, self._model, delta, **fields))

    def _start(self) -> None:
        if self.started:
            return
        self.started = True
        handler = self._handler
        handler.send_response(HTTPStatus.OK)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        try:
            handler.end_headers()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise Cancelled("request withdrawn by its client before its answer streamed") from exc
        self._chunk({"role": "assistant", "content": ""})

    def text(self, piece: str) -> None:
        """Send ``piece`` of the completion's text (the engine's ``on_text``)."""
        if not piece:
            return
        self._start()
        self._chunk({"content": piece})
        self._sent += piece

    def finish(self, completion: Completion) -> None:
        """Send what the engine did not stream, the finish reason (with the log-probabilities when
        asked for), the usage when asked for, and ``[DONE]``; then end the body."""
        if completion.text.startswith(self._sent):
            self.text(completion.text[len(self._sent) :])  # all of it, from an engine that cannot stream
        else:  # the engine streamed other text than it returned: the client cannot be told the truth
            raise EngineError("the engine streamed text that differs from its completion")
        self._start()
        self._chunk({}, finish_reason=completion.finish_reason, logprobs=_logprobs(completion))
        if self._request.include_usage:
            self._chunk(None, usage=_usage(completion))
        self._end()

    def fail(self, status: HTTPStatus, message: str) -> None:
        """End a stream already under way with an error event (its status was sent as 200)."""
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._event({"error": {"message": message, "type": kind, "code": status.value}})
        self._end()

    def _end(self) -> None:
        self._event("[DONE]")
        self._write(b"")  # the chunked body's last, empty chunk: "0\r\n\r\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: LiteLLM's client reuses its connection
    disable_nagle_algorithm = True  # the answer goes out at once, not after the client's delayed ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("embedded server: " + format, *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        try:
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up just before its answer
            log.info("embedded server: the client left before its answer was sent")
            self.close_connection = True

    def _error(self, status: HTTPStatus, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send(status, {"error": {"message": message, "type": kind, "code": status.value}})

    def _authorized(self) -> bool:
        """Whether the request carries the server's key; answers 401 when it does not."""
        key = self.server.api_key
        if key is None:
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode()):
            return True
        # The body may not have been read: close the connection rather than parse it as the next request.
        self.close_connection = True
        self._error(HTTPStatus.UNAUTHORIZED, "this server needs its key: Authorization: Bearer <key>")
        return False

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/health"):
            self._send(HTTPStatus.OK, {"status": "ok"})
        elif not self._authorized():
            return
        elif self.path == "/v1/models":
            self._send(
                HTTPStatus.OK, {"object": "list", "data": [{"id": self.server.model, "object": "model"}]}
            )
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {self.path}")

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {self.path}")
            return
        stream: _ChunkStream | None = None
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            arguments, streamed = parse_request(body), parse_stream(body)
            cancelled = functools.partial(client_gone, self.connection)
            if streamed is None:
                completion = self.server.engine.chat(**arguments, cancelled=cancelled)
                self._send(HTTPStatus.OK, completion_response(completion, self.server.model))
                return
            stream = _ChunkStream(self, self.server.model, streamed)
            completion = self.server.engine.chat(**arguments, cancelled=cancelled, on_text=stream.text)
            stream.finish(completion)
        except Cancelled as exc:
            log.info("embedded server: %s", exc)
            self.close_connection = True  # nobody is there to answer
        except (
            ValueError,
            ContextOverflow,
        ) as exc:  # bad JSON or parameters, bad messages, too long a prompt
            self._fail(stream, HTTPStatus.BAD_REQUEST, str(exc))
        except EngineError as exc:  # e.g. the model could not be loaded: the reason, not a traceback
            self._fail(stream, HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
        except Exception as exc:  # the client gets the reason, the server keeps serving
            log.exception("embedded engine failed")
            self._fail(stream, HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _fail(self, stream: _ChunkStream | None, status: HTTPStatus, message: str) -> None:
        """Answer with the error: an error response, or an error event in a stream already under way."""
        if stream is None or not stream.started:
            self._error(status, message)
            return
        self.close_connection = True  # whatever happens to the stream, this connection is done
        try:
            stream.fail(status, message)
        except Cancelled:
            log.info("embedded server: the client left before its error was sent")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: ChatEngine, model: str, api_key: str | None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.engine, self.model, self.api_key = engine, model, api_key


class OpenAIServer:
    """Serves ``engine`` on a free loopback port from a daemon thread until :meth:`close`.

    ``api_key`` is the key every request but ``/health`` must carry; ``None`` serves anyone who
    reaches the port, for fakes in tests and benchmarks only.
    """

    def __init__(self, engine: ChatEngine, model: str, *, api_key: str | None):
        self._server = _Server(engine, model, api_key)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="embedded-lm", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
