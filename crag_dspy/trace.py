"""The per-request trace: everything CRAG decided and why, JSON-serialisable for logs and UIs."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from pydantic import BaseModel, Field

from .citations import Citation
from .grounding import Grounding
from .redaction import redact

__all__ = [
    "CRAGTrace",
    "DocumentGrade",
    "InternalRound",
    "StageUsage",
    "StripRecord",
    "TraceRecorder",
    "WebRecord",
    "usage_from_tracker",
]


class DocumentGrade(BaseModel):
    id: str
    doc_id: str
    title: str
    rank: int
    similarity: float
    score: float | None = Field(description="P(relevant) in [0, 1]; None when the grader failed")
    score_source: str = Field(
        description="'logprobs' or 'label' (the LLM judge; 'label' when the LM gives no logprobs), "
        "'evaluator' (the trained evaluator), 'fused' (both, with the similarity) or 'error'"
    )
    signals: dict[str, float] | None = Field(
        None, description="what a trained evaluator's or fused grade was computed from (logits, similarity)"
    )
    attempts: int = Field(1, description="LLM judge attempts (0: graded without the LLM)")
    error: str | None = None
    graded_text: str | None = Field(
        None, description="what the grader read, when it was shown an excerpt of the passage"
    )
    evidence: dict[str, float] | None = Field(
        None,
        description="lexical evidence the compiled grader weighed next to the LM (e.g. term_coverage)",
    )


class StripRecord(BaseModel):
    source: str
    doc_id: str
    title: str
    position: int
    text: str
    score: float | None
    score_source: str = Field(
        description="'strip_filter', 'document_grade' (one-strip passage), 'unfiltered' (kept unjudged) or 'error'"
    )
    kept: bool
    url: str | None = None
    page: int | None = Field(None, description="1-based page of the PDF the strip is from")
    section: str | None = Field(None, description="heading path of the section the strip is from")
    judged_text: str | None = Field(
        None, description="what the strip filter read, when it was shown an excerpt of the strip"
    )
    evidence: dict[str, float] | None = Field(
        None, description="lexical evidence the compiled strip filter weighed next to the LM"
    )


class InternalRound(BaseModel):
    """One rewrite-and-retry round on the internal store before the web (``CRAGConfig(internal_retries=...)``)."""

    round: int = Field(description="1 for the first retry (the question's own retrieval is not a round)")
    query: str = Field(
        description="what the store was searched with: round 1 the web query, later rounds "
        "a query revised knowing those tried"
    )
    passage_ids: list[str] = Field(
        default_factory=list,
        description="passages this round found that no earlier retrieval had: graded, and listed in "
        "documents after those graded before",
    )
    scores: list[float | None] = Field(default_factory=list, description="their grades, in the same order")
    repeated: int = Field(0, description="passages found again that were graded before (not graded twice)")
    action: str = Field(description="the action on every grade so far, after this round")
    error: str | None = Field(
        None,
        description="what ended the rounds here with nothing new graded: the retriever failed, the query "
        "revision failed, or the query repeated one already searched",
    )


class WebRecord(BaseModel):
    title: str
    url: str
    content: str


class StageUsage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: StageUsage) -> StageUsage:
        return StageUsage(**{k: getattr(self, k) + getattr(other, k) for k in StageUsage.model_fields})


class CRAGTrace(BaseModel):
    question: str
    history_turns: int = Field(0, description="earlier turns of the conversation the question came with")
    standalone_question: str | None = Field(
        None,
        description="the question every stage read: the follow-up rewritten to stand alone with the "
        "history (the condense stage); None without history, when it is the question itself",
    )
    answer: str | None = None
    lm_answer: str | None = Field(
        None,
        description="the LM's own reply when the answer differs from it (a unit added from the context, or "
        '"I don\'t know" for a reply no kept strip states: CRAGConfig.abstain_ungrounded)',
    )
    action: str | None = None
    lower: float
    upper: float
    question_type: str | None = None
    """The question's type when the program has per-type thresholds: (lower, upper) are that type's."""
    retriever: str
    web_backend: str
    lm_model: str | None = None
    documents: list[DocumentGrade] = []
    internal_retries: int = Field(
        0, description="most rewrite-and-retry rounds on the internal store (0: off)"
    )
    first_action: str | None = Field(
        None, description="the action of the first retrieval's grades, when internal retry rounds followed it"
    )
    internal_rounds: list[InternalRound] = Field(
        default_factory=list, description="the rewrite-and-retry rounds on the internal store, in order"
    )
    internal_strips: list[StripRecord] = []
    web_query: str | None = None
    web_results: list[WebRecord] = []
    external_strips: list[StripRecord] = []
    witness_results: list[WebRecord] = Field(
        default_factory=list,
        description="web results for the question itself, searched after answering: what the grounding "
        "check compares the answer with besides the run's own sources (CRAGConfig.witness_results)",
    )
    context: str = ""
    defused: list[str] = Field(
        default_factory=list,
        description="untrusted passages whose instruction-like sentences were removed (possible injection)",
    )
    grounding: Grounding | None = Field(
        None,
        description="whether the answer's key content (numbers with units, names) is in the kept strips or "
        "the question, and not in text that instructs the model (crag_dspy.grounding); None until "
        "an answer is given",
    )
    citations: list[Citation] = Field(
        default_factory=list,
        description="the kept strips that state the answer's key content: document and page or section, "
        "or URL, with the sentence (crag_dspy.citations); empty for an abstention",
    )
    fallbacks: list[str] = Field(default_factory=list, description="what degraded and what was done instead")
    errors: list[str] = []
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
    lm_usage: dict[str, StageUsage] = Field(default_factory=dict, description="LM calls and tokens per stage")

    @property
    def total_usage(self) -> StageUsage:
        total = StageUsage()
        for usage in self.lm_usage.values():
            total = total.add(usage)
        return total


def usage_from_tracker(tracker: Any) -> StageUsage:
    # Cache hits are not recorded by DSPy's tracker, so `calls` counts real LM requests only.
    usage = StageUsage()
    for entries in tracker.usage_data.values():
        for entry in entries:
            details = entry.get("prompt_tokens_details") or {}
            usage = usage.add(
                StageUsage(
                    calls=1,
                    prompt_tokens=int(entry.get("prompt_tokens") or 0),
                    cached_prompt_tokens=int(
                        (details.get("cached_tokens") if isinstance(details, dict) else 0) or 0
                    ),
                    completion_tokens=int(entry.get("completion_tokens") or 0),
                )
            )
    return usage


class TraceRecorder:
    """Times stages and counts their LM usage into a :class:`CRAGTrace`, and records fallbacks and
    errors with keys redacted. When the LM counts as down is :class:`~crag_dspy.faults.LMHealth`'s call.

    One recorder per question: it is never shared between threads.
    """

    def __init__(self, trace: CRAGTrace):
        self.trace = trace
        self._timings: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        with dspy.track_usage() as tracker:
            try:
                yield
            finally:
                self._timings[name] += time.perf_counter() - started
                self.trace.timings = {k: round(v, 4) for k, v in self._timings.items()}
                usage = usage_from_tracker(tracker)
                previous = self.trace.lm_usage.get(name, StageUsage())
                self.trace.lm_usage[name] = previous.add(usage)

    def before_stage(self, name: str) -> None:
        """Called as each stage starts; a run that can be stopped raises here."""

    def prediction(self) -> dspy.Prediction:
        t = self.trace
        return dspy.Prediction(
            answer=t.answer, action=t.action, context=t.context, citations=t.citations, trace=t
        )

    def fallback(self, message: str) -> None:
        self.trace.fallbacks.append(redact(message))

    def error(self, message: str) -> None:
        # Providers echo keys in error messages; traces are logged and shown, so they never hold one.
        self.trace.errors.append(redact(message))
