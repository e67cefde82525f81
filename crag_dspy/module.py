"""CRAG (Yan et al., 2024) as a DSPy module: retrieve, grade, route, refine, search, answer.

A question's flow is written once, in :meth:`CRAG.forward`; its stages (:mod:`crag_dspy.stages`) do
the work. Every variant is a call of it: a forced action, an ablation
(:class:`~crag_dspy.routing.Ablation`), and a stage cache shared between calls, which threshold tuning
and the evaluation use so that every variant of a question computes each stage once.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import dspy

from signatures import (
    AnswerFromContext,
    CondenseQuestion,
    FilterStrip,
    GradeDocument,
    ReviseQuery,
    RewriteQuery,
)

from .config import CRAGConfig
from .conversation import Turn, as_history
from .embeddings import Embedder
from .events import EventCallback
from .faults import asking
from .judges.fusion import Grading
from .judges.llm import BinaryJudge
from .judges.view import focus_view
from .program_state import SavedAsProgram
from .protocols import Retriever, WebSearch
from .retrievers import as_retriever
from .routing import NO_ABLATION, Ablation, Action, ablated_action, decide_action
from .run import QuestionRun, StageCache
from .stages import (
    Condense,
    Grade,
    Knowledge,
    Retrieve,
    abstain,
    answer_from,
    check_answer,
    finish,
    internal_knowledge,
    retry_internal,
    web_knowledge,
    why_no_web,
)
from .thresholds import Thresholds
from .trace import CRAGTrace
from .validation import normalize_question
from .web import web_is_off

__all__ = ["CRAG", "Thresholds"]

_SHARED = frozenset({"retriever", "web_search", "lm", "embedder"})


def _injected(dependency: Any, role: str, method: str, signature: str) -> Any:
    """``dependency`` when it is None or has the protocol's method, else a TypeError saying what it lacks."""
    if dependency is not None and not callable(getattr(dependency, method, None)):
        raise TypeError(
            f"{role} must have a method {signature} (crag_dspy.protocols), or be None to load or save "
            f"state only; got {type(dependency).__name__}"
        )
    return dependency


