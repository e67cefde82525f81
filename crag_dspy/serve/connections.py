"""Connections that never finish their request are closed: uvicorn has no header- or body-read timeout.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) only once a response has been
sent, and from the first byte of the next request on it waits for the rest without a limit; a new
connection that sends part of its headers and waits is never closed, nor one that sends its headers
("Content-Length: 1000") and then trickles or stops its body. Keys, rate limits and the queue act only
after the headers (the body is read before the queue), so such connections held file descriptors until
the process ran out and ``/health`` stopped answering. :class:`HeaderDeadline` adds four rules to
uvicorn's HTTP protocol:

- a connection must complete its request headers within ``header_timeout_s`` of being opened or of its
  previous response, else it is closed (408-less, as nginx's ``client_header_timeout``);
- a request's whole body must arrive within ``body_timeout_s`` of its headers, else it is answered 408
  and the connection closed (the app reading the body sees the client gone): a deadline for the whole
  body, not between reads, so a body sent a byte at a time is cut too. Time in which uvicorn itself
  stopped reading (the app has not taken the body yet) does not count;
- a request's line and headers may take at most ``max_header_bytes`` bytes, else it is answered 431 and
  the connection closed: the header timeout alone let one connection push a header at the network's
  speed for its whole length, buffered by httptools (h11 stops at its own 16 KB with a 400);
- at most ``max_waiting_connections`` connections may wait for a request (its headers or its body) at
  once (per process): the one that has waited longest is closed to admit a new one, so a flood of
  half-open connections cannot lock out a client whose request arrives whole (a load balancer's
  ``/health``).

uvicorn's ``limit_concurrency`` is not used for this: it still accepts the connections and answers 503
to every request past the limit, ``/health`` included.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..settings import Settings

try:  # uvicorn's "auto" choice: httptools when installed, else h11; the deadline works on both
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is an optional dependency of uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_MAX_WAITING_CONNECTIONS",
    "HeaderDeadline",
    "ServeConfig",
    "protocol_class",
    "run_server",
    "serve_config",
]

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_HEADER_BYTES = 65536
# The answer to a request cut short (a body that did not arrive in time, a head over the limit); the
# connection closes after it (its request is half-read, so the next bytes on it could not be told from a
# new request).
_CLOSING_RESPONSE = (
    b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
DEFAULT_MAX_WAITING_CONNECTIONS = 100


class ServeConfig(uvicorn.Config):
    """uvicorn's configuration with the connection limits; the HTTP protocol is :func:`protocol_class`.

    A module-level class, so that ``--workers`` can pickle it to its worker processes."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        max_waiting_connections: int = DEFAULT_MAX_WAITING_CONNECTIONS,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        **kwargs: Any,
    ) -> None:
        if header_timeout_s <= 0:
            raise ValueError(f"header_timeout_s must be positive, got {header_timeout_s}")
        if body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be positive, got {body_timeout_s}")
        if max_waiting_connections < 1:
            raise ValueError(f"max_waiting_connections must be at least 1, got {max_waiting_connections}")
        if max_header_bytes < 1:
            raise ValueError(f"max_header_bytes must be at least 1, got {max_header_bytes}")
        # h11 (when httptools is not installed) gets the same limit; it answers 400 past it.
        kwargs.setdefault("h11_max_incomplete_event_size", max_header_bytes)
        super().__init__(app, http=protocol_class(), **kwargs)
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_waiting_connections = max_waiting_connections


