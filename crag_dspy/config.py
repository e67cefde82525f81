"""CRAG's configuration: one frozen, typed object with one default per setting.

:class:`CRAGConfig` is what :class:`~crag_dspy.module.CRAG` is built from, what
:class:`~crag_dspy.settings.Settings` embeds (environment ``CRAG_CONFIG__K=8``,
``CRAG_CONFIG__GRADER_VIEW__SENTENCES=0``), and what a compiled program file stores as-is.

The paper's settings (Yan et al., 2024) come first; the rest each paid on a measured domain
(docs/experiments.md, "Settings beyond the paper").

    >>> from crag_dspy.config import CRAGConfig
    >>> config = CRAGConfig(k=8)
    >>> config.replace(upper=0.8).upper
    0.8
    >>> CRAGConfig(lower=0.9, upper=0.1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for CRAGConfig
      Value error, lower (0.9) must not exceed upper (0.1) ...
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .redaction import redact
from .routing import DEFAULT_THRESHOLDS

__all__ = ["MOST_HISTORY_TURNS", "CRAGConfig", "JudgeView", "LMCalls", "describe_validation_error"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")

MOST_HISTORY_TURNS = 32
"""The highest ``max_history_turns``: the API's schema bounds a request's history by it before the
domain's own limit is checked, and 32 turns of the longest questions and answers fill a prompt."""


class JudgeView(BaseModel):
    """What an LLM judge reads of the text it judges (:class:`~crag_dspy.judges.view.SentenceFocus`)."""

    model_config = _FROZEN

    sentences: int = Field(
        1,
        ge=0,
        le=100,
        description="The judge reads this many of the text's sentences most similar to the question (a "
        "passage keeps its title line); 0 reads the whole text.",
    )


class LMCalls(BaseModel):
    """How CRAG calls the LM: properties of the LM an app runs, so a loaded program takes the app's."""

    model_config = _FROZEN

    retries: int = Field(
        2, ge=0, le=5, description="Extra attempts (new rollouts) after an unparseable LM output."
    )
    use_logprobs: bool = Field(
        True, description="Read grades from token probabilities when the LM returns them."
    )
    concurrency: int = Field(
        1,
        ge=1,
        le=64,
        description="LM calls of one question in flight at once: the k gradings, then the strip "
        "judgements. 1 for the embedded model (one slot); a hosted LLM or a multi-slot server answers "
        "many at once (e.g. 8). Answers and traces are the same at any value.",
    )