class CRAG(SavedAsProgram, dspy.Module):
    """Corrective RAG. Retriever, web search and (optionally) the LM are injected.

    Args:
        retriever: internal knowledge (:class:`~crag_dspy.protocols.Retriever`), or another library's
            retriever that :func:`~crag_dspy.retrievers.as_retriever` wraps (``dspy.retrievers.Embeddings``,
            a callable ``(query, k) -> list[str | dict]``, a LangChain or LlamaIndex retriever).
        web_search: external knowledge (:class:`~crag_dspy.protocols.WebSearch`).
        config: every setting (:class:`~crag_dspy.config.CRAGConfig`; its defaults when omitted).
        lm: the LM for every stage; ``None`` uses ``dspy.settings.lm``.
        embedder: sentence embeddings for the judges' views (default: the bundled MiniLM, loaded on
            first use).
        grader, strip_filter: the LLM judges (:class:`~crag_dspy.judges.llm.BinaryJudge`, e.g. over a
            signature with other instructions); default: over ``GradeDocument`` and ``FilterStrip``.
            The config sets their retries, logprobs and views; a compile tunes them.

    The rewriter and answerer reply in :class:`~crag_dspy.adapters.TextAdapter`'s bare format unless an
    adapter is set (``dspy.context(adapter=...)``); the judges read one word's probability. Calling it
    raises :class:`~crag_dspy.validation.QuestionError` for a bad question,
    :class:`~crag_dspy.faults.RetrievalError` when the store fails and
    :class:`~crag_dspy.faults.LMUnavailableError` when the LM is down or gives no usable answer; the
    last two carry the trace. Other faults degrade and are recorded in the trace (docs/reliability.md).
    One instance may serve many threads at once: a call keeps all its state in its own trace.
    """

    def __init__(
        self,
        retriever: Retriever | Any,
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
        # Another library's retriever (dspy.retrievers.Embeddings, a function, LangChain, LlamaIndex) is
        # wrapped in its adapter here, so every caller (load_program, the optimizers) takes them too.
        self.retriever = None if retriever is None else as_retriever(retriever)
        self.web_search = _injected(
            web_search, "web_search", "search", "search(query, max_results) -> list[WebResult]"
        )
        self.lm = lm
        self.embedder = embedder
        # The LLM judge, the trained evaluator or both fused (set by the compile, saved with the program).
        self.grading = Grading()
        self.grader = grader if grader is not None else BinaryJudge(GradeDocument)
        self.strip_filter = strip_filter if strip_filter is not None else BinaryJudge(FilterStrip)
        # Rewrites a follow-up into a standalone question with the history; never called without history.
        self.condenser = dspy.Predict(CondenseQuestion)
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
        self.grader.view = focus_view(config.grader_view.sentences, self.embedder, "document")
        self.strip_filter.view = focus_view(
            config.strip_view.sentences, self.embedder, "strip", self.grader.view
        )
        previous = getattr(self, "_config", None)
        if previous is None or (previous.lower, previous.upper) != (config.lower, config.upper):
            self.thresholds = Thresholds(config.lower, config.upper)
        self._config = config

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
        history: Sequence[Turn | Mapping[str, str] | tuple[str, str]] | None = None,
        action: Action | None = None,
        ablation: Ablation = NO_ABLATION,
        cache: StageCache | None = None,
        witness: bool = True,
        on_start: Callable[[CRAGTrace], None] | None = None,
        cancel: threading.Event | None = None,
        on_event: EventCallback | None = None,
    ) -> dspy.Prediction:
        """Answer ``question``: condense a follow-up with its ``history``, retrieve, grade, decide the action (after internal retry rounds when
        configured), refine the knowledge the action reads, answer, check the answer. With no web search
        configured, INCORRECT answers "I don't know" without refining the passages the grader rejected.

        ``history`` holds the conversation's earlier turns, oldest first (``{"question": ..., "answer":
        ...}`` or (question, answer) pairs, at most ``config.max_history_turns``): with any,
        the follow-up is first rewritten into a standalone question (the ``condense`` stage, one LM
        call; ``trace.standalone_question``) that every later stage reads; without, no call is made.
        ``action`` forces the route (no decision, no retry rounds; passages graded only when refinement
        reads the grades); ``ablation`` leaves out what the paper's ablations do; ``cache`` keeps stage
        results across calls (default: this call's own); ``witness=False`` skips the witness search,
        for callers that read only answers (it changes the grounding, never the answer). ``on_start``
        gets the trace as the run begins (a server with a deadline answers with what was done so far);
        setting ``cancel`` stops the run as its next stage starts (:class:`~crag_dspy.faults.RunCancelled`);
        ``on_event`` gets each stage event as it happens (:mod:`crag_dspy.events`; inside
        ``dspy.streamify`` they also stream as status messages)."""
        # Any length: the length limit is the app's (CLI, server), which knows its users and budget.
        question = normalize_question(question, max_chars=None)
        # A bad history is refused before any work, as a bad question is.
        turns = as_history(history, max_turns=self.config.max_history_turns)
        run = self.new_run(question, cache=cache, cancel=cancel, on_event=on_event)
        run.trace.history_turns = len(turns)
        if on_start is not None:
            on_start(run.trace)
        with self.lm_scope(run.trace), asking(question):  # a batch's LM watch counts questions
            if turns:
                question = self._standalone(run, question, turns)
            passages = Retrieve(self, run)(question=question)
            grades = (
                Grade(self, run)(question=question, passages=passages)
                if action is None or ablation.refine
                else []
            )
            scores = [grade.score for grade in grades]
            if action is None:
                bounds = run.trace.lower, run.trace.upper  # this question's pair (per type when tuned so)
                if decide_action(scores, *bounds).uses_web and self.config.internal_retries:
                    passages, scores = retry_internal(self, run, question, passages, scores)
                action = ablated_action(scores, *bounds, ablation.remove)
            run.trace.action = action.value
            run.emit("action", action=action.value, lower=run.trace.lower, upper=run.trace.upper)
            external = web_knowledge(self, run, question, ablation) if action.uses_web else None
            if action is Action.INCORRECT and web_is_off(self.web_search):
                # The grader rejected every passage and there is no web to correct it: on own documents
                # such answers were never right, only made up (docs/experiments.md, "INCORRECT without web").
                abstain(run, f"{why_no_web(self)}; every passage was graded below lower ({run.trace.lower})")
                return finish(run)
            internal = Knowledge([])
            if action.uses_internal or external is None:
                if action is Action.INCORRECT:
                    run.fallback(f"{why_no_web(self)}; answered from internal knowledge instead")
                internal = internal_knowledge(self, run, question, passages, scores, refine=ablation.refine)
            answer_from(self, run, question, action, internal, external)
            if witness:
                check_answer(self, run, question)
        return finish(run)

    def _standalone(self, run: QuestionRun, question: str, turns: list[Turn]) -> str:
        """The follow-up as a standalone question; its type's thresholds when the program has per-type
        ones (the type is the standalone question's: "and for a group?" alone has none)."""
        standalone = Condense(self, run)(question=question, turns=[turn.model_dump() for turn in turns])
        trace = run.trace
        trace.lower, trace.upper, trace.question_type = self.thresholds.for_question(standalone)
        return standalone

    async def aforward(
        self,
        question: str,
        *,
        history: Sequence[Turn | Mapping[str, str] | tuple[str, str]] | None = None,
        on_start: Callable[[CRAGTrace], None] | None = None,
        on_event: EventCallback | None = None,
    ) -> dspy.Prediction:
        """:meth:`forward` for an event loop (``await crag.acall(question)``): the question runs in a
        worker thread with this task's context (DSPy settings, callbacks), so the loop serves other
        requests meanwhile, and its LM calls go out ``lm_calls.concurrency`` at a time as in ``forward``.
        Cancelling the task stops the run as its next stage starts."""
        cancel = threading.Event()
        try:
            # type(self).forward: DSPy warns when an instance's forward is called other than by __call__.
            return await asyncio.to_thread(
                type(self).forward,
                self,
                question,
                history=history,
                on_start=on_start,
                cancel=cancel,
                on_event=on_event,
            )
        except asyncio.CancelledError:
            cancel.set()
            raise

    def new_run(
        self,
        question: str,
        *,
        cache: StageCache | None = None,
        cancel: threading.Event | None = None,
        on_event: EventCallback | None = None,
    ) -> QuestionRun:
        """A run of ``question`` with its thresholds; ``cache`` keeps its stages' results (default: its
        own); setting ``cancel`` stops it as its next stage starts; ``on_event`` gets its stage events."""
        lower, upper, kind = self.thresholds.for_question(question)
        names = {
            part: getattr(x, "name", type(x).__name__)
            for part, x in (("retriever", self.retriever), ("web_backend", self.web_search))
        }
        trace = CRAGTrace(
            question=question,
            lower=lower,
            upper=upper,
            question_type=kind,
            **names,
            internal_retries=self.config.internal_retries,
        )
        return QuestionRun(trace, cache, cancel, on_event)

    def lm_scope(self, trace: CRAGTrace):
        lm = self.lm or dspy.settings.lm
        if lm is None:
            raise ValueError("CRAG has no LM: pass lm=... or call dspy.configure(lm=...) first")
        trace.lm_model = getattr(lm, "model", type(lm).__name__)
        return dspy.context(lm=self.lm) if self.lm is not None else nullcontext()
