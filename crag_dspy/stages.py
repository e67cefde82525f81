"""CRAG's stages as DSPy modules: each returns its value, and the question's trace is written from it.

Being modules, the stages reach DSPy's callbacks (``on_module_start`` / ``on_module_end``) with their
inputs and the value they return, so ``mlflow.dspy.autolog()`` or
:class:`~crag_dspy.tracing.OpenTelemetryCallback` show one span per stage, retrieval and web search
included, nested under the question's ``CRAG`` span.

The trace is written by :meth:`Stage.record`, not by a callback: DSPy logs and drops an exception raised
in a callback, and the trace is part of every answer. Stages are made per call (they hold the question's
run) and are never attributes of :class:`~crag_dspy.module.CRAG`, so they add nothing to a program's state.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import dspy

from .grounding import grounding_of_trace
from .judges.llm import Judgement
from .protocols import Passage, WebResult
from .strips import Strip
from .trace import CRAGTrace, DocumentGrade, StripRecord, TraceRecorder, WebRecord

__all__ = [
    "Answer",
    "Answered",
    "Grade",
    "GradePassage",
    "PassageGraded",
    "RefineExternal",
    "RefineInternal",
    "Refined",
    "Retrieve",
    "RetryRetrieval",
    "ReviseQuery",
    "Rewrite",
    "SearchWeb",
    "SearchWitnesses",
    "Stage",
    "WebSearched",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Refined:
    """Knowledge strips after the strip filter: ``kept`` reached the strip threshold; ``reserve`` holds the
    best-scored strips below it (their best score ``reserve_score``); ``records`` are every strip as the
    trace shows it."""

    kept: list[Strip]
    reserve: list[Strip] = field(default_factory=list)
    records: list[StripRecord] = field(default_factory=list)
    reserve_score: float | None = None


@dataclass(frozen=True)
class PassageGraded:
    """One passage's ``grade``, and the LLM judgement made for it when the LM was asked (``asked``; None
    when the grade reused a judgement or needed no LLM): the route counts its outcome towards "the LM is
    down" once the grade is in the trace."""

    grade: DocumentGrade
    asked: Judgement | None = None


@dataclass(frozen=True)
class WebSearched:
    """What web search returned for ``query`` (empty when it failed: the run's fallbacks say why)."""

    query: str
    results: list[WebResult] = field(default_factory=list)

    def records(self) -> list[WebRecord]:
        """The results as the trace keeps them."""
        return [WebRecord(title=r.title, url=r.url, content=r.content) for r in self.results]


@dataclass(frozen=True)
class Answered:
    """The answer, the context it was given, and the LM's own reply when the answer differs from it."""

    answer: str
    context: str
    lm_answer: str | None = None


class Stage(dspy.Module, Generic[T]):
    """One stage of a question's run. ``compute`` does the work and returns the stage's value;
    :meth:`record` writes that value into the run's trace. Stages with a ``name`` are timed and their LM
    usage counted under it (``trace.timings``, ``trace.lm_usage``); a stage without one runs inside a
    named stage and counts there."""

    name: ClassVar[str | None] = None

    def __init__(self, compute: Callable[..., T], run: TraceRecorder):
        super().__init__()
        self.compute = compute
        self.run = run

    def forward(self, **inputs: Any) -> T:
        self.run.before_stage(self.name or type(self).__name__)
        with self.run.stage(self.name) if self.name else nullcontext():
            value = self.compute(**inputs, run=self.run)
        self.record(value, self.run.trace)
        return value

    def record(self, value: T, trace: CRAGTrace) -> None:
        """Write ``value`` into ``trace``; most stages' values reach the trace through the route."""


class Retrieve(Stage[list[Passage]]):
    """The top-k passages for the question, made inert (``crag_dspy.untrusted``)."""

    name = "retrieve"


class Grade(Stage[list[DocumentGrade]]):
    """Every retrieved passage graded (each by a :class:`GradePassage`)."""

    name = "grade"


class GradePassage(Stage[PassageGraded]):
    """One passage's grade from the grade source's signals. Passages may be graded concurrently
    (``lm_calls.concurrency``), so the route records the grades, in rank order."""


class Rewrite(Stage[str]):
    """The web search query (the question itself when rewriting fails)."""

    name = "rewrite"


class ReviseQuery(Stage["str | None"]):
    """The query of a later internal retry round, written knowing the queries tried."""

    name = "internal_retry"


class RetryRetrieval(Stage[Any]):
    """One internal retry round: search the store again and grade only the passages not graded before
    (its value is a :class:`~crag_dspy.module.RetryRound`; its grades are recorded as they are made)."""

    name = "internal_retry"


class RefineInternal(Stage[Refined]):
    """Decompose, filter and recompose the retrieved passages."""

    name = "refine_internal"

    def record(self, value: Refined, trace: CRAGTrace) -> None:
        trace.internal_strips = value.records


class SearchWeb(Stage[WebSearched]):
    """Search the web with the query, results made inert."""

    name = "web_search"

    def record(self, value: WebSearched, trace: CRAGTrace) -> None:
        trace.web_query = value.query
        trace.web_results = value.records()


class RefineExternal(Stage[Refined]):
    """Decompose and filter the web results."""

    name = "refine_external"

    def record(self, value: Refined, trace: CRAGTrace) -> None:
        trace.external_strips = value.records


class Answer(Stage[Answered]):
    """Answer from the refined knowledge only."""

    name = "answer"

    def record(self, value: Answered, trace: CRAGTrace) -> None:
        trace.context, trace.answer, trace.lm_answer = value.context, value.answer, value.lm_answer
        # No LM call: a string check of the answer against what the run read, so every answer carries
        # one, also a trace cut short by a deadline before the witness search (CRAG.check_answer).
        trace.grounding = grounding_of_trace(trace)


class SearchWitnesses(Stage[WebSearched]):
    """Search the web with the question itself, for pages the grounding check compares the answer with."""

    name = "witness_search"

    def record(self, value: WebSearched, trace: CRAGTrace) -> None:
        trace.witness_results = value.records()
