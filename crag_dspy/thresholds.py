"""The (lower, upper) action thresholds as DSPy state: tuned by the compile, saved with the program."""

from __future__ import annotations

from typing import Any

from dspy.predict.parameter import Parameter

from .routing import DEFAULT_THRESHOLDS, QUESTION_TYPES, question_type, validate_thresholds

__all__ = ["Thresholds"]


class Thresholds(Parameter):
    """The (lower, upper) action thresholds as DSPy state, so they are saved with the program's JSON,
    also when CRAG is nested in another module, and survive optimizers' ``reset_copy``.

    ``by_type`` maps a question type (:func:`~crag_dspy.routing.question_type`) to its own pair; other
    types use (lower, upper). The compile ships per-type pairs only when they beat one pair on val.
    """

    def __init__(
        self,
        lower: float = DEFAULT_THRESHOLDS[0],
        upper: float = DEFAULT_THRESHOLDS[1],
        by_type: dict[str, tuple[float, float]] | None = None,
    ):
        self.load_state({"lower": lower, "upper": upper, "by_type": by_type or {}})

    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        state: dict[str, Any] = {"lower": self.lower, "upper": self.upper}
        if self.by_type:  # absent, not empty, so programs without per-type pairs read as before
            state["by_type"] = {kind: list(pair) for kind, pair in sorted(self.by_type.items())}
        return state

    def load_state(self, state: dict[str, Any]) -> Thresholds:
        lower, upper = float(state["lower"]), float(state["upper"])
        validate_thresholds(lower, upper)
        by_type: dict[str, tuple[float, float]] = {}
        for kind, pair in (state.get("by_type") or {}).items():
            if kind not in QUESTION_TYPES:
                raise ValueError(f"unknown question type {kind!r} in thresholds; known: {QUESTION_TYPES}")
            if len(pair) != 2:
                raise ValueError(f"thresholds for {kind!r} must be [lower, upper], got {pair!r}")
            validate_thresholds(float(pair[0]), float(pair[1]))
            by_type[kind] = (float(pair[0]), float(pair[1]))
        self.lower, self.upper, self.by_type = lower, upper, by_type
        return self

    def for_question(self, question: str) -> tuple[float, float, str | None]:
        """The (lower, upper) pair that routes ``question`` and its type (None without per-type pairs)."""
        if not self.by_type:
            return self.lower, self.upper, None
        kind = question_type(question)
        return (*self.by_type.get(kind, (self.lower, self.upper)), kind)

    def reset(self) -> None:
        """Thresholds are tuned state, not demos: optimizers' resets keep them."""
