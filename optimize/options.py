"""The compile's options, written once: ``python -m optimize.compile`` builds them from its flags (whose
help texts and defaults are these fields'), :func:`~optimize.compile.compile_program` and
:class:`~optimize.optimizer.CRAGOptimizer` take them, and every check of a value happens here.

    >>> CompileOptions(stages=("grader", "strips", "retry"), val_limit=40).thresholds
    True
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from crag_dspy.judges.evaluator import TrainingConfig

from .grade_source import GRADER_CHOICES
from .teleprompters import OPTIMIZERS
from .threshold_search import Objective

__all__ = ["GENERATORS", "STAGES", "CompileOptions"]

STAGES = ("grader", "strips", "rewriter", "answerer", "retry")
"""The compile's stages besides the thresholds (``thresholds``, on unless turned off)."""
GENERATORS = ("rewriter", "answerer")
"""The stages whose demos are bootstrapped from QA train runs."""


def _choose_from(kind: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; choose from {choices}")
    return value


class CompileOptions(BaseModel):
    """What a compile runs and how. Frozen: the report and the program's metadata state the options
    the compile ran with, so they cannot change under it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stages: tuple[str, ...] = Field(
        ("grader", "strips"),
        description=f"the stages to run, a subset of {','.join(STAGES)} (rewriter/answerer: demos "
        "bootstrapped from QA train, shipped only if they raise QA-val accuracy)",
    )
    thresholds: bool = Field(
        True,
        description="tune (lower, upper) on QA val, shipped only when they beat the defaults beyond noise; "
        "off keeps the program's thresholds and skips the QA-val route precomputation and the exact search",
    )
    optimizer: str = Field(
        "none",
        description="DSPy teleprompter proposing few-shot grader/strip-filter prompts; the zero-shot prompt "
        "is always a candidate and the best on val ships (none: zero-shot + calibration, chosen by "
        "measurement: on the embedded model every few-shot candidate scored lower, see docs/compile.md)",
    )
    demos: int = Field(4, ge=0, description="few-shot demos per predictor")
    calibration_pairs: int = Field(
        64,
        ge=0,
        description="held-out train examples per judge to fit its calibrations on; 0: no calibration",
    )
    grader: str = Field(
        "auto",
        description="where document grades come from: the LLM judge (llm), a cross-encoder trained on the "
        "relevance pairs (evaluator), or both fused with the retrieval similarity (fused); auto ships the "
        "best on val, never one below the uncompiled LLM judge (docs/evaluator.md)",
    )
    evaluator_base: Path | None = Field(
        None,
        description="local BERT-style encoder folder the evaluator is fine-tuned from (default: the bundled "
        "all-MiniLM-L6-v2)",
    )
    evaluator_training: TrainingConfig = Field(
        default_factory=TrainingConfig,
        description="how the evaluator is fine-tuned; its seed is the compile's",
    )
    distill: bool = Field(
        False,
        description="the compiled LLM judge also labels the train questions' unlabelled top-k retrieved "
        "passages for the evaluator's training: for the evaluator grade source on a domain with few "
        "labelled pairs, grading then needs no LM call (docs/evaluator.md)",
    )
    # At least 0: numpy's generators refuse a negative seed, and only after the LM work of the threshold search.
    seed: int = Field(0, ge=0, description="seed of every sampler, split and training")
    out: Path | None = Field(
        None,
        description="program JSON path (default: runs/<domain>/program.json); the Optuna journal and the "
        "accuracy landscape are written beside it (PATH.optuna.log, PATH.landscape.png). CRAGOptimizer "
        "without it keeps the study in memory and plots nothing",
    )
    # Whole splits by default: a handful of questions cannot tell a gain from noise (docs/compile.md).
    val_limit: int | None = Field(
        None,
        ge=1,
        description="tune thresholds and retries on N QA val questions, taken evenly across kinds (quick runs)",
    )
    judge_val_limit: int | None = Field(
        80,
        ge=1,
        description="measure grader and strip filter on N val examples each, whole questions spread evenly "
        "over the split",
    )
    test_limit: int | None = Field(
        None,
        ge=1,
        description="evaluate on N QA test questions, taken evenly across kinds (quick runs)",
    )
    evaluate_test: bool = Field(
        True,
        description="compare the compiled program with the uncompiled one and plain RAG on the QA test "
        "split (compile_program; CRAGOptimizer compiles only)",
    )
    num_threads: int = Field(
        1,
        ge=1,
        description="precompute N val questions' routes at a time; faster only with a hosted LM or a server "
        "with several slots, the embedded model serves one request at a time",
    )
    objective: str = Field(
        "accuracy",
        description="what the thresholds maximise on QA val: accuracy, truthfulness (right +1, \"I don't "
        'know" 0, wrong -1), or web<=X, the best accuracy searching the web for at most a share X of '
        "the questions (e.g. web<=0.5)",
    )
    progress: bool = Field(False, description="show progress bars")

    @field_validator("stages")
    @classmethod
    def _known_stages(cls, stages: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; choose from {STAGES}")
        return stages

    @field_validator("optimizer")
    @classmethod
    def _known_optimizer(cls, optimizer: str) -> str:
        return _choose_from("optimizer", optimizer, OPTIMIZERS)

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, objective: str) -> str:
        Objective.parse(objective)  # its error names the forms that work
        return objective.strip().lower()

    @property
    def threshold_objective(self) -> Objective:
        return Objective.parse(self.objective)

    @field_validator("grader")
    @classmethod
    def _known_grader(cls, grader: str) -> str:
        return _choose_from("grader", grader, GRADER_CHOICES)
