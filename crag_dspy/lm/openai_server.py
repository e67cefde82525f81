"""A loopback OpenAI-compatible ``/v1/chat/completions`` endpoint over an in-process engine.

The embedded model is reached like any hosted OpenAI-compatible server (``dspy.LM`` via LiteLLM), so
both share one code path, log-probabilities and usage included. Only what that path uses is
implemented: non-streaming chat completions with ``max_tokens``, ``temperature``, ``seed``, ``stop``,
``logprobs`` and ``top_logprobs``.

Loopback is not private: any local user or process (and a browser page tricked into posting to it) can
reach the port. So every request but ``/health`` must carry the server's key (``Authorization: Bearer``),
random per process and known only to the ``dspy.LM`` it was handed to. A request whose client has gone
(timed out, disconnected) stops generating at the engine's next check instead of holding the one
model for a retry that queues behind it.
"""

from __future__ import annotations

import hmac
import json
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from .ik_engine import Cancelled, Completion, ContextOverflow, EngineError

__all__ = ["ChatEngine", "OpenAIServer", "client_gone", "completion_response", "parse_request"]

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
    ) -> Completion:
        """``cancelled`` is asked between steps of the work; when it says True the engine raises
        :class:`~crag_dspy.lm.ik_engine.Cancelled` (an engine that cannot stop may ignore it)."""
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


def parse_request(body: dict[str, Any]) -> dict[str, Any]:
    """The engine arguments of an OpenAI chat-completion request body."""
    if body.get("stream"):
        raise BadRequest("streaming is not supported by the embedded engine")
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


def completion_response(completion: Completion, model: str) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object for ``completion``."""
    logprobs = None
    if completion.logprobs is not None:
        logprobs = {
            "content": [
                {**_logprob(e.token, e.logprob), "top_logprobs": [_logprob(t, lp) for t, lp in e.top]}
                for e in completion.logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": completion.text},
                "finish_reason": completion.finish_reason,
                "logprobs": logprobs,
            }
        ],
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": completion.cached_tokens},
        },
    }


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
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            connection = self.connection
            completion = self.server.engine.chat(
                **parse_request(body), cancelled=lambda: client_gone(connection)
            )
        except Cancelled as exc:
            log.info("embedded server: %s", exc)
            self.close_connection = True  # nobody is there to answer
            return
        except (
            ValueError,
            ContextOverflow,
        ) as exc:  # bad JSON or parameters, bad messages, too long a prompt
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except EngineError as exc:  # e.g. the model could not be loaded: the reason, not a traceback
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
            return
        except Exception as exc:  # the client gets the reason, the server keeps serving
            log.exception("embedded engine failed")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            return
        self._send(HTTPStatus.OK, completion_response(completion, self.server.model))


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
