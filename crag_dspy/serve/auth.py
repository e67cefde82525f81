"""API keys: who a request comes from, checked in constant time, and named in logs by a short hash."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from .policy import ServePolicy

__all__ = ["Caller", "identify", "key_id", "presented_key"]


@dataclass(frozen=True)
class Caller:
    """A request's caller: ``key_id`` is None without a key; ``debug`` may see the full trace."""

    key_id: str | None
    debug: bool


def key_id(key: str) -> str:
    """A short, stable name for a key in logs and rate limits; the key itself is never written anywhere."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request carries: ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``."""
    if x_api_key and x_api_key.strip():
        return x_api_key.strip()
    scheme, _, value = (authorization or "").strip().partition(" ")
    return (value.strip() or None) if scheme.lower() == "bearer" else None


def _any_equal(presented: str, keys: Iterable[str]) -> bool:
    # Every key is compared, without stopping at a match, and each comparison takes the same time
    # however many characters agree: timing tells an attacker neither which key nor how close.
    given = presented.encode("utf-8")
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode("utf-8"))
    return found


def identify(presented: str | None, policy: ServePolicy) -> Caller | None:
    """The caller behind ``presented``, or None when the request must be refused (401)."""
    if not policy.keys_required:
        # No keys configured: loopback (or --insecure); a key sent anyway names nobody.
        return Caller(None, policy.open_debug)
    if presented is None:
        return None
    debug = _any_equal(presented, policy.debug_keys)
    valid = _any_equal(presented, policy.api_keys) or debug
    return Caller(key_id(presented), debug) if valid else None
