"""CRAG (Yan et al., 2024) as a DSPy module: retrieve, grade, route, refine, search, answer."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import dspy
from dspy.predict.parameter import Parameter

from signatures import AnswerFromContext, FilterStrip, GradeDocument, ReviseQuery, RewriteQuery

from . import stages
from .config import CRAGConfig, JudgeView
from .embeddings import Embedder
from .faults import (
    LMHealth,
    LMUnavailableError,
    RetrievalError,
    RunCancelled,
    classify_lm_error,
    describe_error,
)
from .generation import attach_unit, clean_answer, clean_query, text_config, text_format
from .grounding import defused_note, grounding_of_trace, key_content
from .judges.fusion import Grading
from .judges.llm import BinaryJudge, Judgement
from .judges.view import SentenceFocus
from .protocols import Passage, Retriever, WebResult, WebSearch, WebSearchError
from .retry import is_new_query
from .routing import QUESTION_TYPES, Action, decide_action, question_type, validate_thresholds
from .stages import Answered, PassageGraded, Refined, WebSearched
from .strips import Strip, decompose, format_context, recompose, select_strips
from .trace import CRAGTrace, DocumentGrade, InternalRound, StripRecord, TraceRecorder
from .untrusted import sanitize_passage, sanitize_web_result
from .validation import normalize_question
from .web import NoWebSearch

__all__ = [
    "CRAG",
    "RESERVE_STRIPS",
    "UNKNOWN_ANSWER",
    "JudgementMemo",
    "Knowledge",
    "QuestionRun",
    "RetryRound",
    "RouteStages",
    "Thresholds",
    "follow_route",
    "knowledge_for",
]

UNKNOWN_ANSWER = "I don't know"
RESERVE_STRIPS = 1
"""Strips below the strip threshold each source keeps in reserve for a route left with no knowledge."""
_SHARED = frozenset({"retriever", "web_search", "lm", "embedder"})
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class RetryRound:
    """What one internal retry round found (:meth:`CRAG.retry_round`): the ``passages`` no earlier
    retrieval had, with their ``grades``; ``repeated`` passages were found again and not graded twice.
    ``error`` says what ended the rounds with nothing new graded (a store fault, no new query)."""

    query: str
    passages: list[Passage] = field(default_factory=list)
    grades: list[DocumentGrade] = field(default_factory=list)
    repeated: int = 0
    error: str | None = None

    @property
    def scores(self) -> list[float | None]:
        return [grade.score for grade in self.grades]

    def record(self, number: int, action: Action) -> InternalRound:
        """This round as the trace shows it, with the action decided after it."""
        return InternalRound(
            round=number,
            query=self.query,
            passage_ids=[p.id for p in self.passages],
            scores=list(self.scores),
            repeated=self.repeated,
            action=action.value,
            error=self.error,
        )


@dataclass(frozen=True)
class Knowledge:
    """One source's refined knowledge: ``strips`` reached the strip threshold; ``reserve`` holds the
    best-scored judged strip below it (``reserve_score``), which an answer falls back to only when no
    knowledge of the sources its action reads survived."""

    strips: list[Strip]
    reserve: list[Strip] = field(default_factory=list)
    reserve_score: float | None = None


class RouteStages(Protocol):
    """The stages a route is assembled from. :class:`CRAG` computes them for one question's run;
    the compile's threshold replay and the evaluation's variants serve them from shared, cached
    pieces (``optimize.shared_work.CRAGPieces``). Both route with :func:`follow_route`."""

    def external(self) -> Knowledge | None:
        """Refined web knowledge; None when web search produced nothing."""
        ...

    def internal(self) -> Knowledge:
        """Refined internal knowledge."""
        ...

    def answer(self, internal: list[Strip], external: list[Strip]) -> str:
        """The answer from exactly this knowledge."""
        ...


def follow_route(action: Action, route: RouteStages) -> str:
    """The answer ``action`` leads to, computing only the stages it needs: web knowledge for the
    actions that use the web, internal knowledge for those that use it and whenever web search
    produced nothing; then the context :func:`knowledge_for` assembles."""
    external = route.external() if action.uses_web else None
    internal = route.internal() if action.uses_internal or external is None else Knowledge([])
    return route.answer(*knowledge_for(action, internal, external))


def knowledge_for(
    action: Action, internal: Knowledge, external: Knowledge | None
) -> tuple[list[Strip], list[Strip]]:
    """The (internal, external) strips an action answers from; ``external`` is None when web search
    produced nothing, and then INCORRECT falls back to internal knowledge.

    When no strip of the sources the action reads survived refinement, the best-scored reserve strip
    of a source the action trusts (internal first on a tie) is the context: a small model's strip
    filter scores the strip that answers close to its threshold (measured on both domains,
    docs/experiments.md), and a route left with nothing answers "I don't know" unread. INCORRECT's
    fallback to internal knowledge takes no reserve: the grader judged every passage wrong. Next to
    surviving knowledge a reserve strip is left out: on the default domain the web's made the 1.5B
    model doubt answers it had.
    """
    nothing = Knowledge([])
    inside = internal if action.uses_internal or external is None else nothing
    outside = external if action.uses_web and external is not None else nothing
    if inside.strips or outside.strips:
        return inside.strips, outside.strips
    reserves = [k for k in (inside if action.uses_internal else nothing, outside) if k.reserve]
    if not reserves:
        return [], []
    best = max(reserves, key=lambda k: -1.0 if k.reserve_score is None else k.reserve_score)
    return (best.reserve, []) if best is inside else ([], best.reserve)


class JudgementMemo(Protocol):
    """Where a question's judgements are kept, so that the LM is asked once per distinct text a judge is
    shown. ``key`` is ``(judge, shown)``: the judge's name (``"grade"`` or ``"strip_filter"``) and the
    sorted items of what it is shown. ``get`` returns the judgement kept under ``key``, calling
    ``judge()`` for it the first time only.

    A run keeps its own (:class:`QuestionMemo`); the compile's threshold replay and the evaluation
    share one across the pieces of a question (``optimize.shared_work.CRAGPieces``)."""

    def get(self, key: Hashable, judge: Callable[[], Judgement]) -> Judgement: ...


class QuestionMemo:
    """The :class:`JudgementMemo` of one run. Its judgements may be asked for from several threads at
    once (``lm_calls.concurrency``): the first asks the LM, the others wait for its answer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[Hashable, Future[Judgement]] = {}

    def get(self, key: Hashable, judge: Callable[[], Judgement]) -> Judgement:
        with self._lock:
            kept = self._kept.get(key)
            mine = kept is None
            if mine:
                kept = self._kept[key] = Future()
        if mine:
            try:
                kept.set_result(judge())
            except BaseException as exc:
                kept.set_exception(exc)
                raise
        return kept.result()


