"""Grade each retrieved passage: P(relevant) from the grade source (LLM judge, trained evaluator, both)."""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

from ..judges.llm import Judgement
from ..protocols import Passage
from ..run import QuestionRun
from ..trace import DocumentGrade
from .base import Program, Stage
from .calls import count_lm_outcome, each_call, judge_once

__all__ = ["Grade", "GradePassage", "PassageGraded", "grade_passages"]


@dataclass(frozen=True)
class PassageGraded:
    """One passage's ``grade``, and the LLM judgement made for it when the LM was asked (``asked``; None
    when the grade reused a judgement or needed no LLM): the route counts its outcome towards "the LM is
    down" once the grade is in the trace."""

    grade: DocumentGrade
    asked: Judgement | None = None


class Grade(Stage[list[DocumentGrade]]):
    """Every retrieved passage graded (each by a :class:`GradePassage`); a failed grade is None
    (unknown) and an error in the trace."""

    name = "grade"
    uses = ("grader", "grading")

    def compute(self, question: str, passages: list[Passage]) -> list[DocumentGrade]:
        return grade_passages(self.program, self.run, question, passages)

    def record(self, value: list[DocumentGrade], run: QuestionRun) -> None:
        run.emit("graded", ids=[g.id for g in value], scores=[g.score for g in value])


def grade_passages(
    program: Program, run: QuestionRun, question: str, passages: list[Passage]
) -> list[DocumentGrade]:
    """Grade ``passages`` into the run's trace, in rank order (also for an internal retry round)."""
    # The trained evaluator scores all the passages in one batched pass, before any LLM call.
    logits = program.grading.evaluator_logits(question, [p.display for p in passages]) if passages else None
    grade, grades = GradePassage(program, run), []

    def one(i: int) -> PassageGraded:
        return grade(question=question, passage=passages[i], logit=None if logits is None else logits[i])

    calls = each_call(one, range(len(passages)), program.config.lm_calls.concurrency)
    with closing(calls) as graded_passages:
        for graded in graded_passages:
            run.trace.documents.append(graded.grade)  # in rank order, whichever call ended first
            grades.append(graded.grade)
            # Counted once the grade is in the trace: a run stopped here keeps the work done.
            if graded.asked is not None:
                count_lm_outcome(graded.asked, "grade", run)
    return grades


class GradePassage(Stage[PassageGraded]):
    """One passage's grade from the grade source's signals. Passages may be graded concurrently
    (``lm_calls.concurrency``), so the route records the grades, in rank order."""

    def compute(self, question: str, passage: Passage, logit: float | None) -> PassageGraded:
        program, run = self.program, self.run
        judgement, asked = (
            judge_once(program.grader, "grader", run, question=question, document=passage.display)
            if program.grading.uses_llm
            else (None, False)
        )
        graded = program.grading.combine(
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
