"""Work shared between program variants: each piece computed once, with the cost it took when it was.

Every CRAG variant the evaluation compares (thresholds, the paper's ablations, plain RAG, ...) is built
from the same few pieces per question: the retrieval, the document grades, the refined or raw internal
knowledge, the web query, the selected or raw web knowledge, and one answer per distinct context.
:class:`SharedWork` computes each piece at most once and remembers the LM usage and wall time measured
while computing it, so a variant costs, *standalone*, the sum of the pieces it used, while the whole
comparison costs only the distinct pieces. :class:`CRAGPieces` cuts a :class:`~crag_dspy.module.CRAG`
into those pieces with its public stages; threshold tuning and the evaluation both use it.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import dspy
from dspy.utils.callback import BaseCallback

from crag_dspy.baselines import passage_strips
from crag_dspy.faults import raise_if_lm_down
from crag_dspy.module import CRAG, Knowledge, RetryRound, follow_route
from crag_dspy.protocols import Passage, Retriever, WebResult, WebSearch
from crag_dspy.retry import route_with_retries
from crag_dspy.routing import Action
from crag_dspy.strips import Strip, format_context
from crag_dspy.trace import StageUsage, TraceRecorder, usage_from_tracker

__all__ = [
    "CRAGPieces",
    "Cost",
    "SharedJudgements",
    "SharedRetriever",
    "SharedWebSearch",
    "SharedWork",
    "state_key",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Cost:
    """LM usage and wall time of a piece of work.

    ``usage.calls`` counts requests the LM really served; ``requests`` counts every LM request,
    including those DSPy's disk cache answered (they cost ~0 s and no tokens now, but a run on a
    fresh cache pays for them).
    """

    usage: StageUsage = field(default_factory=StageUsage)
    seconds: float = 0.0
    requests: int = 0

    def plus(self, other: Cost) -> Cost:
        return Cost(self.usage.add(other.usage), self.seconds + other.seconds, self.requests + other.requests)

    def minus(self, other: Cost) -> Cost:
        usage = StageUsage(
            **{k: getattr(self.usage, k) - getattr(other.usage, k) for k in StageUsage.model_fields}
        )
        return Cost(usage, max(0.0, self.seconds - other.seconds), self.requests - other.requests)

    def as_dict(self) -> dict[str, float]:
        return {**self.usage.model_dump(), "requests": self.requests, "seconds": self.seconds}

    @staticmethod
    def total(costs: Iterable[Cost]) -> Cost:
        result = Cost()
        for cost in costs:
            result = result.plus(cost)
        return result


@dataclass
class _Entry:
    value: Any
    cost: Cost
    owner: str | None
    error: Exception | None = None
    notes: list[str] = field(default_factory=list)
    deps: set[Hashable] = field(default_factory=set)


@dataclass(eq=False)
class _Frame:
    """A piece being computed: the pieces it used, what those computed inside it cost, what went wrong."""

    key: Hashable = None
    children: Cost = field(default_factory=Cost)
    notes: list[str] = field(default_factory=list)
    deps: set[Hashable] = field(default_factory=set)
    requests: int = 0


@dataclass(frozen=True)
class _Scope:
    """What one thread does with a :class:`SharedWork`: the pieces it is computing (innermost last) and
    the consumer it works for, with the set that collects the keys that consumer uses."""

    frames: tuple[_Frame, ...] = ()
    consumer: str | None = None
    used: set[Hashable] | None = None


_IDLE = _Scope()


@dataclass(eq=False)
class _Pending:
    """A piece one thread is computing; other threads that need it wait for ``done``."""

    done: threading.Event = field(default_factory=threading.Event)


class _RequestCounter(BaseCallback):
    """Counts every LM request (cache hits too) for the piece the calling thread is computing."""

    def __init__(self, count: Callable[[], None]):
        self.count = count

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.count()


class SharedWork:
    """A memo of named pieces of work, each with the *own* cost measured when it was computed.

    A piece computed inside another (a retrieval inside grading) is charged to itself only, so that no
    cost is counted twice, and is a dependency of the outer piece. ``with work.consumer(name) as used:``
    collects the keys a consumer used, computed or reused, with their dependencies; a piece's owner is
    the consumer that computed it.

    Thread-safe: each thread has its own stack of pieces being computed and its own consumer (kept in a
    context variable, so threads started by :func:`optimize.parallel.map_questions` begin with the
    caller's consumer), LM requests are counted for the calling thread's piece, and a piece is
    computed by one thread only: another thread that needs it meanwhile waits for it. A piece's owner
    is the consumer that computed it, so with several threads a piece that two questions share (a
    retrieval or web search of the same text) belongs to whichever got there first; a piece's cost
    does not depend on which thread computed it, except its seconds.
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._pending: dict[Hashable, _Pending] = {}
        self._lock = threading.Lock()
        # One variable per instance: two SharedWorks used by one thread have separate scopes.
        self._scope: contextvars.ContextVar[_Scope] = contextvars.ContextVar(
            f"shared_work_{id(self):x}", default=_IDLE
        )
        self._counter = _RequestCounter(self._count_request)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @contextmanager
    def consumer(self, name: str) -> Iterator[set[Hashable]]:
        used: set[Hashable] = set()
        token = self._scope.set(replace(self._scope.get(), consumer=name, used=used))
        try:
            yield used
        finally:
            self._scope.reset(token)

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The piece ``key``, computed with ``compute()`` the first time only. A piece whose computation
        raised raises the same error again: a flaky backend must not give variants different inputs."""
        scope = self._scope.get()
        if scope.frames:
            with self._lock:
                scope.frames[-1].deps.add(key)
        entry = self._entry(key, compute, scope)
        if scope.used is not None:
            with self._lock:
                self._mark_used(key, scope.used)
        if entry.error is not None:
            raise entry.error
        return entry.value

    def _entry(self, key: Hashable, compute: Callable[[], Any], scope: _Scope) -> _Entry:
        """The entry of ``key``: memoized, waited for while another thread computes it, or computed."""
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    return entry
                pending = self._pending.get(key)
                if pending is None:
                    pending = self._pending[key] = _Pending()
                    break
            if any(frame.key == key for frame in scope.frames):
                # Waiting would never end (the piece waits for itself); sequentially it would recurse.
                raise RuntimeError(f"shared piece {key!r} needs itself")
            pending.done.wait()  # then memoized, or its computation was interrupted: look again
        try:
            entry = self._compute(key, compute, scope)
            with self._lock:
                self._entries[key] = entry
            return entry
        finally:
            with self._lock:
                del self._pending[key]
            pending.done.set()

    def _mark_used(self, key: Hashable, used: set[Hashable]) -> None:
        pending = [key]
        while pending:
            k = pending.pop()
            if k not in used:
                used.add(k)
                entry = self._entries.get(k)
                if entry is not None:
                    pending.extend(entry.deps)

    def note(self, message: str) -> None:
        """Attach a problem (an LM error the stage degraded around) to the piece being computed."""
        frames = self._scope.get().frames
        if frames:
            with self._lock:
                frames[-1].notes.append(message)

    def _count_request(self) -> None:
        frames = self._scope.get().frames
        if frames:
            with self._lock:
                frames[-1].requests += 1

    def _compute(self, key: Hashable, compute: Callable[[], Any], scope: _Scope) -> _Entry:
        frame = _Frame(key)
        token = self._scope.set(replace(scope, frames=(*scope.frames, frame)))
        callbacks = dspy.settings.callbacks or []
        started = time.perf_counter()
        value, error = None, None
        try:
            with (
                dspy.context(callbacks=[*callbacks, self._counter])
                if self._counter not in callbacks
                else nullcontext(),
                dspy.track_usage() as tracker,
            ):
                try:
                    value = compute()
                except Exception as exc:  # noqa: BLE001 - memoized and re-raised to every user of the piece
                    error = exc
        finally:
            self._scope.reset(token)
        # Usage and time are inclusive (nested pieces' too) and made exclusive here; requests are
        # counted by the innermost piece only, so they are exclusive already.
        inclusive = Cost(usage_from_tracker(tracker), time.perf_counter() - started, frame.requests)
        with self._lock:
            if scope.frames:
                parent = scope.frames[-1]
                parent.children = parent.children.plus(Cost(inclusive.usage, inclusive.seconds))
            own = inclusive.minus(frame.children)
            return _Entry(value, own, scope.consumer, error, list(frame.notes), set(frame.deps))

    def cost(self, keys: Iterable[Hashable]) -> Cost:
        """What the pieces ``keys`` cost together: a consumer's standalone cost."""
        with self._lock:
            return Cost.total(self._entries[k].cost for k in keys if k in self._entries)

    def notes(self, keys: Iterable[Hashable]) -> list[str]:
        with self._lock:
            return [n for k in keys if k in self._entries for n in self._entries[k].notes]

    def owned(self) -> dict[str | None, Cost]:
        """The cost of the pieces each consumer computed first (its marginal cost)."""
        with self._lock:
            entries = list(self._entries.values())
        owners: dict[str | None, Cost] = {}
        for entry in entries:
            owners[entry.owner] = owners.get(entry.owner, Cost()).plus(entry.cost)
        return owners

    def total(self) -> Cost:
        """What everything computed so far actually cost."""
        with self._lock:
            return Cost.total(e.cost for e in self._entries.values())


class SharedJudgements:
    """A :class:`~crag_dspy.module.JudgementMemo` whose judgements are shared pieces: a text a judge is
    shown is judged once per question, whichever piece (internal or web knowledge, any query, any
    program whose judge is in the same state) shows it first.

    ``states`` maps each judge's name in the memo's keys (``"grade"``, ``"strip_filter"``) to a key of
    its state (:func:`state_key`), so that judges in different states never share a judgement.
    """

    def __init__(self, work: SharedWork, states: dict[str, str]):
        self.work, self.states = work, states

    def get(self, key: Hashable, judge: Callable[[], T]) -> T:
        name, shown = key  # type: ignore[misc] - JudgementMemo's (judge, shown)
        return self.work.get(("judge", self.states[name], name, shown), judge)


class SharedRetriever:
    """A :class:`~crag_dspy.protocols.Retriever` whose results are pieces of a :class:`SharedWork`."""

    def __init__(self, inner: Retriever, work: SharedWork):
        self.inner, self.work = inner, work
        self.name = getattr(inner, "name", type(inner).__name__)

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return list(self.work.get(("retrieve", self.name, query, k), lambda: self.inner.retrieve(query, k)))


class SharedWebSearch:
    """A :class:`~crag_dspy.protocols.WebSearch` whose results (and failures) are shared pieces."""

    def __init__(self, inner: WebSearch, work: SharedWork):
        self.inner, self.work = inner, work
        self.name = getattr(inner, "name", type(inner).__name__)

    def search(self, query: str, max_results: int) -> list[WebResult]:
        key = ("search", self.name, query, max_results)
        return list(self.work.get(key, lambda: self.inner.search(query, max_results)))


def state_key(*parts: Any) -> str:
    """A short, stable hash of JSON-able state (predictor demos and instructions, config values)."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


class CRAGPieces:
    """One CRAG program cut into shared pieces with its public stages.

    Pieces are keyed by their inputs and by the state of the predictors that make them, so two programs
    with the same grader share grades, and any two routes to the same context share one answer. The CRAG
    given is not changed: the pieces run on a copy whose retriever and web search are shared.
    """

    def __init__(self, crag: CRAG, work: SharedWork):
        self.work = work
        self.crag = crag.deepcopy()  # shares the LM and backends, copies the predictors
        if not isinstance(crag.retriever, SharedRetriever):
            self.crag.retriever = SharedRetriever(crag.retriever, work)
        if not isinstance(crag.web_search, SharedWebSearch):
            self.crag.web_search = SharedWebSearch(crag.web_search, work)
        c = self.crag

        def judge(j):
            view = getattr(j.view, "key", None)  # None without a view, or for a view that names no key
            return state_key(j.dump_state(), j.use_logprobs, j.retries, view)

        grader, strip_filter = judge(c.grader), judge(c.strip_filter)
        cfg = c.config
        refine = (cfg.strip_threshold, cfg.max_strips, cfg.sentences_per_strip)
        evaluator = c.grading.evaluator.fingerprint if c.grading.evaluator is not None else None
        self._grader = state_key(grader, c.grading.dump_state(), evaluator, cfg.k, c.retriever.name)
        self._internal = state_key(self._grader, strip_filter, refine)
        retries = cfg.lm_calls.retries
        self._rewriter = state_key(c.rewriter.dump_state(), retries)
        self._reviser = state_key(c.reviser.dump_state(), retries)
        self._web = state_key(strip_filter, refine, cfg.web_results, c.web_search.name)
        self._raw_web = state_key(cfg.sentences_per_strip, cfg.web_results, c.web_search.name)
        self._answerer = state_key(c.answerer.dump_state(), retries, cfg.answer_units)
        self._judgements = SharedJudgements(work, {"grade": grader, "strip_filter": strip_filter})

    def grader(self, **inputs: str) -> dspy.Prediction:
        """The program's grader as a :class:`~crag_dspy.judges.protocols.Judge` whose judgements are
        this program's shared ones: a (question, document) pair shown to the grader as a retrieved
        passage was is not judged again."""
        run = self.crag.new_run(inputs["question"], judgements=self._judgements)
        with self.crag.lm_scope(run.trace):
            judgement, _ = self.crag.judge_once(self.crag.grader, "grade", run, **inputs)
        return dspy.Prediction(score=judgement.score, judgement=judgement)

    @property
    def grader_key(self) -> str:
        """Identifies the grader's state: programs with equal keys grade identically."""
        return self._grader

    @property
    def thresholds(self) -> tuple[float, float]:
        return self.crag.thresholds.lower, self.crag.thresholds.upper

    def thresholds_for(self, question: str) -> tuple[float, float]:
        """The (lower, upper) pair that routes ``question`` (its type's, with per-type thresholds)."""
        return self.crag.thresholds.for_question(question)[:2]

    def retrieve(self, question: str) -> list[Passage]:
        """The top-k passages, ungraded (plain RAG's view of the retrieval)."""
        return self.crag.retriever.retrieve(question, self.crag.config.k)

    def documents(self, question: str) -> tuple[list[Passage], list[float | None]]:
        """The top-k passages and their grades."""
        return self._stage(("grade", question, self._grader), question, self.crag.grade_documents)

    def internal(self, question: str, *, refine: bool = True, rounds: Sequence[RetryRound] = ()) -> Knowledge:
        """Refined internal knowledge, or with ``refine=False`` the raw passages (no LM calls); with
        ``rounds``, of the passages those internal retry rounds graded too."""
        passages, scores = self._graded(question, rounds)
        if not refine:
            return Knowledge(passage_strips(passages))
        found = tuple(p.id for r in rounds for p in r.passages)
        return self._stage(
            ("internal", question, self._internal, found),
            question,
            lambda q, run: self.crag.internal_knowledge(q, passages, scores, run),
        )

    def retry_round(self, question: str, number: int) -> RetryRound:
        """Internal retry round ``number`` (from 1) of ``question``, from the rounds before it, as
        ``CRAG.retry_internal`` runs it: round 1 searches with the web query (:meth:`web_query`, the
        piece the web search uses too), later rounds with a revised query. Rounds and revised queries
        are pieces keyed by the queries tried and the grader, so every variant and every threshold pair
        that reaches a round shares it. There is no round after one that ended with an error."""
        if number < 1:
            raise ValueError(f"retry rounds count from 1, got {number}")
        before = [self.retry_round(question, n) for n in range(1, number)]
        if before and before[-1].error:
            raise ValueError(f"round {number - 1} ended the internal retries: {before[-1].error}")
        passages, _ = self._graded(question, before)
        tried = (question, *(r.query for r in before))
        if number == 1:
            query = self.web_query(question)
        else:
            query = self._stage(
                ("revise", question, tried, self._reviser),
                question,
                lambda q, run: self.crag.revise_query(q, tried, run),
            )
        return self._stage(
            ("retry", question, tried, query, self._grader),
            question,
            lambda q, run: self.crag.retry_round(q, query, tried, passages, run),
        )

    def retry_route(
        self, question: str, max_retries: int, *, thresholds: tuple[float, float] | None = None
    ) -> tuple[Action, list[RetryRound]]:
        """The action after at most ``max_retries`` internal retry rounds and the rounds it took, with
        this program's thresholds or ``thresholds``; computes only the rounds that route needs, and
        stops where ``CRAG.retry_internal`` stops (:func:`~crag_dspy.retry.route_with_retries`)."""
        lower, upper = thresholds or self.thresholds_for(question)
        _, scores = self.documents(question)
        rounds: list[RetryRound] = []
        action, _ = route_with_retries([scores], lower, upper, max_retries)
        while action.uses_web and len(rounds) < max_retries and not (rounds and rounds[-1].error):
            rounds.append(self.retry_round(question, len(rounds) + 1))
            action, _ = route_with_retries([scores, *(r.scores for r in rounds)], lower, upper, max_retries)
        return action, rounds

    def _graded(
        self, question: str, rounds: Sequence[RetryRound]
    ) -> tuple[list[Passage], list[float | None]]:
        """Every passage graded for ``question`` (the first retrieval, then ``rounds``), with its grade."""
        passages, scores = self.documents(question)
        return (
            [*passages, *(p for r in rounds for p in r.passages)],
            [*scores, *(x for r in rounds for x in r.scores)],
        )

    def web_query(self, question: str, *, rewrite: bool = True) -> str:
        if not rewrite:
            return question
        return self._stage(("rewrite", question, self._rewriter), question, self.crag.rewrite_query)

    def external(self, question: str, *, rewrite: bool = True, select: bool = True) -> Knowledge | None:
        """Selected (or with ``select=False`` all) web strips for the rewritten (or original) question;
        None when web search produced nothing."""
        query = self.web_query(question, rewrite=rewrite)
        return self._stage(
            ("external", question, query, select, self._web if select else self._raw_web),
            question,
            lambda q, run: self.crag.external_knowledge(q, run, query=query, select=select),
        )

    def answer(self, question: str, internal: list[Strip], external: list[Strip]) -> str:
        return self._stage(
            ("answer", question, format_context(internal, external), self._answerer),
            question,
            lambda q, run: self.crag.generate(q, internal, external, run),
        )

    def route(
        self,
        question: str,
        action: Action,
        *,
        refine: bool = True,
        rewrite: bool = True,
        select: bool = True,
        rounds: Sequence[RetryRound] = (),
    ) -> str:
        """The answer that ``action`` leads to, by the module's own rule (:func:`follow_route`) over
        these pieces, with internal knowledge from the passages of the internal retry ``rounds`` too
        (:meth:`retry_route`); ``refine``, ``rewrite`` and ``select`` turn stages off (the paper's
        ablations)."""
        return follow_route(action, _PieceStages(self, question, refine, rewrite, select, tuple(rounds)))

    def _stage(self, key: Hashable, question: str, stage: Callable[[str, TraceRecorder], T]) -> T:
        def compute() -> T:
            run = self.crag.new_run(question, judgements=self._judgements)
            with self.crag.lm_scope(run.trace):
                value = stage(question, run)
            for error in run.trace.errors:
                self.work.note(error)
            return value

        # Each piece is a run of its own (its own LMHealth), so in a batch the watch of the whole run
        # (crag_dspy.faults.watch_lm) decides between pieces whether the LM is down.
        raise_if_lm_down()
        return self.work.get(key, compute)


@dataclass(frozen=True)
class _PieceStages:
    """:class:`~crag_dspy.module.RouteStages` served from a program's shared pieces."""

    pieces: CRAGPieces
    question: str
    refine: bool
    rewrite: bool
    select: bool
    rounds: tuple[RetryRound, ...]

    def external(self) -> Knowledge | None:
        return self.pieces.external(self.question, rewrite=self.rewrite, select=self.select)

    def internal(self) -> Knowledge:
        return self.pieces.internal(self.question, refine=self.refine, rounds=self.rounds)

    def answer(self, internal: list[Strip], external: list[Strip]) -> str:
        return self.pieces.answer(self.question, internal, external)
