"""How the free-text predictors (query rewriter, reviser, answerers) are called: format and retries."""

from __future__ import annotations

from typing import Any

import dspy

from .adapters import TextAdapter

__all__ = ["text_config", "text_format"]


def text_format():
    """A DSPy context in which free-text predictors reply with the bare value (:class:`TextAdapter`),
    unless the caller chose an adapter with ``dspy.context(adapter=...)`` or ``dspy.configure``.

    DSPy's default ``[[ ## field ## ]]`` format costs a small model ~15 output tokens of markers per
    reply and leaks them into answers (docs/experiments.md); a chosen adapter is the caller's call.
    """
    return dspy.context(adapter=dspy.settings.adapter or TextAdapter())


def text_config(attempt: int = 0) -> dict[str, Any]:
    """The ``config`` of one attempt: a retry is a new rollout, so that the DSPy cache cannot answer it
    with the output that just failed."""
    return {"rollout_id": attempt, "temperature": 0.7} if attempt else {}
