"""The CRAG action trigger: a pure function of the document scores and two thresholds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum

__all__ = ["QUESTION_TYPES", "Action", "decide_action", "question_type", "validate_thresholds"]


class Action(str, Enum):
    CORRECT = "CORRECT"
    AMBIGUOUS = "AMBIGUOUS"
    INCORRECT = "INCORRECT"

    @property
    def uses_internal(self) -> bool:
        return self is not Action.INCORRECT

    @property
    def uses_web(self) -> bool:
        return self is not Action.CORRECT


def validate_thresholds(lower: float, upper: float) -> None:
    if not (0.0 <= lower <= upper <= 1.0):
        raise ValueError(
            f"thresholds must satisfy 0 <= lower <= upper <= 1, got lower={lower}, upper={upper}"
        )


def decide_action(scores: Sequence[float | None], lower: float, upper: float) -> Action:
    """CORRECT if any score >= upper; INCORRECT if every score < lower; otherwise AMBIGUOUS.

    ``None`` is a grade the LM failed to give. Unknown grades never count as evidence either way:
    they cannot make a question CORRECT, and they prevent INCORRECT (we cannot claim every document is
    wrong), so a question whose grades are all unknown is AMBIGUOUS and uses both sources.
    No documents at all is INCORRECT: there is nothing internal to use.
    """
    validate_thresholds(lower, upper)
    known = [s for s in scores if s is not None]
    if any(s >= upper for s in known):
        return Action.CORRECT
    if len(known) == len(scores) and all(s < lower for s in known):
        return Action.INCORRECT
    return Action.AMBIGUOUS


QUESTION_TYPES = ("quantity", "time", "place", "person", "other")

_TYPE_PATTERNS = (
    (
        "quantity",
        (
            r"\bhow (many|much|long|often|far|old|big|large|tall|high|heavy)\b"
            r"|\bwhat (percentage|number|amount|fee|cost|price|share)\b"
        ),
    ),
    ("time", r"\bwhen\b|\b(what|which) (year|date|day|month|time|decade|century)\b"),
    (
        "place",
        (
            r"\bwhere\b|\b(what|which) (city|country|town|state|region|place|county|site|location|"
            r"continent|province|island)\b"
        ),
    ),
    ("person", r"\b(who|whom|whose)\b"),
)


def question_type(question: str) -> str:
    """A question's answer type by its question words (one of :data:`QUESTION_TYPES`): the key of the
    per-type thresholds, so the rule must stay stable across releases (a program stores the types)."""
    text = question.lower()
    for kind, pattern in _TYPE_PATTERNS:
        if re.search(pattern, text):
            return kind
    return "other"
