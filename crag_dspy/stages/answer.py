"""Answer from the refined, source-tagged knowledge only."""

from __future__ import annotations

from dataclasses import dataclass

import dspy

from ..citations import citations_of_trace
from ..faults import LMUnavailableError
from ..generation import attach_unit, clean_answer
from ..grounding import grounding_of_trace, no_classifier, preload_classifier
from ..redaction import excerpt
from ..routing import Action
from ..run import QuestionRun
from ..strips import format_context
from ..trace import CRAGTrace
from .base import Program, Stage
from .calls import predict_with_retries
from .knowledge import Knowledge, knowledge_for, note_reserve_used

__all__ = [
    "UNKNOWN_ANSWER",
    "Answer",
    "Answered",
    "abstain",
    "abstain_ungrounded",
    "answer_from",
    "finish",
]

UNKNOWN_ANSWER = "I don't know"


@dataclass(frozen=True)
class Answered:
    """The answer, the context it was given, and the LM's own reply when the answer differs from it."""

    answer: str
    context: str
    lm_answer: str | None = None


class Answer(Stage[Answered]):
    """Answer ``question`` from ``context`` (the formatted strips); an empty context is "I don't know"
    without an LM call (``unjudged``: how many strips the LM failed to judge, for the fallback)."""

    name = "answer"
    uses = ("answerer",)
    reads = ("lm_calls.retries", "answer_units")

    def compute(self, question: str, context: str, unjudged: int = 0) -> Answered:
        run, config = self.run, self.program.config
        if not context:
            detail = (
                f" ({unjudged} strips the LM failed to judge were dropped, not trusted)" if unjudged else ""
            )
            run.fallback(f"no knowledge survived refinement{detail}; answered without calling the LM")
            return Answered(UNKNOWN_ANSWER, context)
        retries = config.lm_calls.retries
        # The grounding check's classifier embeds sentences once the answer is back: its model (seconds
        # to load on a process's first answer) loads while the LM writes the answer, not after it.
        preload_classifier()
        pred = predict_with_retries(
            self.program.answerer, "answer", run, retries, question=question, context=context
        )
        answer = clean_answer(pred)
        if not answer:
            # No made-up "I don't know": the knowledge was there, the LM failed to use it.
            raise LMUnavailableError(
                f"the LM {run.trace.lm_model} gave no usable answer after {retries + 1} attempts "
                f"(last: {run.trace.errors[-1] if run.trace.errors else 'an empty answer'})",
                run.trace,
                "answer",
            )
        with_unit = attach_unit(answer, context) if config.answer_units else answer
        return Answered(with_unit, context, lm_answer=answer if with_unit != answer else None)

    def record(self, value: Answered, run: QuestionRun) -> None:
        trace = run.trace
        trace.context, trace.answer, trace.lm_answer = value.context, value.answer, value.lm_answer
        # No LM call: a string check of the answer against what the run read, so every answer carries
        # one, also a trace cut short by a deadline before the witness search (stages.check).
        strings_only = grounding_of_trace(trace, no_classifier)
        if self.program.config.abstain_ungrounded and strings_only.ungrounded:
            # answer_from replaces this answer with "I don't know": the classifier (an embedding model)
            # would judge an answer nobody reads.
            trace.grounding = strings_only
        else:
            trace.grounding = grounding_of_trace(trace)
        trace.citations = citations_of_trace(trace)


def answer_from(
    program: Program,
    run: QuestionRun,
    question: str,
    action: Action,
    internal: Knowledge,
    external: Knowledge | None,
) -> Answered:
    """Answer from the knowledge ``action`` reads (:func:`~crag_dspy.stages.refine.knowledge_for`),
    saying so in the trace when it is a reserve strip."""
    strips = knowledge_for(action, internal, external)
    for known in (internal, external):
        if known is not None and known.reserve and known.reserve in strips:
            note_reserve_used(known.reserve, run, program.config.strip_threshold)
    context = format_context(*strips)
    records = [*run.trace.internal_strips, *run.trace.external_strips]
    unjudged = 0 if context else sum(r.score is None for r in records)
    if records and unjudged == len(records):  # nothing kept, and not one strip judged usably
        # As for the answer: knowledge was there and the LM could judge none of it (a reasoning model whose
        # first tokens are "<think>", a wrong model): an "I don't know" would hide a fault (probe 8).
        raise LMUnavailableError(
            f"the LM {run.trace.lm_model} gave no usable judgement of any of the {len(records)} strips it was "
            f"asked about (last: {run.trace.errors[-1] if run.trace.errors else 'no reply'})",
            run.trace,
            "strip_filter",
        )
    answered = Answer(program, run)(question=question, context=context, unjudged=unjudged)
    grounding = run.trace.grounding
    if program.config.abstain_ungrounded and grounding is not None and grounding.ungrounded:
        return abstain_ungrounded(run, answered, grounding.ungrounded)
    return answered


def abstain(run: QuestionRun, why: str) -> None:
    """Answer "I don't know" without reading any knowledge or calling the LM, saying ``why``."""
    run.fallback(f'{why}: answered "I don\'t know" without reading them')
    run.trace.context = ""
    _answer_unknown(run.trace)


def _answer_unknown(trace: CRAGTrace) -> None:
    """The trace's answer "I don't know": nothing to cite, nothing to check."""
    trace.answer, trace.citations = UNKNOWN_ANSWER, []
    trace.grounding = grounding_of_trace(trace)


def abstain_ungrounded(run: QuestionRun, answered: Answered, ungrounded: list[str]) -> Answered:
    """Answer "I don't know" instead of an answer whose key content no kept strip states: a small model
    fills a gap in its context with a plausible number or name, and a wrong answer costs more than none."""
    trace = run.trace
    run.fallback(
        f"the LM answered {excerpt(answered.answer)!r}, but no kept strip states "
        f"{excerpt(', '.join(ungrounded))}: "
        'answered "I don\'t know" instead (abstain_ungrounded)'
    )
    trace.lm_answer = answered.answer
    _answer_unknown(trace)
    return Answered(UNKNOWN_ANSWER, answered.context, lm_answer=answered.answer)


def finish(run: QuestionRun) -> dspy.Prediction:
    """The run's prediction, once its answer is final (after the grounding check, an abstention): the
    ``answer`` and ``citations`` events are emitted here, so they tell what the caller gets."""
    trace = run.trace
    run.emit("answer", answer=trace.answer or "")
    run.emit(
        "citations",
        citations=[
            {"label": c.label, "doc_id": c.doc_id, "title": c.title, "url": c.url, "page": c.page}
            for c in trace.citations
        ],
    )
    return run.prediction()
