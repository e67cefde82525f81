"""Pure functions that turn an LM's yes/no answer into a relevance score in [0, 1]."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..adapters import NO_WORDS, YES_WORDS

__all__ = ["UnusableLogprobs", "clamp_score", "yes_probability"]


def _get(obj: Any, key: str, default: Any = None) -> Any:
    # Providers hand logprobs back either as plain dicts or as pydantic objects.
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _word(token: Any) -> str:
    return str(token).strip().strip("\"'`.,:*").lower()


class UnusableLogprobs(ValueError):
    """The LM's log-probabilities are no probabilities (above 0, infinite, NaN, not a number): the
    judgement is unusable output, like a reply that is not yes or no."""


ROUNDING_SLACK = 1e-6
"""A logprob above 0 by at most this much is a rounding error of a probability of 1 (read as 0)."""


def _probability(logprob: Any) -> float:
    """``exp(logprob)`` of one untrusted logprob; :class:`UnusableLogprobs` unless it is a finite number
    at most 0 (a missing one is probability 0)."""
    if logprob is None:
        return 0.0
    try:
        value = float(logprob)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UnusableLogprobs(f"logprob {str(logprob)[:40]!r} is not a number") from exc
    if isinstance(logprob, bool) or not (value <= ROUNDING_SLACK and value > -math.inf):
        raise UnusableLogprobs(f"logprob {value:g} is no log-probability (finite, at most 0)")
    return math.exp(min(value, 0.0))


def yes_probability(logprobs: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) at the first answer token that is a yes/no word.

    ``logprobs`` is an OpenAI-style ``{"content": [{"token", "logprob", "top_logprobs": [...]}]}``.
    Returns None when no yes/no token was generated or its alternatives carry no yes/no mass, so that
    the caller can fall back to the parsed label and say so instead of inventing a score. They come
    from the LM, untrusted: a logprob that is no log-probability raises :class:`UnusableLogprobs`
    (``exp(1e308)`` overflowed out of the grader).
    """
    content = _get(logprobs, "content") if logprobs is not None else None
    for position in content if isinstance(content, list) else []:
        if _word(_get(position, "token", "")) not in YES_WORDS | NO_WORDS:
            continue
        alternatives = _get(position, "top_logprobs") or [position]
        p_yes = p_no = 0.0
        for alt in alternatives if isinstance(alternatives, list) else [position]:
            word = _word(_get(alt, "token", ""))
            if word in YES_WORDS:
                p_yes += _probability(_get(alt, "logprob"))
            elif word in NO_WORDS:
                p_no += _probability(_get(alt, "logprob"))
        if p_yes + p_no == 0.0:
            return None
        return p_yes / (p_yes + p_no)
    return None


def clamp_score(value: float) -> float:
    """Clamp to [0, 1]; NaN is an error, not a score."""
    if math.isnan(value):
        raise ValueError("score is NaN")
    return min(1.0, max(0.0, float(value)))
