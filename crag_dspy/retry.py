"""Rewrite-and-retry of internal retrieval before the web: the pure parts (no model, no store).

The rounds themselves are :func:`crag_dspy.stages.retry.retry_internal`, called by ``CRAG.forward``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_internal_retries", "is_new_query"]


def check_internal_retries(rounds: object) -> int:
    """Return ``rounds`` if it is a valid ``internal_retries`` (an integer >= 0), else raise ValueError."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise ValueError(f"internal_retries must be an integer >= 0, got {rounds!r}")
    return rounds


def _query_key(query: str) -> str:
    return " ".join(query.casefold().split())


def is_new_query(query: str, tried: Sequence[str]) -> bool:
    """Whether ``query`` differs from every query in ``tried`` (ignoring case and spacing): the same
    query would retrieve the same passages, all graded already."""
    key = _query_key(query)
    return bool(key) and all(_query_key(t) != key for t in tried)
