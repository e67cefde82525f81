"""The CRAG action trigger: a pure function of the document scores and two thresholds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "DEFAULT_THRESHOLDS",
    "NO_ABLATION",
    "QUESTION_TYPES",
    "Ablation",
    "Action",
    "ablated_action",
    "decide_action",
    "question_type",
    "validate_thresholds",
]

DEFAULT_THRESHOLDS = (0.3, 0.7)
"""The (lower, upper) every program starts from, and the pair tuned thresholds must beat to ship."""


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


@dataclass(frozen=True)
class Ablation:
    """What a run leaves out, as the CRAG paper's ablations (Yan et al., 2024, section 5.4) do:
    ``remove`` one action (:func:`ablated_action`), or turn off knowledge refinement (internal knowledge
    is the raw passages), query rewriting (the web is searched with the question) or external-knowledge
    selection (every web strip is kept unjudged)."""

    remove: Action | None = None
    refine: bool = True
    rewrite: bool = True
    select: bool = True


NO_ABLATION = Ablation()


def ablated_action(
    scores: Sequence[float | None], lower: float, upper: float, remove: Action | None = None
) -> Action:
    """:func:`decide_action` with one action removed as the paper removes it: a removed CORRECT or
    INCORRECT merges into AMBIGUOUS; without AMBIGUOUS one threshold splits CORRECT from INCORRECT. The
    paper does not say where it lies, so an AMBIGUOUS question goes to the action whose threshold its
    best grade is nearer to: CORRECT when it is >= (lower + upper) / 2, else INCORRECT (also when no
    grade is known)."""
    action = decide_action(scores, lower, upper)
    if remove is None or action is not remove:
        return action
    if remove is not Action.AMBIGUOUS:
        return Action.AMBIGUOUS
    known = [s for s in scores if s is not None]
    return Action.CORRECT if known and max(known) >= (lower + upper) / 2 else Action.INCORRECT


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