class CRAGConfig(BaseModel):
    """Every setting of one CRAG program. Frozen: change one with :meth:`replace`."""

    model_config = _FROZEN

    # --- the paper's ---------------------------------------------------------------------------
    k: int = Field(5, ge=1, le=50, description="Documents retrieved and graded per question.")
    lower: float = Field(
        DEFAULT_THRESHOLDS[0],
        ge=0.0,
        le=1.0,
        description="INCORRECT when every document's grade is below this.",
    )
    upper: float = Field(
        DEFAULT_THRESHOLDS[1], ge=0.0, le=1.0, description="CORRECT when any document's grade reaches this."
    )
    strip_threshold: float = Field(0.5, ge=0.0, le=1.0, description="Strips scoring below this are dropped.")
    max_strips: int = Field(5, ge=1, le=100, description="Most knowledge strips kept per source (paper: 5).")
    sentences_per_strip: int = Field(
        3, ge=1, le=100, description="Decomposition window for passages longer than two sentences."
    )
    web_results: int = Field(3, ge=1, le=10, description="Web results requested per search.")

    # --- beyond the paper -----------------------------------------------------------------------
    grader_view: JudgeView = Field(
        default_factory=JudgeView, description="What the grader reads of a passage: its title and sentences."
    )
    strip_view: JudgeView = Field(
        default_factory=JudgeView,
        description="What the strip filter reads of a strip; the answer still reads kept strips whole.",
    )
    witness_results: int = Field(
        5,
        ge=0,
        le=10,
        description="Web results searched for with the question itself once it is answered, for the "
        "grounding check: a page that states another value of the kind asked about disputes the answer, "
        "whichever route was taken (0: no such search; the run's own sources only).",
    )
    reserve_strips: int = Field(
        0,
        ge=0,
        le=5,
        description="Best-scored strips below the strip threshold each source keeps in reserve: a route "
        'left with no knowledge answers from the best of them instead of "I don\'t know" unread (0: '
        "none, the default: on three kinds of domain the reserve gave 9 more right answers of 322 and 18 "
        "more wrong ones). 1 trades truthfulness for accuracy.",
    )
    answer_units: bool = Field(
        True,
        description='A bare-number answer gets the unit its context states ("260" -> "260 velds").',
    )
    abstain_ungrounded: bool = Field(
        True,
        description="Answer \"I don't know\" when the grounding check finds the answer's key content (a "
        "number with its unit, a name) in no kept strip and not in the question; the LM's reply stays in "
        "the trace (lm_answer) and a fallback says why.",
    )
    internal_retries: int = Field(
        0,
        ge=0,
        le=5,
        description="On AMBIGUOUS or INCORRECT, search the internal store again with a rewritten query "
        "for at most this many rounds before the web (0: off).",
    )
    lm_calls: LMCalls = Field(default_factory=LMCalls)
    max_history_turns: int = Field(
        8,
        ge=0,
        le=MOST_HISTORY_TURNS,
        description="Most earlier turns a question may carry (``history=``, the API's ``history``): a "
        "follow-up refers to the last one or two, and each turn costs prompt tokens on every condensing "
        "call. More is refused, never cut; 0 takes no history. Like ``lm_calls``, the app's value beats "
        "a loaded program's.",
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> CRAGConfig:
        if self.lower > self.upper:
            raise ValueError(f"lower ({self.lower}) must not exceed upper ({self.upper})")
        return self

    def replace(self, **changes: Any) -> CRAGConfig:
        """A validated copy with ``changes`` (nested groups as dicts or models)."""
        data = self.model_dump()
        for key, value in changes.items():
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
        return type(self).model_validate(data)


def describe_validation_error(exc: ValidationError, whole: str | None = None) -> str:
    """A pydantic error as one line, ``where: what (got value)`` per problem, for an error message.

    pydantic's own text spans several lines with a documentation link per problem; a CLI prints one
    line, and a file's problem names its field. ``whole`` names the location of a problem with the
    whole input ("line", "file"; without it such a problem has no prefix). A dict or list input is not
    repeated: it is the section the message is about.

        >>> try:
        ...     CRAGConfig(k=0)
        ... except ValidationError as exc:
        ...     print(describe_validation_error(exc))
        k: Input should be greater than or equal to 1 (got 0)
    """

    def got(value: Any) -> str:
        if isinstance(value, (dict, list)):
            return ""
        # Redacted whole, then cut: a cut made first can leave a password without the "@host" that
        # marks it as one ("http://user:secret..." is no URL with credentials any more).
        text = redact(repr(value))
        return f" (got {text[:60]}{'...' if len(text) > 60 else ''})"

    def where(loc: tuple[Any, ...]) -> str:
        name = ".".join(map(str, loc)) or whole
        return f"{name}: " if name else ""

    errors = exc.errors()
    # A dict of 100,000 bad values is 100,000 problems: the first few say what is wrong.
    more = f"; and {len(errors) - _PROBLEMS_SHOWN} more problems" if len(errors) > _PROBLEMS_SHOWN else ""
    return (
        "; ".join(
            where(e["loc"])
            + e["msg"].removeprefix("Value error, ")
            + (got(e.get("input")) if e["type"] != "missing" else "")
            for e in errors[:_PROBLEMS_SHOWN]
        )
        + more
    )


_PROBLEMS_SHOWN = 5
"""Problems of one validation error that :func:`describe_validation_error` describes."""
