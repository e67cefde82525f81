"""The DSPy teleprompters offered by ``--optimizer``, and how a stage is compiled with one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dspy
from dspy.teleprompt import BootstrapFewShot, BootstrapFewShotWithRandomSearch, LabeledFewShot, MIPROv2

__all__ = ["OPTIMIZERS", "compile_stage", "judge_metric"]

# "none" compiles no demos: the judge keeps its zero-shot prompt and only its calibration is fitted.
OPTIMIZERS = ("none", "labeled", "bootstrap", "random-search", "mipro")


def judge_metric(label: str) -> Callable[..., bool]:
    """Agreement of a yes/no judge with its label; an unknown (failed) judgement is a miss."""

    def metric(example: dspy.Example, prediction: Any, trace: Any = None) -> bool:
        value = prediction.get(label) if hasattr(prediction, "get") else None
        return value is not None and bool(value) == bool(example[label])

    return metric


def compile_stage(
    student: dspy.Module,
    trainset: Sequence[dspy.Example],
    *,
    optimizer: str,
    metric: Callable,
    demos: int,
    seed: int,
    valset: Sequence[dspy.Example] | None = None,
) -> dspy.Module:
    """Compile ``student`` (a copy is returned; the student is not modified)."""
    student = student.deepcopy()
    if optimizer == "none":
        return student
    if optimizer == "labeled":
        # sample=False: take the first `demos` of the (already balanced, seeded) trainset.
        return LabeledFewShot(k=demos).compile(student, trainset=list(trainset), sample=False)
    if optimizer == "bootstrap":
        return BootstrapFewShot(
            metric=metric, max_bootstrapped_demos=demos, max_labeled_demos=demos, max_errors=len(trainset)
        ).compile(student, trainset=list(trainset))
    if optimizer == "random-search":
        return BootstrapFewShotWithRandomSearch(
            metric=metric,
            max_bootstrapped_demos=demos,
            max_labeled_demos=demos,
            num_candidate_programs=4,
            num_threads=1,
            max_errors=len(trainset),
        ).compile(student, trainset=list(trainset), valset=list(valset or trainset))
    if optimizer == "mipro":
        return MIPROv2(
            metric=metric,
            auto="light",
            max_bootstrapped_demos=demos,
            max_labeled_demos=demos,
            num_threads=1,
            seed=seed,
        ).compile(student, trainset=list(trainset), valset=list(valset) if valset else None)
    raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
