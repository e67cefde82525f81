"""One structured line per request: who (a key's short hash), what (a question's hash), what came of it.

The line is JSON on the ``crag_dspy.serve.access`` logger so that it can be shipped and queried as is. It
never holds a key or a question: a hash is enough to count a caller's requests or to find repeats of one
question, and questions may hold personal data.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..redaction import question_hash

__all__ = ["REQUEST_ID_HEADER", "AccessLog", "access_record", "question_hash"]

log = logging.getLogger("crag_dspy.serve.access")

REQUEST_ID_HEADER = "X-Request-ID"


def access_record(scope: Scope, status: int, seconds: float) -> dict:
    """The access line's fields for a finished request; the routes add theirs to ``scope["state"]``."""
    state = scope.get("state", {})
    return {
        "event": "access",
        "request_id": state.get("request_id"),
        "method": scope.get("method"),
        "path": scope.get("path"),
        "status": status,
        "key_id": state.get("key_id"),
        "question_hash": state.get("question_hash"),
        "domain": state.get("domain"),
        "action": state.get("action"),
        "latency_ms": round(seconds * 1000, 1),
    }


class AccessLog:
    """Outermost middleware: gives each request an id (also sent as ``X-Request-ID``) and logs the line.

    The id is made here, never taken from the client, so that a log line cannot be forged or made to
    collide with another request's.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500  # what the client gets when the app fails before it answers

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info(json.dumps(access_record(scope, status, time.perf_counter() - started)))
