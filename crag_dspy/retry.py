"""Rewrite-and-retry of internal retrieval before the web: the pure parts (no model, no store).

On AMBIGUOUS or INCORRECT, CRAG can search its internal store again with a rewritten query, grade the
passages it had not graded yet and decide the action again on every grade so far, for at most
``internal_retries`` rounds (``CRAGConfig(internal_retries=...)``, 0: off); only a route that still uses the
web after the rounds searches it. The stages that run a round are ``CRAG.retry_round`` and
``CRAG.revise_query``; this module decides when the rounds stop, so that evaluation and threshold
tuning can re-route rounds already computed without a model.
"""

from __future__ import annotations

from collections.abc import Sequence

from .routing import Action, decide_action

__all__ = ["check_internal_retries", "is_new_query", "route_with_retries"]


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


def route_with_retries(
    rounds: Sequence[Sequence[float | None]], lower: float, upper: float, max_retries: int
) -> tuple[Action, int]:
    """The action after internal retry rounds, and how many rounds it took.

    ``rounds[0]`` are the grades of the first retrieval, ``rounds[i]`` those of the passages retry
    round ``i`` found that no earlier round had graded (empty when it found none, or failed). A round
    runs while the action on every grade so far uses the web (AMBIGUOUS or INCORRECT) and fewer than
    ``max_retries`` rounds ran; the rounds given end the retries early, as a failed round or one whose
    query repeated an earlier one does at run time (``CRAG.retry_internal`` stops there).
    ``max_retries=0`` is :func:`~crag_dspy.routing.decide_action` on ``rounds[0]``.
    """
    check_internal_retries(max_retries)
    if not rounds:
        raise ValueError("rounds needs the first retrieval's grades (rounds[0])")
    scores = list(rounds[0])
    action = decide_action(scores, lower, upper)
    used = 0
    for grades in rounds[1 : max_retries + 1]:
        if not action.uses_web:
            break
        scores.extend(grades)
        used += 1
        action = decide_action(scores, lower, upper)
    return action, used
