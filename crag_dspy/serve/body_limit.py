"""The request body limit, answered as every other error is: ``413`` with a JSON ``ErrorResponse``.

Starlette's own limit (``FastAPI(max_body_size=...)``) answers ``text/plain "Content Too Large"``,
and replaces any response once the declared length is over the limit, so a client parsing the
documented JSON error shape could not read it. This one refuses a declared length before reading
the body, and a streamed body (no length) at the first chunk past the limit.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit"]


class _TooLarge(HTTPException):
    """Raised from ``receive``: FastAPI passes an HTTPException through its body parsing (anything
    else becomes a 400 "error parsing the body"), and the app's handler answers it as JSON."""


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a JSON 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.detail = f"the request body is over the {max_bytes}-byte limit (setting CRAG_MAX_BODY_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _content_length(scope) > self.max_bytes:  # refused before a byte of the body is read
            await self._refuse(send)
            return
        received, started = 0, False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(413, self.detail)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except _TooLarge:  # read outside FastAPI's handlers (a middleware): answered here
            if started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"detail": self.detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        # The rest of the body is not read: the connection is closed after the answer.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
