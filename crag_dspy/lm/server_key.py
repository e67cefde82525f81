"""A ``dspy.LM`` whose response-cache key names the server it asks.

DSPy leaves ``api_base`` out of its cache key (``dspy.clients.execution.IGNORED_CACHE_KEYS``), so that
a key or a changed port does not empty the cache. For a server the user names (``--lm-api-base``) that
is wrong twice over: after one good run a wrong base URL still answers every cached prompt (the run
looks healthy until a new prompt fails), and two servers serving the same model name share answers.
:class:`ServerKeyedLM` adds a digest of the base URL to each call's key; the request sent is unchanged.
The embedded model keeps DSPy's plain key (its port changes between runs, its model name and engine
are in the model string).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dspy
from dspy.clients._deprecation import warn_openai_messages
from dspy.clients.execution import PreparedCall, aexecute, execute, finalize, prepare
from dspy.utils.callback import with_callbacks

__all__ = ["SERVER_KEY_FIELD", "ServerKeyedLM", "server_digest"]

SERVER_KEY_FIELD = "_crag_lm_server"
"""The field of a cached request that holds :func:`server_digest` of the LM's base URL."""


def server_digest(api_base: str) -> str:
    """A SHA-256 digest of ``api_base`` without its ``user:password@`` part, query or fragment, so that
    no secret enters the cache (its keys are hashes, but a digest of a short password can be guessed):
    the scheme and host compare case-insensitively, a trailing slash does not matter."""
    parts = urlsplit(api_base.strip())
    host = (parts.hostname or "").lower()
    netloc = f"{host}:{parts.port}" if parts.port else host
    plain = urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), "", ""))
    return hashlib.sha256(plain.encode()).hexdigest()


@dataclasses.dataclass
class _ServerKeyedCall(PreparedCall):
    """A prepared call whose cache key also names the server (its :attr:`server` digest)."""

    server: str = ""

    def key(self, lm: Any, asynchronous: bool) -> dict[str, Any]:
        return {**super().key(lm, asynchronous), SERVER_KEY_FIELD: self.server}


class ServerKeyedLM(dspy.LM):
    """A ``dspy.LM`` (same arguments, with an ``api_base``) whose cached responses are kept per server:
    calls through ``lm(...)`` and ``await lm.acall(...)`` (what DSPy's modules and adapters use) add
    :func:`server_digest` of ``api_base`` to DSPy's cache key. Everything else, the request sent to
    the server included, is DSPy's own."""

    @property
    def server(self) -> str:
        """:func:`server_digest` of this LM's ``api_base`` (read each call: a copy may change it)."""
        return server_digest(str(self.kwargs.get("api_base") or ""))

    def _keyed(self, call: PreparedCall) -> _ServerKeyedCall:
        fields = {f.name: getattr(call, f.name) for f in dataclasses.fields(call)}
        return _ServerKeyedCall(**fields, server=self.server)

    # BaseLM.__call__ and acall, with the prepared call keyed: DSPy gives no other hook into the key.
    @with_callbacks
    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        call = self._keyed(prepare(self, prompt, messages, kwargs))
        warn_openai_messages(self, messages)
        return finalize(self, call, execute(self, call))

    @with_callbacks
    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        # Preparing may read local media files: off the event loop, as DSPy does.
        call = await asyncio.to_thread(prepare, self, prompt, messages, kwargs, asynchronous=True)
        keyed = self._keyed(call)
        warn_openai_messages(self, messages)
        return finalize(self, keyed, await aexecute(self, keyed))
