"""Real HTTP servers on loopback speaking OpenAI's, Tavily's and Chroma's protocols, with injectable faults.

Faults are injected at the protocol boundary, so the real clients (``dspy.LM`` with its retries,
backoff and error classification; ``tavily.TavilyClient``) run exactly as against hosted services.
Answers come from the ``script(system, user)`` functions that :class:`fakes.ScriptedLM` uses: these
servers test control flow and fault handling, never quality.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fakes import render

# fault(request_number, body) -> None (answer normally) or one of:
#   "429" / "500" / "503"  that status with a JSON error body and Retry-After: 0
#   "400" / "404"          that status with a JSON error body (a proxy refusing the model, a wrong path)
#   "429-long"             429 with Retry-After: 3600 (a provider's hourly quota is spent)
#   "429-minute"           429 with Retry-After: 59 (just under the 60 s cap on one call's waits)
#   "500-slow"             500 without Retry-After, so the client's own exponential backoff applies
#   "401-echo"             401 whose message echoes the Authorization header (worst-case key leak)
#   "hang"                 no answer within the client's timeout
#   "garbage"              200 with a body that is not JSON
#   "html"                 200 with a proxy's HTML page (Content-Type: text/html), as a captive portal sends
#   "json-list"            200 with JSON that is no completion object (another service's API)
#   "no-choices"           200 with a chat completion whose "choices" is empty
#   "null-content"         200 with a chat completion whose one message has "content": null
#   "blank-content"        200 with a chat completion whose one message has "content": " " (whitespace)
#   "number-content"       200 with a chat completion whose message content is 42 (no text)
#   "object-content"       200 with a chat completion whose message content is {"text": ...} (no text part)
#   "image-content"        200 with a chat completion whose message content is a list holding an image part
#   "cut"                  200 with a partial answer whose finish_reason is "length" (cut at max_tokens)
#   "filtered"             200 with a partial answer whose finish_reason is "content_filter"
#   "bad-usage"            200 with the scripted answer and a usage whose counts are negative or not numbers
#   "refusal"              200 with a message whose content is null and "refusal" says the LM will not help
#   "refusal-part"         200 with a message whose content is one refusal part
#   "reset"                close the connection without any response
#   "endless"              200 whose chunked body never ends (64 KB chunks as fast as the client reads)
#   "drip"                 200 whose chunked body is one byte every 0.2 s, never finishing
#   "drip-head"            a status line, then one header byte every 0.2 s, the head never finishing
#   "trailers"             200 with a complete chunked completion, then chunked trailer lines for ever
#   "gzip-bomb"            200, Content-Encoding: gzip, gzip: GZIP_BOMB_MB of zeros in a few KB
#   "301"                  301 to https with an HTML page (an HTTP base URL behind an HTTPS redirect)
#   "302-completion"       302 whose body is a chat completion (another server's answer)
#   "102"                  HTTP 102 Processing, then nothing
Fault = Callable[[int, dict], str | None]

EMPTY_CONTENTS: dict[str, object] = {
    "null-content": None,
    "blank-content": " \n",
    "number-content": 42,
    "object-content": {"text": "0 to 25 mg/L"},
    "image-content": [{"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}],
}
"""The message content of each fault whose chat completion holds no text."""

GZIP_BOMB_MB = 64
"""What the "gzip-bomb" fault inflates to (its body is a few KB)."""


@functools.cache
def gzip_bomb(megabytes: int = GZIP_BOMB_MB) -> bytes:
    """``megabytes`` MB of zeros, gzipped twice (Content-Encoding: gzip, gzip)."""
    return gzip.compress(gzip.compress(bytes(megabytes * 2**20), 1), 1)


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 answering POSTs with ``answer(handler, body, fault)``."""

    def __init__(self, fault: Fault | None = None, hang_s: float = 5.0):
        self.fault = fault or (lambda n, body: None)
        self.hang_s = hang_s
        self.requests: list[dict] = []  # {"time", "path", "body", "authorization", "fault"}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw or b"{}")
                with server._lock:
                    number = len(server.requests)
                    fault = server.fault(number, body)
                    server.requests.append(
                        {
                            "time": time.monotonic(),
                            "path": self.path,
                            "body": body,
                            "authorization": self.headers.get("Authorization"),
                            "fault": fault,
                        }
                    )
                if fault is None:
                    server.answer(self, body)
                else:
                    server._inject(self, fault, body)

            def do_GET(self):
                server.answer_get(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, handler, body: dict) -> None:
        raise NotImplementedError

    def answer_get(self, handler) -> None:
        self.send(handler, 404, {"error": f"no GET {handler.path}"})

    @staticmethod
    def send(
        handler,
        status: int,
        payload: object,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _inject(self, handler, fault: str, body: dict) -> None:
        def error(status: int, message: str) -> dict:
            # OpenAI reads error.message, Tavily detail.error: one body serves both protocols.
            return {
                "error": {"message": message, "type": "fake_error", "code": str(status)},
                "detail": {"error": message},
            }

        if fault in {"429", "500", "503"}:
            self.send(handler, int(fault), error(int(fault), f"injected {fault}"), {"Retry-After": "0"})
        elif fault == "429-long":
            self.send(handler, 429, error(429, "injected 429, quota spent"), {"Retry-After": "3600"})
        elif fault == "429-minute":
            self.send(handler, 429, error(429, "injected 429, retry in a minute"), {"Retry-After": "59"})
        elif fault in {"400", "404"}:
            self.send(handler, int(fault), error(int(fault), f"injected {fault}"))
        elif fault == "500-slow":
            self.send(handler, 500, error(500, "injected 500"))
        elif fault == "401-echo":
            message = f"Incorrect API key provided: {handler.headers.get('Authorization')}"
            self.send(handler, 401, error(401, message))
        elif fault == "hang":
            time.sleep(self.hang_s)
            handler.close_connection = True
        elif fault == "garbage":
            self.send(handler, 200, b"<html>502 Bad Gateway</html>")
        elif fault == "html":
            page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Proxy login</body></html>"
            self.send(handler, 200, page, content_type="text/html; charset=utf-8")
        elif fault == "json-list":
            self.send(handler, 200, [{"id": 1, "name": "not a completion"}])
        elif fault in EMPTY_CONTENTS or fault == "no-choices":
            reply = self.completion("")
            if fault == "no-choices":
                reply["choices"] = []
            else:
                reply["choices"][0]["message"]["content"] = EMPTY_CONTENTS[fault]
            self.send(handler, 200, reply)
        elif fault == "bad-usage":
            reply = self.completion("0 to 25 mg/L")
            reply["usage"] = {"prompt_tokens": -1e11, "completion_tokens": "many", "total_tokens": None}
            self.send(handler, 200, reply)
        elif fault in {"refusal", "refusal-part"}:
            reply = self.completion("")
            message = reply["choices"][0]["message"]
            if fault == "refusal":
                message.update(content=None, refusal="I can't help with that request.")
            else:
                message["content"] = [{"type": "refusal", "refusal": "I can't help with that request."}]
            self.send(handler, 200, reply)
        elif fault in {"cut", "filtered"}:
            reply = self.completion("The AquaProbe 220 measures")
            reply["choices"][0]["finish_reason"] = "length" if fault == "cut" else "content_filter"
            self.send(handler, 200, reply)
        elif fault == "reset":
            handler.close_connection = True
            handler.connection.shutdown(2)
        elif fault in {"endless", "drip"}:
            self._send_unending(handler, fault == "drip")
        elif fault in {"drip-head", "trailers"}:
            self._send_endless_head_or_trailers(handler, fault == "trailers")
        elif fault == "gzip-bomb":
            self.send(handler, 200, gzip_bomb(), {"Content-Encoding": "gzip, gzip"})
        elif fault == "301":
            location = {"Location": "https://127.0.0.1/v1/chat/completions"}
            page = b"<html><body><h1>301 Moved Permanently</h1>nginx</body></html>"
            self.send(handler, 301, page, location, content_type="text/html")
        elif fault == "302-completion":
            self.answer(handler, body, status=302)
        elif fault == "102":
            handler.close_connection = True
            handler.wfile.write(b"HTTP/1.1 102 Processing\r\n\r\n")
            handler.wfile.flush()
            time.sleep(self.hang_s)
        else:
            raise ValueError(f"unknown fault {fault!r}")

    @staticmethod
    def _send_unending(handler, drip: bool, give_up_s: float = 30.0) -> None:
        """A 200 whose chunked body never ends: until the client hangs up (or ``give_up_s``)."""
        handler.close_connection = True
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk = b" " if drip else b" " * 65536
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        end = time.monotonic() + give_up_s
        try:
            while time.monotonic() < end:
                handler.wfile.write(frame)
                handler.wfile.flush()
                if drip:
                    time.sleep(0.2)
        except OSError:  # the client gave up: what the test wants
            pass

    def _send_endless_head_or_trailers(self, handler, trailers: bool, every_s: float = 0.2) -> None:
        """A head dripped a byte every ``every_s`` s, or (``trailers``) a complete chunked completion
        followed by trailer lines for ever: until the client hangs up (or ``hang_s``)."""
        handler.close_connection = True
        if trailers:
            handler.send_response(200)
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            data = json.dumps(self.completion("x")).encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n")
        else:
            handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        end = time.monotonic() + self.hang_s
        try:
            while time.monotonic() < end:
                handler.wfile.write(b"X-Trailer: t\r\n" if trailers else b"X")
                handler.wfile.flush()
                time.sleep(every_s)
        except OSError:  # the client gave up: what the test wants
            pass

    def completion(self, text: str) -> dict:
        """The reply body that completes ``text`` (a chat completion for :class:`FakeOpenAI`)."""
        raise NotImplementedError


class FakeOpenAI(LoopbackServer):
    """``/v1/chat/completions`` answered by ``script(system, user)`` (see :func:`fakes.render`)."""

    def __init__(self, script: Callable[[str, str], object], fault: Fault | None = None, hang_s: float = 5.0):
        super().__init__(fault, hang_s)
        self.script = script

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1"

    def answer(self, handler, body: dict, status: int = 200) -> None:
        messages = body.get("messages", [])
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = messages[-1]["content"] if messages else ""
        text, logprobs = render(self.script(system, user), bool(body.get("logprobs")))
        prompt_tokens = len(system.split()) + len(user.split())
        reply = self.completion(text, logprobs, body.get("model", "fake"), prompt_tokens)
        if body.get("stream") and status == 200:
            self.send_stream(handler, reply)
        else:
            self.send(handler, status, reply)

    @staticmethod
    def send_stream(handler, reply: dict) -> None:
        """``reply`` (a chat completion) as OpenAI streams it: server-sent chunks, one delta a word (with the spaces before it), then
        the finish reason with the usage, and ``[DONE]``. JSON escapes stay as they are (``\\ud800``)."""
        choice = reply["choices"][0]
        text = choice["message"]["content"] or ""
        words = re.findall(r"\s*\S+", text) or [text]
        frames = [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        frames += [{"delta": {"content": word}, "finish_reason": None} for word in words]
        frames.append({"delta": {}, "finish_reason": choice["finish_reason"]})
        base = {key: reply[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        events = [base | {"choices": [{"index": 0, **frame}]} for frame in frames]
        events[-1]["usage"] = reply["usage"]
        data = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)
        LoopbackServer.send(handler, 200, data + b"data: [DONE]\n\n", content_type="text/event-stream")

    @staticmethod
    def completion(text: str, logprobs: object = None, model: str = "fake", prompt_tokens: int = 0) -> dict:
        """A chat completion whose message is ``text``."""
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": logprobs,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(text.split()),
                "total_tokens": prompt_tokens + len(text.split()),
            },
        }


class FakeTavily(LoopbackServer):
    """Tavily's ``/search`` answered with ``results`` (a list of dicts, or any JSON to test parsing)."""

    def __init__(self, results: object, fault: Fault | None = None, hang_s: float = 5.0):
        super().__init__(fault, hang_s)
        self.results = results

    def answer(self, handler, body: dict) -> None:
        self.send(handler, 200, {"query": body.get("query"), "results": self.results})


class FakeChroma(LoopbackServer):
    """A Chroma server's HTTP API, as much of it as a client opening collection ``name`` and querying it
    uses: the identity, tenant, database and heartbeat a client asks for while it opens, the collection
    (embedded with ``embedding_model``, holding one chunk), and queries (POSTs) answered with ``result``
    (any JSON, to test parsing) or a fault. With ``name=None`` it hangs once opened: every GET after the
    opening ones waits ``hang_s`` without an answer."""

    def __init__(
        self,
        result: object = None,
        fault: Fault | None = None,
        name: str | None = "t__kb",
        embedding_model: str = "fake-embedder",
        hang_s: float = 5.0,
    ):
        super().__init__(fault, hang_s)
        self.result, self.name, self.embedding_model = result, name, embedding_model

    def answer_get(self, handler) -> None:
        path = handler.path.split("?")[0].rstrip("/")
        uid = "00000000-0000-0000-0000-000000000001"
        if path.endswith("/auth/identity"):
            body: object = {"user_id": "", "tenant": "default_tenant", "databases": ["default_database"]}
        elif path.endswith(("/tenants/default_tenant", "/databases/default_database")):
            body = {"id": uid, "name": path.rsplit("/", 1)[-1], "tenant": "default_tenant"}
        elif path.endswith("/heartbeat"):
            body = {"nanosecond heartbeat": 1}
        elif self.name is None:
            time.sleep(self.hang_s)  # hung: the client must give up first
            handler.close_connection = True
            return
        elif path.endswith(f"/collections/{self.name}"):
            body = {
                "id": uid,
                "name": self.name,
                "configuration_json": {"hnsw": {"space": "cosine"}},
                "metadata": {"embedding_model": self.embedding_model},
                "dimension": 3,
                "tenant": "default_tenant",
                "database": "default_database",
            }
        elif path.endswith("/count"):
            body = 1
        else:
            super().answer_get(handler)
            return
        self.send(handler, 200, body)

    def answer(self, handler, body: dict) -> None:
        self.send(handler, 200, self.result)

    def _inject(self, handler, fault: str, body: dict | None = None) -> None:
        """Also ``drip-head`` (the status line, then a header byte every 0.2 s, never ending the head) and
        ``gzip`` (``result`` gzipped, although the client asked for no compression)."""
        if fault == "drip-head":
            handler.close_connection = True
            try:
                handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for _ in range(150):
                    handler.wfile.write(b"X")
                    handler.wfile.flush()
                    time.sleep(0.2)
            except OSError:  # the client gave up: what the test wants
                pass
        elif fault == "gzip":
            data = gzip.compress(json.dumps(self.result).encode())
            self.send(handler, 200, data, {"Content-Encoding": "gzip"})
        else:
            super()._inject(handler, fault, body or {})
