"""How the free-text predictors (query rewriter, answerers) are called: their format and retries."""

from __future__ import annotations

from typing import Any

import dspy

from .adapters import ADAPTERS

__all__ = ["TEXT_ADAPTERS", "check_text_adapter", "text_config", "text_format"]

TEXT_ADAPTERS = ("text", "chat")  # "text": the bare value (adapters.TextAdapter); "chat": DSPy's ChatAdapter


def check_text_adapter(adapter: str) -> str:
    """Return ``adapter`` if it is one of :data:`TEXT_ADAPTERS`, else raise ValueError naming the choices."""
    if adapter not in TEXT_ADAPTERS:
        raise ValueError(f"unknown text adapter {adapter!r}; choose one of {list(TEXT_ADAPTERS)}")
    return adapter


def text_format(adapter: str):
    """A DSPy context in which free-text predictors use ``adapter`` (one of :data:`TEXT_ADAPTERS`)."""
    return dspy.context(adapter=ADAPTERS[check_text_adapter(adapter)]())


def text_config(attempt: int = 0) -> dict[str, Any]:
    """The ``config`` of one attempt: a retry is a new rollout, so that the DSPy cache cannot answer it
    with the output that just failed."""
    return {"rollout_id": attempt, "temperature": 0.7} if attempt else {}
