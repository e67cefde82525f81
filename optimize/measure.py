"""Measure judges and whole programs on labelled sets (LM calls included): the library the compile
and the grade-source stage run them with. The evaluation's command line is ``optimize.evaluate``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import dspy
from tqdm.auto import tqdm

from crag_dspy.faults import CRAGRunError
from crag_dspy.judges.llm import Judgement
from crag_dspy.judges.protocols import Judge
from crag_dspy.trace import StageUsage, usage_from_tracker

from .metrics import BinaryReport, answer_matches, binary_report

__all__ = ["ProgramEvaluation", "evaluate_judge", "evaluate_program", "judge_outcomes", "judge_scores"]


def judge_outcomes(
    judge: Judge,
    examples: Sequence[dspy.Example],
    *,
    desc: str,
    progress: bool = True,
) -> list[Judgement]:
    """One :class:`~crag_dspy.judges.llm.Judgement` per example, in input order."""
    # Sorted by question so consecutive calls share the cached prompt prefix; results keep input order.
    order = sorted(range(len(examples)), key=lambda i: examples[i].question)
    outcomes: list[Judgement | None] = [None] * len(examples)
    for i in tqdm(order, desc=desc, disable=not progress):
        outcomes[i] = judge(**examples[i].inputs()).judgement
    return outcomes  # type: ignore[return-value]


def judge_scores(
    judge: Judge,
    examples: Sequence[dspy.Example],
    *,
    desc: str,
    progress: bool = True,
) -> list[float | None]:
    return [j.score for j in judge_outcomes(judge, examples, desc=desc, progress=progress)]


def evaluate_judge(
    judge: Judge, examples: Sequence[dspy.Example], label: str, *, desc: str, progress: bool = True
) -> BinaryReport:
    scores = judge_scores(judge, examples, desc=desc, progress=progress)
    return binary_report(scores, [int(bool(e[label])) for e in examples])


@dataclass
class ProgramEvaluation:
    name: str
    accuracy: float
    n: int
    seconds_per_question: float
    usage: StageUsage
    actions: dict[str, int] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)


def evaluate_program(
    name: str, program: dspy.Module, examples: Sequence[dspy.Example], *, progress: bool = True
) -> ProgramEvaluation:
    """Answer accuracy (normalized gold-alias match) of ``program`` on QA examples, with cost."""
    rows, actions = [], {}
    started = time.perf_counter()
    with dspy.track_usage() as tracker:
        for example in tqdm(examples, desc=f"evaluate {name}", disable=not progress):
            try:
                pred = program(question=example.question)
            except CRAGRunError as exc:
                # One failed question is a wrong answer with its reason, not the end of the evaluation.
                rows.append(
                    {"id": example.id, "answer": None, "action": None, "correct": False, "error": str(exc)}
                )
                continue
            action = pred.get("action")
            if action:
                actions[action] = actions.get(action, 0) + 1
            rows.append(
                {
                    "id": example.id,
                    "answer": pred.answer,
                    "action": action,
                    "correct": answer_matches(pred.answer, example.answers),
                }
            )
    seconds = time.perf_counter() - started
    n = len(examples)
    return ProgramEvaluation(
        name,
        sum(r["correct"] for r in rows) / n if n else 0.0,
        n,
        seconds / n if n else 0.0,
        usage_from_tracker(tracker),
        actions,
        rows,
    )
