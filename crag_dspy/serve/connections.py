"""Connections that never finish their request headers are closed: uvicorn has no header-read timeout.

uvicorn closes an idle keep-alive connection (``timeout_keep_alive``) only once a response has been
sent, and from the first byte of the next request on it waits for the rest without a limit; a new
connection that sends part of its headers and waits is never closed. Keys, rate limits and the queue
act only after the headers, so such connections held file descriptors until the process ran out and
``/health`` stopped answering. :class:`HeaderDeadline` adds two rules to uvicorn's HTTP protocol:

- a connection must complete its request headers within ``header_timeout_s`` of being opened or of its
  previous response, else it is closed (408-less, as nginx's ``client_header_timeout``);
- at most ``max_waiting_connections`` connections may wait for headers at once (per process): the one
  that has waited longest is closed to admit a new one, so a flood of half-open connections cannot
  lock out a client whose request arrives whole (a load balancer's ``/health``).

uvicorn's ``limit_concurrency`` is not used for this: it still accepts the connections and answers 503
to every request past the limit, ``/health`` included.
"""

from __future__ import annotations

import asyncio
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
    "DEFAULT_HEADER_TIMEOUT_S",
    "DEFAULT_MAX_WAITING_CONNECTIONS",
    "HeaderDeadline",
    "ServeConfig",
    "protocol_class",
    "run_server",
    "serve_config",
]

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_WAITING_CONNECTIONS = 100


class ServeConfig(uvicorn.Config):
    """uvicorn's configuration with the two connection limits; the HTTP protocol is :func:`protocol_class`.

    A module-level class, so that ``--workers`` can pickle it to its worker processes."""

    def __init__(
        self,
        app: Any,
        *,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        max_waiting_connections: int = DEFAULT_MAX_WAITING_CONNECTIONS,
        **kwargs: Any,
    ) -> None:
        if header_timeout_s <= 0:
            raise ValueError(f"header_timeout_s must be positive, got {header_timeout_s}")
        if max_waiting_connections < 1:
            raise ValueError(f"max_waiting_connections must be at least 1, got {max_waiting_connections}")
        super().__init__(app, http=protocol_class(), **kwargs)
        self.header_timeout_s = header_timeout_s
        self.max_waiting_connections = max_waiting_connections


class HeaderDeadline:
    """Mixin over one of uvicorn's HTTP protocols (listed first in the bases): see the module's doc.

    "Waiting" means no request is under way on the connection: none yet, or the last one answered
    (uvicorn's ``cycle`` is None or complete). A request whose headers are complete is never closed
    by these rules, however long the program takes: the request deadline bounds that."""

    config: Any
    cycle: Any
    connections: set[Any]
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_deadline()
        self._evict_longest_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._arm_header_deadline()  # the next request's headers get their own deadline

    @property
    def waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._waiting_since = time.monotonic()
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
            and other.waiting_for_headers
            and not other.transport.is_closing()
        ]
        excess = len(waiting) - self.config.max_waiting_connections
        if excess <= 0:
            return
        waiting.sort(key=lambda other: other._waiting_since)
        log.warning(
            "%d connections wait for request headers (max_waiting_connections %d): closing the %d oldest",
            len(waiting),
            self.config.max_waiting_connections,
            excess,
        )
        for other in waiting[:excess]:
            other.transport.close()


class H11HeaderDeadline(HeaderDeadline, H11Protocol):
    """uvicorn's h11 protocol with the header deadline."""


if HttpToolsProtocol is not None:

    class HttpToolsHeaderDeadline(HeaderDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol with the header deadline."""


def protocol_class() -> type[asyncio.Protocol]:
    """The HTTP protocol uvicorn's "auto" would choose (httptools when installed), with the deadline."""
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
        max_waiting_connections=settings.serve_max_waiting_connections,
        access_log=False,
        proxy_headers=bool(trusted),
        # Never None: uvicorn would read FORWARDED_ALLOW_IPS from the environment, a setting outside ours.
        forwarded_allow_ips=trusted or "",
        **kwargs,
    )