class QuestionRun(TraceRecorder):
    """One question's trace recorder, the health of its LM calls (:class:`~crag_dspy.faults.LMHealth`),
    its judgements (:class:`JudgementMemo`, its own unless one is given) and ``cancel``: once that event
    is set, the run raises :class:`~crag_dspy.faults.RunCancelled` as its next stage starts.
    ``web_queries`` are the queries web search answered; ``web_failed`` is set when a search failed."""

    def __init__(
        self,
        trace: CRAGTrace,
        judgements: JudgementMemo | None = None,
        cancel: threading.Event | None = None,
    ):
        super().__init__(trace)
        self.lm = LMHealth(trace)
        self.judgements = judgements if judgements is not None else QuestionMemo()
        self.cancel = cancel if cancel is not None else threading.Event()
        self.web_queries: set[str] = set()
        self.web_failed = False

    def before_stage(self, name: str) -> None:
        if self.cancel.is_set():
            self.error(f"cancelled before stage {name!r}: the caller stopped waiting")
            raise RunCancelled(self.trace.errors[-1], self.trace)


class Thresholds(Parameter):
    """The (lower, upper) action thresholds as DSPy state, so they are saved with the program's JSON,
    also when CRAG is nested in another module, and survive optimizers' ``reset_copy``.

    ``by_type`` maps a question type (:func:`~crag_dspy.routing.question_type`) to its own pair; other
    types use (lower, upper). The compile ships per-type pairs only when they beat one pair on val.
    """

    def __init__(
        self, lower: float = 0.3, upper: float = 0.7, by_type: dict[str, tuple[float, float]] | None = None
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


def _injected(dependency: Any, role: str, method: str, signature: str) -> Any:
    """``dependency`` when it is None or has the protocol's method, else a TypeError saying what it lacks."""
    if dependency is not None and not callable(getattr(dependency, method, None)):
        raise TypeError(
            f"{role} must have a method {signature} (crag_dspy.protocols), or be None to load or save "
            f"state only; got {type(dependency).__name__}"
        )
    return dependency


def _saved_fields_by_name(module: dspy.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each predictor's saved signature fields in the order its signature has now.

    DSPy restores a signature's fields by position, so a program saved before a signature's inputs were
    reordered (the answerer's context now comes before its question) would give each field the other's
    description. Saved fields are matched to the current ones by their prefix ("Question:"), which DSPy
    derives from the field's name; a predictor whose prefixes do not match one to one (an optimizer
    rewrote one) keeps DSPy's positional order.
    """
    reordered = dict(state)
    for name, predictor in module.named_predictors():
        entry = state.get(name)
        signature = entry.get("signature") if isinstance(entry, dict) else None
        saved = signature.get("fields") if isinstance(signature, dict) else None
        if not isinstance(saved, list) or not all(isinstance(f, dict) for f in saved):
            continue  # DSPy's own load reports a malformed state
        current = [f.json_schema_extra["prefix"] for f in predictor.signature.fields.values()]
        by_prefix = {f.get("prefix"): f for f in saved}
        if len(by_prefix) == len(saved) and sorted(by_prefix, key=str) == sorted(current):
            fields = [by_prefix[prefix] for prefix in current]
            reordered[name] = {**entry, "signature": {**signature, "fields": fields}}
    return reordered


class CRAG(dspy.Module):
    """Corrective RAG. Retriever, web search and (optionally) the LM are injected.

    Args:
        retriever: internal knowledge (:class:`~crag_dspy.protocols.Retriever`).
        web_search: external knowledge (:class:`~crag_dspy.protocols.WebSearch`).
        config: every setting (:class:`~crag_dspy.config.CRAGConfig`; its defaults when omitted).
        lm: the LM for every stage; ``None`` uses ``dspy.settings.lm``.
        embedder: sentence embeddings for the judges' views (default: the bundled MiniLM, loaded on
            first use).
        grader, strip_filter: the LLM judges (:class:`~crag_dspy.judges.llm.BinaryJudge`, e.g. over a
            signature with other instructions); default: over ``GradeDocument`` and ``FilterStrip``.
            The config sets their retries, logprobs and views; a compile tunes them.

    The rewriter and answerer reply in :class:`~crag_dspy.adapters.TextAdapter`'s bare format unless
    an adapter is set with ``dspy.context(adapter=...)`` or ``dspy.configure``; the judges always ask
    for one word and read its probability (:class:`~crag_dspy.adapters.LabelAdapter`).

    Calling the module raises :class:`~crag_dspy.validation.QuestionError` for a bad question,
    :class:`~crag_dspy.faults.RetrievalError` when the store fails and
    :class:`~crag_dspy.faults.LMUnavailableError` when the LM is down or gives no usable answer; the
    last two carry the trace. Other faults degrade and are recorded in the trace (docs/reliability.md).
    One instance may serve many threads at once: a call keeps all its state in its own trace.
    """

    def __init__(
        self,
        retriever: Retriever,
        web_search: WebSearch,
        config: CRAGConfig | None = None,
        *,
        lm: dspy.BaseLM | None = None,
        embedder: Embedder | None = None,
        grader: BinaryJudge | None = None,
        strip_filter: BinaryJudge | None = None,
    ):
        super().__init__()
        # Plain attributes, not DSPy parameters: they are infrastructure, never saved into program JSON.
        # None builds a module to load or save state only; anything else must be usable, or the mistake
        # would surface on the first question as a store or web failure.
        self.retriever = _injected(retriever, "retriever", "retrieve", "retrieve(query, k) -> list[Passage]")
        self.web_search = _injected(
            web_search, "web_search", "search", "search(query, max_results) -> list[WebResult]"
        )
        self.lm = lm
        self.embedder = embedder
        # The LLM judge, the trained evaluator or both fused (set by the compile, saved with the program).
        self.grading = Grading()
        self.grader = grader if grader is not None else BinaryJudge(GradeDocument)
        self.strip_filter = strip_filter if strip_filter is not None else BinaryJudge(FilterStrip)
        self.rewriter = dspy.Predict(RewriteQuery)
        # Writes the query of a later internal retry round; never called with internal_retries < 2.
        self.reviser = dspy.Predict(ReviseQuery)
        self.answerer = dspy.Predict(AnswerFromContext)
        self.config = config or CRAGConfig()

    @property
    def config(self) -> CRAGConfig:
        """The settings this module runs with. Assigning one rebuilds the judges' views; one with another
        (lower, upper) also resets the thresholds to that pair (per-type pairs included), while one with
        the same pair keeps tuned thresholds. Demos and calibrations stay."""
        return self._config

    @config.setter
    def config(self, config: CRAGConfig) -> None:
        if (config.grader_view.sentences or config.strip_view.sentences) and self.embedder is None:
            self.embedder = Embedder()  # lazy: the model loads on the first passage that needs it
        for judge in (self.grader, self.strip_filter):
            judge.use_logprobs, judge.retries = config.lm_calls.use_logprobs, config.lm_calls.retries
        self.grader.view = self._focus(config.grader_view, "document")
        self.strip_filter.view = self._focus(config.strip_view, "strip", self.grader.view)
        previous = getattr(self, "_config", None)
        if previous is None or (previous.lower, previous.upper) != (config.lower, config.upper):
            self.thresholds = Thresholds(config.lower, config.upper)
        self._config = config

    def _focus(
        self, view: JudgeView, field: str, vectors_of: SentenceFocus | None = None
    ) -> SentenceFocus | None:
        if not view.sentences:
            return None
        return SentenceFocus(view.sentences, self.embedder, field=field, vectors_of=vectors_of)

    def __deepcopy__(self, memo: dict) -> CRAG:
        # Optimizers copy programs often; stores, clients and the LM are shared infrastructure, not state.
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            setattr(new, key, value if key in _SHARED else copy.deepcopy(value, memo))
        return new

    # -- the algorithm --------------------------------------------------------------------------
    def forward(
        self,
        question: str,
        *,
        on_start: Callable[[CRAGTrace], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> dspy.Prediction:
        """``on_start`` gets the trace as the run begins: a caller with a deadline (the server) can
        answer with what was done so far. Setting ``cancel`` stops the run as its next stage starts
        (:class:`~crag_dspy.faults.RunCancelled`); an LM call under way is not interrupted."""
        # Any length: the length limit is the app's (CLI, server), which knows its users and budget.
        question = normalize_question(question, max_chars=None)
        run = self.new_run(question, cancel=cancel)
        if on_start is not None:
            on_start(run.trace)
        with self.lm_scope(run.trace):
            passages, scores = self.grade_documents(question, run)
            bounds = run.trace.lower, run.trace.upper  # this question's pair (per type when tuned so)
            action = decide_action(scores, *bounds)
            query = None  # the web query, when the internal retries wrote it already
            if action.uses_web and self.config.internal_retries:
                passages, scores, query = self.retry_internal(question, passages, scores, run)
                action = decide_action(scores, *bounds)
            run.trace.action = action.value
            follow_route(action, _RunStages(self, question, passages, scores, query, run))
            self.check_answer(question, run)
        return run.prediction()

    async def aforward(
        self, question: str, *, on_start: Callable[[CRAGTrace], None] | None = None
    ) -> dspy.Prediction:
        """:meth:`forward` for an event loop (``await crag.acall(question)``): the question runs in a
        worker thread with this task's context (DSPy settings, callbacks), so the loop serves other
        requests meanwhile, and its LM calls go out ``lm_calls.concurrency`` at a time as in ``forward``.
        Cancelling the task stops the run as its next stage starts."""
        cancel = threading.Event()
        try:
            # type(self).forward: DSPy warns when an instance's forward is called other than by __call__.
            return await asyncio.to_thread(
                type(self).forward, self, question, on_start=on_start, cancel=cancel
            )
        except asyncio.CancelledError:
            cancel.set()
            raise

    # -- stages (public so that threshold tuning can run each once and re-route offline) ------------
    def new_run(
        self,
        question: str,
        *,
        judgements: JudgementMemo | None = None,
        cancel: threading.Event | None = None,
    ) -> QuestionRun:
        """A run of ``question`` with its thresholds; ``judgements`` keeps its judgements (default: its
        own); setting ``cancel`` stops it as its next stage starts."""
        lower, upper, kind = self.thresholds.for_question(question)
        return QuestionRun(
            CRAGTrace(
                question=question,
                lower=lower,
                upper=upper,
                question_type=kind,
                retriever=getattr(self.retriever, "name", type(self.retriever).__name__),
                web_backend=getattr(self.web_search, "name", type(self.web_search).__name__),
                internal_retries=self.config.internal_retries,
            ),
            judgements,
            cancel,
        )

    def lm_scope(self, trace: CRAGTrace):
        lm = self.lm or dspy.settings.lm
        if lm is None:
            raise ValueError("CRAG has no LM: pass lm=... or call dspy.configure(lm=...) first")
        trace.lm_model = getattr(lm, "model", type(lm).__name__)
        return dspy.context(lm=self.lm) if self.lm is not None else nullcontext()

    def grade_documents(self, question: str, run: QuestionRun) -> tuple[list[Passage], list[float | None]]:
        """Retrieve top-k and grade each passage; a failed grade is None (unknown) and an error in the trace."""
        passages = stages.Retrieve(self._retrieve, run)(question=question)
        grades = stages.Grade(self._grade_passages, run)(question=question, passages=passages)
        return passages, [grade.score for grade in grades]

    def _retrieve(self, question: str, run: QuestionRun) -> list[Passage]:
        try:
            return self._untrusted(self.retriever.retrieve(question, self.config.k), sanitize_passage, run)
        except Exception as exc:
            run.error(f"retriever {run.trace.retriever} failed: {describe_error(exc)}")
            raise RetrievalError(run.trace.errors[-1], run.trace) from exc

    def _grade_passages(
        self, question: str, passages: list[Passage], run: QuestionRun
    ) -> list[DocumentGrade]:
        # The trained evaluator scores all the passages in one batched pass, before any LLM call.
        logits = self.grading.evaluator_logits(question, [p.display for p in passages]) if passages else None
        grade, grades = stages.GradePassage(self._grade, run), []

        def one(i: int) -> PassageGraded:
            return grade(question=question, passage=passages[i], logit=None if logits is None else logits[i])

        with closing(self._each_call(one, range(len(passages)))) as graded_passages:
            for graded in graded_passages:
                run.trace.documents.append(graded.grade)  # in rank order, whichever call ended first
                grades.append(graded.grade)
                # Counted once the grade is in the trace: a run stopped here keeps the work done.
                if graded.asked is not None:
                    self._count_lm_outcome(graded.asked, "grade", run)
        return grades

    def _each_call(self, call: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``call`` over ``items``, yielding the results in order, with up to ``lm_calls.concurrency``
        calls in flight. Each call runs in a copy of this thread's context, so that DSPy's settings
        (``dspy.context(lm=...)``), usage tracking and callbacks' parent spans carry over. The caller
        closes the iterator when it stops early (the LM is down): calls not yet started are cancelled."""
        limit = min(self.config.lm_calls.concurrency, len(items))
        if limit <= 1:
            yield from map(call, items)
            return
        with ThreadPoolExecutor(limit, thread_name_prefix="crag-call") as pool:
            futures = [pool.submit(contextvars.copy_context().run, call, item) for item in items]
            try:
                for future in futures:
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    def judge_once(
        self, judge: BinaryJudge, stage: str, run: QuestionRun, **inputs: str
    ) -> tuple[Judgement, bool]:
        """``judge``'s judgement of ``inputs`` and whether the LM was asked for it (then the caller counts
        its outcome, once the trace holds what it judged). ``stage`` names the judge in the run's
        :class:`JudgementMemo` (``"grade"`` or ``"strip_filter"``). The LM is asked once per distinct
        text a judge is shown in a question (two chunks of one document with the same title and best
        sentence, a web result that repeats a passage): a repeat reuses the first P(yes), calibrated with
        its own lexical evidence."""
        asked = False

        def ask() -> Judgement:
            nonlocal asked
            asked = True
            return judge(**inputs).judgement

        first = run.judgements.get((stage, tuple(sorted(judge.shown_inputs(inputs)[0].items()))), ask)
        if asked:
            return first, True
        return replace(first, score=judge.rescore(first, inputs), evidence=judge.evidence(inputs)), False

    def _grade(self, question: str, passage: Passage, logit: float | None, run: QuestionRun) -> PassageGraded:
        """One passage's grade from the grade source's signals."""
        judgement, asked = (
            self.judge_once(self.grader, "grade", run, question=question, document=passage.display)
            if self.grading.uses_llm
            else (None, False)
        )
        graded = self.grading.combine(
            judgement.score if judgement else None,
            judgement.score_source if judgement else "evaluator",
            logit,
            passage.similarity,
        )
        record = DocumentGrade(
            id=passage.id,
            doc_id=passage.doc_id,
            title=passage.title,
            rank=passage.rank,
            similarity=round(passage.similarity, 4),
            score=graded.score,
            score_source=graded.source,
            signals=graded.signals,
            attempts=judgement.attempts if judgement else 0,
            error=("; ".join(judgement.errors) or None) if judgement else None,
            graded_text=(judgement.shown or {}).get("document") if judgement else None,
            evidence=judgement.evidence if judgement else None,
        )
        if graded.note:
            run.fallback(f"{passage.doc_id}: {graded.note}")
        if judgement is not None:
            if judgement.view_error:
                run.fallback(
                    f"grader's sentence focus failed on {passage.doc_id} ({judgement.view_error}); "
                    "graded the whole passage"
                )
            if judgement.score is None:
                run.error(f"grader failed on {passage.doc_id} (treated as unknown): {judgement.errors[-1]}")
        return PassageGraded(record, judgement if asked else None)

    def retry_internal(
        self, question: str, passages: list[Passage], scores: list[float | None], run: QuestionRun
    ) -> tuple[list[Passage], list[float | None], str]:
        """Rewrite and retry internal retrieval before the web, for at most ``internal_retries`` rounds.

        Round 1 searches the store with the web query (written once: the web search reuses it), later
        rounds with a query written knowing those tried (:meth:`revise_query`). Each round grades only
        the passages not graded before (:meth:`retry_round`), and the action is decided again on every
        grade so far; the rounds stop once it is CORRECT, after a round that ended with an error, or at
        the cap (the same rule as :func:`~crag_dspy.retry.route_with_retries`). Every round is in the
        trace. Returns every passage graded, in order, their grades, and the web query.
        """
        lower, upper = run.trace.lower, run.trace.upper  # the thresholds this run routes with
        passages, scores, tried = list(passages), list(scores), [question]
        run.trace.first_action = decide_action(scores, lower, upper).value
        web_query = stages.Rewrite(self._rewrite, run)(question=question)
        for number in range(1, self.config.internal_retries + 1):
            query = web_query if number == 1 else self.revise_query(question, tried, run)
            found = self.retry_round(question, query, tried, passages, run)
            passages += found.passages
            scores += found.scores
            tried.append(found.query)
            action = decide_action(scores, lower, upper)
            run.trace.internal_rounds.append(found.record(number, action))
            if found.error or not action.uses_web:
                break
        return passages, scores, web_query

    def revise_query(self, question: str, tried: Sequence[str], run: QuestionRun) -> str | None:
        """A search query for a later internal retry round, written knowing the queries ``tried`` (the
        question first): its input differs from every earlier request, so it is never the same LM call
        again. None when the reviser failed; the fallback says so."""
        return stages.ReviseQuery(self._revise, run)(question=question, tried=tried)

    def _revise(self, question: str, tried: Sequence[str], run: QuestionRun) -> str | None:
        pred = self._predict_with_retries(
            self.reviser, "query revision", run, question=question, tried_queries="\n".join(tried)
        )
        query = clean_query(pred)
        if not query:
            run.fallback("query revision failed; the internal retries ended")
            return None
        return query

    def retry_round(
        self,
        question: str,
        query: str | None,
        tried: Sequence[str],
        graded: Sequence[Passage],
        run: QuestionRun,
    ) -> RetryRound:
        """Search the internal store with ``query`` and grade the passages that are not in ``graded``.

        ``tried`` are the queries searched before (the question first); a query among them, or None (no
        query could be written), ends the rounds without a search: it would find what was graded.
        New passages are ranked after ``graded``, so that refinement and the trace put them after the
        passages graded before. A store fault does not raise here: the round ends the retries with the
        error in the trace, and the route goes on with what was graded (the web, when it still uses it).
        """
        if query is None:
            return RetryRound("", error="no query: the query revision failed")
        if not is_new_query(query, tried):
            return RetryRound(query, error="no new query: it repeats one already searched")
        return stages.RetryRetrieval(self._retry_retrieval, run)(
            question=question, query=query, graded=graded
        )

    def _retry_retrieval(
        self, question: str, query: str, graded: Sequence[Passage], run: QuestionRun
    ) -> RetryRound:
        try:
            found = self.retriever.retrieve(query, self.config.k)
        except Exception as exc:  # noqa: BLE001 - any store failure degrades this round only
            run.error(f"retriever {run.trace.retriever} failed in an internal retry: {describe_error(exc)}")
            run.fallback("an internal retry round failed; went on with the passages graded before it")
            return RetryRound(query, error=run.trace.errors[-1])
        seen = {p.id for p in graded}
        new = []
        for passage in found:
            if passage.id not in seen:
                seen.add(passage.id)
                new.append(replace(passage, rank=len(graded) + len(new)))
        new = self._untrusted(new, sanitize_passage, run)  # the others were made inert when first found
        return RetryRound(
            query, new, self._grade_passages(question, new, run), repeated=len(found) - len(new)
        )

    def internal_knowledge(
        self, question: str, passages: list[Passage], scores: list[float | None], run: QuestionRun
    ) -> Knowledge:
        """Decompose, filter and recompose the retrieved passages into internal knowledge.

        Passages graded below ``strip_threshold`` are dropped whole (their strips would be judged on
        the same evidence), except the best-graded one: its grade decided whether retrieval was
        CORRECT or AMBIGUOUS, and tuned thresholds may put ``upper`` below ``strip_threshold``, so
        without it a CORRECT route could answer from nothing. The strip filter judges that passage's
        strips itself. The result depends on the grades but not on the action thresholds, so one
        refinement per question serves every (lower, upper) during tuning.
        """
        refine = stages.RefineInternal(self._refine_internal, run)
        refined = refine(question=question, passages=passages, scores=scores)
        return Knowledge(refined.kept, refined.reserve, refined.reserve_score)

    def _refine_internal(
        self, question: str, passages: list[Passage], scores: list[float | None], run: QuestionRun
    ) -> Refined:
        strips: list[Strip] = []
        reuse: dict[Strip, float | None] = {}
        graded = [i for i, score in enumerate(scores) if score is not None]
        best = max(graded, key=lambda i: scores[i], default=None)  # ties: the higher-ranked passage
        for i, (passage, score) in enumerate(zip(passages, scores)):
            below = score is not None and score < self.config.strip_threshold
            if below and i != best:
                continue
            pieces = decompose(passage.text, self.config.sentences_per_strip)
            for j, text in enumerate(pieces):
                strips.append(
                    Strip(text, "internal", passage.doc_id, passage.title, passage.rank, j, passage.url)
                )
                if len(pieces) == 1 and not below:
                    # The grader already judged this passage whole: asking again would be the same question.
                    reuse[strips[-1]] = score
        return self._filter(question, strips, reuse, run, reserve=RESERVE_STRIPS)

    def rewrite_query(self, question: str, run: QuestionRun) -> str:
        """The web search query for ``question`` (the question itself when rewriting fails)."""
        run.trace.web_query = stages.Rewrite(self._rewrite, run)(question=question)
        return run.trace.web_query

    def external_knowledge(
        self, question: str, run: QuestionRun, *, query: str | None = None, select: bool = True
    ) -> Knowledge | None:
        """Rewrite, search, decompose and filter web results; None when web search produced nothing.

        ``query`` searches with that query instead of rewriting the question, and ``select=False`` keeps
        every web strip unjudged: the paper's "w/o rewriting" and "w/o external-knowledge selection".
        """
        query = self.rewrite_query(question, run) if query is None else query
        searched = stages.SearchWeb(self._search_web, run)(query=query)
        if not searched.results:
            return None
        refine = stages.RefineExternal(self._refine_external, run)
        refined = refine(question=question, results=searched.results, select=select)
        return Knowledge(refined.kept, refined.reserve, refined.reserve_score)

    def _search_web(self, query: str, run: QuestionRun) -> WebSearched:
        results = self._web("web search", query, self.config.web_results, run, "internal knowledge only")
        if results == []:
            run.fallback(f"web search returned no results for {query!r}; internal knowledge only")
        return WebSearched(query, results or [])

    def _web(self, what: str, query: str, n: int, run: QuestionRun, instead: str) -> list[WebResult] | None:
        """Up to ``n`` web results for ``query``, made inert; None when the search failed (a fallback says
        what failed and what was done ``instead``)."""
        try:
            results = self._untrusted(self.web_search.search(query, n), sanitize_web_result, run)
        except WebSearchError as exc:
            run.fallback(f"{what} failed ({exc}); {instead}")
        except Exception as exc:  # noqa: BLE001 - a broken backend must not take the answer down
            run.fallback(f"{what} crashed ({type(exc).__name__}: {exc}); {instead}")
        else:
            run.web_queries.add(query)
            return results
        run.web_failed = True
        return None

    def check_answer(self, question: str, run: QuestionRun) -> None:
        """Check the answer (its grounding, from the answer stage) against the web's results for the
        question itself too, when it has key content: the route's own sources are what it chose to
        read, and a planted page that wins the retrieval pushes out the honest page that would dispute
        it; a search by the question reaches other pages and other parts of them. No LM call."""
        # Web search that is off is a setting, not a fault to report; one that failed in this run is not
        # waited for twice; a route that searched with the question itself has its pages in the trace.
        searchable = not (
            isinstance(self.web_search, NoWebSearch) or run.web_failed or question in run.web_queries
        )
        if not (self.config.witness_results and searchable and key_content(run.trace.answer or "")):
            return
        if stages.SearchWitnesses(self._search_witnesses, run)(query=question).results:
            run.trace.grounding = grounding_of_trace(run.trace)

    def _search_witnesses(self, query: str, run: QuestionRun) -> WebSearched:
        instead = "the answer was checked against the run's own sources only"
        return WebSearched(
            query, self._web("witness search", query, self.config.witness_results, run, instead) or []
        )

    def _refine_external(
        self, question: str, results: list[WebResult], select: bool, run: QuestionRun
    ) -> Refined:
        strips = [
            Strip(text, "web", r.url, r.title, rank, i, r.url)
            for rank, r in enumerate(results)
            for i, text in enumerate(decompose(r.content, self.config.sentences_per_strip))
        ]
        return self._filter(question, strips, {}, run, select=select, reserve=RESERVE_STRIPS)

    def generate(self, question: str, internal: list[Strip], external: list[Strip], run: QuestionRun) -> str:
        """Answer from the refined, source-tagged knowledge only."""
        answer = stages.Answer(self._answer, run)
        return answer(question=question, context=format_context(internal, external)).answer

    def _filter(
        self,
        question: str,
        strips: list[Strip],
        reuse: dict[Strip, float | None],
        run: QuestionRun,
        *,
        select: bool = True,
        reserve: int = 0,
    ) -> Refined:
        """The kept strips, the best-scored strips below the threshold that make up ``reserve`` strips in
        all, and the trace's records of every strip."""
        # (strip, score, where the score came from, the judgement when the strip filter judged it)
        scored: list[tuple[Strip, float | None, str, Judgement | None]] = []
        to_judge = [strip for strip in strips if select and strip not in reuse]

        def judge(strip: Strip) -> tuple[Judgement, bool]:
            return self.judge_once(
                self.strip_filter, "strip_filter", run, question=question, strip=strip.text
            )

        with closing(self._each_call(judge, to_judge)) as judged:
            for strip in strips:
                if not select:
                    scored.append((strip, None, "unfiltered", None))
                    continue
                if strip in reuse:
                    scored.append((strip, reuse[strip], "document_grade", None))
                    continue
                judgement, asked = next(judged)
                if judgement.view_error:
                    run.fallback(
                        f"strip filter's sentence focus failed on a strip of {strip.doc_id} "
                        f"({judgement.view_error}); judged the whole strip"
                    )
                if judgement.score is None:
                    run.error(
                        f"strip filter failed on a strip of {strip.doc_id} (dropped): {judgement.errors[-1]}"
                    )
                if asked:
                    self._count_lm_outcome(judgement, "strip_filter", run)
                origin = "strip_filter" if judgement.score is not None else "error"
                scored.append((strip, judgement.score, origin, judgement))
        pairs = [(s, score) for s, score, _, _ in scored]
        kept = recompose(
            select_strips(pairs, self.config.strip_threshold, self.config.max_strips) if select else strips
        )
        kept_set = set(kept)
        cfg = self.config
        spare = select_strips(pairs, cfg.strip_threshold, cfg.max_strips, at_least=reserve) if select else []
        spare = recompose(s for s in spare if s not in kept_set)
        spare_set = set(spare)
        spare_score = max((x for s, x in pairs if s in spare_set and x is not None), default=None)
        records = [
            StripRecord(
                source=s.source,
                doc_id=s.doc_id,
                title=s.title,
                position=s.position,
                text=s.text,
                score=None if score is None else round(score, 4),
                score_source=origin,
                kept=s in kept_set,
                url=s.url if s.source == "web" else None,
                judged_text=(judgement.shown or {}).get("strip") if judgement else None,
                evidence=judgement.evidence if judgement else None,
            )
            for s, score, origin, judgement in scored
        ]
        return Refined(kept, spare, records, spare_score)

    def note_reserve_used(self, reserve: list[Strip], run: QuestionRun) -> None:
        """Mark the reserve strips an answer reads kept in the trace and say why it reads them."""
        # A web page can come back as several results under one URL, each starting at position 0.
        used = {(s.source, s.doc_id, s.position, s.text) for s in reserve}
        records = [
            r
            for r in [*run.trace.internal_strips, *run.trace.external_strips]
            if (r.source, r.doc_id, r.position, r.text) in used
        ]
        for record in records:
            record.kept = True
        source = reserve[0].source  # one source's reserve: knowledge_for never mixes them
        scores = ", ".join(f"{r.score:.2f}" for r in records if r.score is not None)
        run.fallback(
            f"no knowledge reached the strip threshold {self.config.strip_threshold}; answered from the "
            f"best-scored {source} strips below it ({scores})"
        )

    def _rewrite(self, question: str, run: QuestionRun) -> str:
        pred = self._predict_with_retries(self.rewriter, "query rewrite", run, question=question)
        query = clean_query(pred)
        if not query:
            run.fallback("query rewrite failed; searched with the question itself")
            return question
        return query

    def _answer(self, question: str, context: str, run: QuestionRun) -> Answered:
        if not context:
            unjudged = sum(s.score is None for s in [*run.trace.internal_strips, *run.trace.external_strips])
            detail = (
                f" ({unjudged} strips the LM failed to judge were dropped, not trusted)" if unjudged else ""
            )
            run.fallback(f"no knowledge survived refinement{detail}; answered without calling the LM")
            return Answered(UNKNOWN_ANSWER, context)
        pred = self._predict_with_retries(self.answerer, "answer", run, question=question, context=context)
        answer = clean_answer(pred)
        if not answer:
            # No made-up "I don't know": the knowledge was there, the LM failed to use it.
            raise LMUnavailableError(
                f"the LM {run.trace.lm_model} gave no usable answer after {self.config.lm_calls.retries + 1} attempts "
                f"(last: {run.trace.errors[-1] if run.trace.errors else 'an empty answer'})",
                run.trace,
                "answer",
            )
        with_unit = attach_unit(answer, context) if self.config.answer_units else answer
        return Answered(with_unit, context, lm_answer=answer if with_unit != answer else None)

    def _predict_with_retries(
        self,
        predictor: dspy.Predict,
        what: str,
        run: QuestionRun,
        **inputs: Any,
    ) -> dspy.Prediction | None:
        for attempt in range(self.config.lm_calls.retries + 1):
            try:
                with text_format():
                    pred = predictor(**inputs, config=text_config(attempt))
            except Exception as exc:  # noqa: BLE001 - recorded, retried, then degraded
                run.error(f"{what} attempt {attempt + 1} failed: {describe_error(exc)}")
                if classify_lm_error(exc) != "output":
                    run.lm.failed(what, exc)  # DSPy already retried it with backoff; may stop the run
                    return None
                continue
            run.lm.succeeded()
            return pred
        return None

    @staticmethod
    def _untrusted(items: list, sanitize, run: QuestionRun) -> list:
        """Passages or web results made inert (see ``untrusted.py``); defused injections are traced."""
        clean = []
        for item in items:
            item, removed = sanitize(item)
            note = defused_note(getattr(item, "doc_id", None) or item.url, removed) if removed else None
            if note and note not in run.trace.defused:  # the witness search may read a page again
                run.trace.defused.append(note)
            clean.append(item)
        return clean

    @staticmethod
    def _count_lm_outcome(judgement: Judgement, stage: str, run: QuestionRun) -> None:
        if judgement.lm_error is not None:
            run.lm.failed(stage, judgement.lm_error)
        else:
            run.lm.succeeded()

    # -- saving: DSPy's own save/load, with the config in the state ----------------------------------
    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        """Every parameter's DSPy state and, under ``config``, the :class:`~crag_dspy.config.CRAGConfig`
        with the (lower, upper) the thresholds route with. DSPy's ``save`` writes this."""
        state = super().dump_state(json_mode=json_mode)
        config = self.config.replace(lower=self.thresholds.lower, upper=self.thresholds.upper)
        state["config"] = config.model_dump(mode="json" if json_mode else "python")
        return state

    def load_state(self, state: dict[str, Any], *, allow_unsafe_lm_state: bool = False) -> CRAG:
        """Apply a :meth:`dump_state`: its ``config`` (validated), then every parameter's state. Raises
        (pydantic's ValidationError for a bad config) and leaves the module as it was on any error."""
        if allow_unsafe_lm_state:
            raise ValueError("a CRAG program never carries an LM: there is no LM state to allow")
        if "config" not in state:
            raise ValueError("a CRAG state holds its 'config' (written by CRAG.dump_state)")
        config = CRAGConfig.model_validate(state["config"])
        previous, thresholds = self.config, self.thresholds.dump_state()
        self.config = config
        try:
            # DSPy's load_state does a trial run on a copy first: a bad parameter state raises untouched.
            super().load_state(_saved_fields_by_name(self, state))
        except Exception:
            self.config = previous
            self.thresholds.load_state(thresholds)
            raise
        return self

    def save(self, path: Any, save_program: bool = False, modules_to_serialize: Any = None) -> None:
        """Write the program file (:mod:`crag_dspy.program`): DSPy's JSON save format with the config and
        crag-dspy's metadata; a trained evaluator's weights go to a folder beside it. JSON only: a
        program is never pickled, so ``save_program=True`` is refused."""
        from . import program_file as program

        if save_program or modules_to_serialize:
            raise program.ProgramError(
                "CRAG programs are saved as JSON state only (crag.save('program.json'))"
            )
        program.save_program(self, path)

    def load(self, path: Any, allow_pickle: bool = False, allow_unsafe_lm_state: bool = False) -> CRAG:
        """Load a program file written by :meth:`save` or ``python -m optimize.compile``: validated
        (format version, config, state) before anything is applied, config included; a trained
        evaluator is loaded from beside the file. Raises :class:`~crag_dspy.program.ProgramError`."""
        from . import program_file as program

        if allow_pickle or allow_unsafe_lm_state:
            raise program.ProgramError(
                "CRAG programs are JSON and never carry an LM: nothing unsafe to allow"
            )
        return program.load_into(self, path)


@dataclass
class _RunStages:
    """:class:`RouteStages` of one question's run: each stage computed on demand, into its trace."""

    crag: CRAG
    question: str
    passages: list[Passage]
    scores: list[float | None]
    query: str | None  # the web query, when the internal retries wrote it already
    run: QuestionRun
    web: Knowledge | None = None
    inside: Knowledge | None = None

    def external(self) -> Knowledge | None:
        self.web = self.crag.external_knowledge(self.question, self.run, query=self.query)
        return self.web

    def internal(self) -> Knowledge:
        if self.run.trace.action == Action.INCORRECT.value:
            self.run.fallback("web search gave nothing; answered from internal knowledge instead")
        self.inside = self.crag.internal_knowledge(self.question, self.passages, self.scores, self.run)
        return self.inside

    def answer(self, internal: list[Strip], external: list[Strip]) -> str:
        for known in (self.inside, self.web):
            if known is not None and known.reserve and known.reserve in (internal, external):
                self.crag.note_reserve_used(known.reserve, self.run)
        return self.crag.generate(self.question, internal, external, self.run)