class HeaderDeadline:
    """Mixin over one of uvicorn's HTTP protocols (listed first in the bases): see the module's doc.

    "Waiting for headers" means no request is under way on the connection: none yet, or the last one
    answered (uvicorn's ``cycle`` is None or complete); "waiting for a body", that the request's
    headers are in and its body is not (``cycle.more_body``). A request whose body is complete is never
    closed by these rules, however long the program takes: the request deadline bounds that."""

    config: Any
    cycle: Any
    connections: set[Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    flow: Any

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_cycle: Any = None  # the request whose body the body timer is for
        self._arm_header_deadline()
        self._evict_longest_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        self._cancel_body_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        waiting = self.waiting_for_headers
        super().data_received(data)  # type: ignore[misc]
        if waiting and self.waiting_for_headers:
            # Counted once parsed, so a body sent in the head's read is not taken for header bytes.
            self._head_bytes += len(data)
            if self._head_bytes > self.config.max_header_bytes and not self.transport.is_closing():
                self._head_too_large()
                return
        self._watch_body()

    def _head_too_large(self) -> None:
        log.info("closing a connection whose request head passed %d bytes", self.config.max_header_bytes)
        self._close_with(
            b"431 Request Header Fields Too Large",
            f"the request line and headers are over {self.config.max_header_bytes} bytes "
            "(CRAG_SERVE_MAX_HEADER_BYTES)",
        )

    def _close_with(self, status: bytes, detail: str) -> None:
        """Answer ``status`` with ``{"detail": detail}`` and close the connection."""
        body = json.dumps({"detail": detail}).encode()
        self.transport.write(_CLOSING_RESPONSE % (status, len(body), body))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._cancel_body_deadline()
        if not self.transport.is_closing():
            self._arm_header_deadline()  # the next request's headers get their own deadline

    @property
    def waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    @property
    def waiting_for_body(self) -> bool:
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not cycle.response_complete

    def _watch_body(self) -> None:
        """Arm the body deadline when a request's headers are in and its body is not (once per request:
        the deadline is for the whole body); cancel it once the body is complete."""
        if not self.waiting_for_body or self.transport.is_closing():
            self._cancel_body_deadline()
            return
        if self._body_cycle is not self.cycle:
            self._cancel_body_deadline()
            self._body_cycle = self.cycle
            self._body_timer = self.loop.call_later(self.config.body_timeout_s, self._body_deadline_passed)

    def _cancel_body_deadline(self) -> None:
        timer = getattr(self, "_body_timer", None)
        if timer is not None:
            timer.cancel()
        self._body_timer, self._body_cycle = None, None

    def _body_deadline_passed(self) -> None:
        self._body_timer = None
        if self.cycle is not self._body_cycle or not self.waiting_for_body or self.transport.is_closing():
            return
        if self.flow.read_paused:  # uvicorn stopped reading until the app takes the body: not the client
            self._body_timer = self.loop.call_later(self.config.body_timeout_s, self._body_deadline_passed)
            return
        log.info(
            "closing a connection whose request body did not arrive within %.3g s (body_timeout_s)",
            self.config.body_timeout_s,
        )
        if self.cycle.response_started:
            self.transport.close()
            return
        self._close_with(
            b"408 Request Timeout",
            f"the request body did not arrive within {self.config.body_timeout_s:g} s of its headers "
            "(CRAG_SERVE_BODY_TIMEOUT_S)",
        )

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._waiting_since = time.monotonic()
        self._head_bytes = 0  # the next request's head: bytes since the connection opened or answered
        self._header_timer = self.loop.call_later(self.config.header_timeout_s, self._header_deadline_passed)

    def _cancel_header_deadline(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _header_deadline_passed(self) -> None:
        self._header_timer = None
        if self.waiting_for_headers and not self.transport.is_closing():
            log.info(
                "closing a connection without a complete request after %.3g s (header_timeout_s)",
                self.config.header_timeout_s,
            )
            self.transport.close()

    def _evict_longest_waiting(self) -> None:
        waiting = [
            other
            for other in self.connections
            if isinstance(other, HeaderDeadline)
            and (other.waiting_for_headers or other.waiting_for_body)
            and not other.transport.is_closing()
        ]
        excess = len(waiting) - self.config.max_waiting_connections
        if excess <= 0:
            return
        # Since the connection opened or answered its previous request: a body's wait continues its headers'.
        waiting.sort(key=lambda other: other._waiting_since)
        log.warning(
            "%d connections wait for a request (max_waiting_connections %d): closing the %d oldest",
            len(waiting),
            self.config.max_waiting_connections,
            excess,
        )
        for other in waiting[:excess]:
            other.transport.close()


class H11HeaderDeadline(HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with the header and body deadlines."""


if HttpToolsProtocol is not None:

    class HttpToolsHeaderDeadline(HeaderDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the header and body deadlines."""


def protocol_class() -> type[asyncio.Protocol]:
    """The HTTP protocol uvicorn's "auto" would choose (httptools when installed), with the deadlines."""
    return H11HeaderDeadline if HttpToolsProtocol is None else HttpToolsHeaderDeadline


def run_server(config: ServeConfig) -> bool:
    """Serve until interrupted, as ``uvicorn.run`` does, with worker processes when ``config.workers > 1``
    (``uvicorn.run`` builds its own ``Config``, which would drop the connection limits). False when a
    single-process server never started (uvicorn has logged why, e.g. the port is in use)."""
    server = uvicorn.Server(config)
    try:
        if config.workers > 1:
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[config.bind_socket()]).run()
            return True
        config.load_app()  # as uvicorn.run: a single process serves the app object it was given
        server.run()
    except KeyboardInterrupt:  # as uvicorn.run: Ctrl-C during start-up or shutdown ends quietly
        pass
    return server.started


def serve_config(app: Any, settings: Settings, **kwargs: Any) -> ServeConfig:
    """The uvicorn configuration ``serve`` runs ``app`` with (an ASGI app, or an import string with
    ``factory=True``): the connection limits from ``settings``, uvicorn's access log off (the service
    writes its own, with the request id, key id and action); ``kwargs`` go to uvicorn (host, port, ...).

    Proxy headers (``X-Forwarded-For``, ``X-Forwarded-Proto``) are believed only from
    ``settings.forwarded_allow_ips``: uvicorn's default trusts them from loopback (and its
    ``FORWARDED_ALLOW_IPS`` variable), so any local client could pose as any address and reset its rate
    limit. Without addresses uvicorn's proxy middleware is not installed at all."""
    trusted = list(settings.forwarded_allow_ips)
    return ServeConfig(
        app,
        header_timeout_s=settings.serve_header_timeout_s,
        body_timeout_s=settings.serve_body_timeout_s,
        max_waiting_connections=settings.serve_max_waiting_connections,
        max_header_bytes=settings.serve_max_header_bytes,
        access_log=False,
        proxy_headers=bool(trusted),
        # Never None: uvicorn would read FORWARDED_ALLOW_IPS from the environment, a setting outside ours.
        forwarded_allow_ips=trusted or "",
        **kwargs,
    )
