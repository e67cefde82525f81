"""Rewrite-and-retry of internal retrieval before the web (``CRAGConfig.internal_retries``).

On AMBIGUOUS or INCORRECT, CRAG searches its internal store again with a rewritten query, grades only
the passages it had not graded yet and decides the action again on every grade so far, for at most
``internal_retries`` rounds; only a route that still uses the web after the rounds searches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..faults import describe_error
from ..generation import clean_query
from ..protocols import Passage
from ..retry import is_new_query
from ..routing import Action, decide_action
from ..run import QuestionRun
from ..trace import DocumentGrade, InternalRound
from ..untrusted import sanitize_passage
from .base import Program, Stage
from .calls import predict_with_retries, untrusted
from .grade import grade_passages
from .web import Rewrite

__all__ = ["RetryRetrieval", "RetryRound", "ReviseQuery", "retry_internal"]


@dataclass(frozen=True)
class RetryRound:
    """What one internal retry round found: the ``passages`` no earlier retrieval had, with their
    ``grades``; ``repeated`` passages were found again and not graded twice. ``error`` says what ended
    the rounds with nothing new graded (a store fault, no new query)."""

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


def retry_internal(
    program: Program, run: QuestionRun, question: str, passages: list[Passage], scores: list[float | None]
) -> tuple[list[Passage], list[float | None]]:
    """Run the internal retry rounds of ``question``: every passage graded, in order, and their grades.

    Round 1 searches the store with the web query (the web search reuses it: one rewrite), later rounds
    with a query written knowing those tried (:class:`ReviseQuery`). Each round grades only the passages
    not graded before, and the action is decided again on every grade so far; the rounds stop once it
    is CORRECT, after a round that ended with an error (a store fault, a query that repeats one
    searched, no query), or at the cap. Every round is in the trace.
    """
    lower, upper = run.trace.lower, run.trace.upper  # the thresholds this run routes with
    passages, scores, tried = list(passages), list(scores), [question]
    run.trace.first_action = decide_action(scores, lower, upper).value
    for number in range(1, program.config.internal_retries + 1):
        if number == 1:
            query: str | None = Rewrite(program, run)(question=question)
        else:
            query = ReviseQuery(program, run)(question=question, tried=tuple(tried))
        if query is None:
            found = RetryRound("", error="no query: the query revision failed")
        elif not is_new_query(query, tried):
            found = RetryRound(query, error="no new query: it repeats one already searched")
        else:
            found = RetryRetrieval(program, run)(question=question, query=query, graded=tuple(passages))
        passages += found.passages
        scores += found.scores
        tried.append(found.query)
        action = decide_action(scores, lower, upper)
        run.trace.internal_rounds.append(found.record(number, action))
        if found.error or not action.uses_web:
            break
    return passages, scores


class ReviseQuery(Stage["str | None"]):
    """The query of a later internal retry round, written knowing the queries ``tried`` (the question
    first): its input differs from every earlier request, so it is never the same LM call again. None
    when the reviser failed; the fallback says so."""

    name = "internal_retry"
    uses = ("reviser",)
    reads = ("lm_calls.retries",)

    def compute(self, question: str, tried: Sequence[str]) -> str | None:
        retries = self.program.config.lm_calls.retries
        pred = predict_with_retries(
            self.program.reviser,
            "query revision",
            self.run,
            retries,
            question=question,
            tried_queries="\n".join(tried),
        )
        query = clean_query(pred)
        if not query:
            self.run.fallback("query revision failed; the internal retries ended")
            return None
        return query


class RetryRetrieval(Stage[RetryRound]):
    """One internal retry round: search the store with ``query`` and grade only the passages not in
    ``graded``. New passages are ranked after ``graded``, so that refinement and the trace put them
    after the passages graded before. A store fault does not raise: the round ends the retries with the
    error in the trace, and the route goes on with what was graded (the web, when it still uses it)."""

    name = "internal_retry"
    uses = ("retriever", "grader", "grading")
    reads = ("k",)

    def compute(self, question: str, query: str, graded: Sequence[Passage]) -> RetryRound:
        program, run = self.program, self.run
        try:
            found = program.retriever.retrieve(query, program.config.k)
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
        new = untrusted(new, sanitize_passage, run)  # the others were made inert when first found
        return RetryRound(
            query, new, grade_passages(program, run, question, new), repeated=len(found) - len(new)
        )
