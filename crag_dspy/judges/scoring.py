"""Pure functions that turn an LM's yes/no answer into a relevance score in [0, 1]."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..adapters import NO_WORDS, YES_WORDS

__all__ = ["clamp_score", "yes_probability"]


def _get(obj: Any, key: str, default: Any = None) -> Any:
    # Providers hand logprobs back either as plain dicts or as pydantic objects.
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _word(token: str) -> str:
    return token.strip().strip("\"'`.,:*").lower()


def yes_probability(logprobs: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) at the first answer token that is a yes/no word.

    ``logprobs`` is an OpenAI-style ``{"content": [{"token", "logprob", "top_logprobs": [...]}]}``.
    Returns None when no yes/no token was generated or its alternatives carry no yes/no mass, so that
    the caller can fall back to the parsed label and say so instead of inventing a score.
    """
    content = _get(logprobs, "content") if logprobs is not None else None
    for position in content or []:
        if _word(_get(position, "token", "")) not in YES_WORDS | NO_WORDS:
            continue
        alternatives = _get(position, "top_logprobs") or [position]
        p_yes = p_no = 0.0
        for alt in alternatives:
            word = _word(_get(alt, "token", ""))
            p = math.exp(float(_get(alt, "logprob", -math.inf)))
            if word in YES_WORDS:
                p_yes += p
            elif word in NO_WORDS:
                p_no += p
        if p_yes + p_no == 0.0:
            return None
        return p_yes / (p_yes + p_no)
    return None


def clamp_score(value: float) -> float:
    """Clamp to [0, 1]; NaN is an error, not a score."""
    if math.isnan(value):
        raise ValueError("score is NaN")
    return min(1.0, max(0.0, float(value)))
