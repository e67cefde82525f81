"""Where a document's grade comes from: the LLM judge, the trained evaluator, or both fused.

No single evaluator wins everywhere (docs/evaluator.md): the trained cross-encoder is strong on real
text with a few hundred labelled pairs, the LLM judge where passages must be read closely and pairs are
few. ``optimize.compile`` measures all of them on val and records the winner here, as DSPy state saved
with the program JSON: the mode, the evaluator's weights manifest and two fitted logistic maps,
:class:`LinearScore`. ``evaluator`` maps the evaluator's logit to P(relevant); ``fused`` maps the LLM
judge's score (as a logit), the evaluator's logit and the retrieval similarity to one P(relevant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dspy.predict.parameter import Parameter

from .calibration import _sigmoid, logistic_fit, logit
from .evaluator import EvaluatorError, RelevanceEvaluator

__all__ = [
    "GRADE_MODES",
    "SIGNALS",
    "Grading",
    "LinearScore",
    "SignalScores",
    "fit_linear_score",
    "fused_signals",
]

GradeMode = Literal["llm", "evaluator", "fused"]
GRADE_MODES: tuple[str, ...] = ("llm", "evaluator", "fused")
# The signals a fused grade may weigh: the LLM judge's score as a logit, the evaluator's logit and
# the retriever's cosine similarity between question and passage.
SIGNALS = ("llm", "evaluator", "similarity")


@dataclass(frozen=True)
class LinearScore:
    """``sigmoid(intercept + sum(weights[s] * signals[s]))``: a fitted logistic map of named signals."""

    weights: Mapping[str, float]
    intercept: float

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(SIGNALS))
        if unknown or not self.weights:
            raise ValueError(f"a score weighs signals of {list(SIGNALS)}, got {sorted(self.weights)}")
        if not all(math.isfinite(float(x)) for x in (self.intercept, *self.weights.values())):
            raise ValueError(f"weights must be finite, got {dict(self.weights)}, intercept {self.intercept}")

    def __call__(self, signals: Mapping[str, float]) -> float:
        missing = sorted(set(self.weights) - set(signals))
        if missing:
            raise ValueError(f"signals {missing} are needed and were not given")
        return _sigmoid(self.intercept + sum(w * signals[name] for name, w in self.weights.items()))

    def as_dict(self) -> dict[str, Any]:
        return {"weights": dict(self.weights), "intercept": self.intercept}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LinearScore:
        return cls({str(k): float(v) for k, v in dict(state["weights"]).items()}, float(state["intercept"]))


def fit_linear_score(
    rows: Sequence[Mapping[str, float]], labels: Sequence[int | bool], *, c: float = 1.0
) -> LinearScore:
    """Logistic regression of ``labels`` on the signals of ``rows`` (all rows name the same signals),
    as :func:`~crag_dspy.judges.calibration.logistic_fit` fits it. Raises ValueError with fewer than 2
    examples of either label."""
    if len(rows) != len(labels):
        raise ValueError(f"{len(rows)} signal rows for {len(labels)} labels")
    y = [int(bool(v)) for v in labels]
    if sum(y) < 2 or len(y) - sum(y) < 2:
        raise ValueError(f"a fit needs 2 positive and 2 negative examples, got {sum(y)} of {len(y)} positive")
    names = sorted(rows[0])
    coef, intercept = logistic_fit([[row[n] for n in names] for row in rows], y, c=c)
    return LinearScore(dict(zip(names, coef)), intercept)


def fused_signals(llm_score: float, evaluator_logit: float, similarity: float) -> dict[str, float]:
    """The signals a fused grade weighs, from the LLM judge's score, the evaluator's logit and the
    retrieval similarity: one definition for fitting, measuring and grading."""
    return {"llm": logit(llm_score), "evaluator": evaluator_logit, "similarity": similarity}


@dataclass(frozen=True)
class SignalScores:
    """One passage's grade: the score, where it came from and the signals it was computed from."""

    score: float | None
    source: str  # "logprobs" | "label" | "error" (LLM judge) | "evaluator" | "fused"
    signals: dict[str, float] | None = None
    note: str | None = None  # a degradation worth tracing (the fused grade fell back to the evaluator)


class Grading(Parameter):
    """The grade source of a program as DSPy state (see the module docstring).

    ``evaluator`` (the model) is infrastructure: it is loaded from the folder named in ``manifest``
    by :meth:`attach` and is shared, never copied, by copies of the program.
    """

    def __init__(self) -> None:
        self.mode: str = "llm"
        self.evaluator: RelevanceEvaluator | None = None
        self.manifest: dict[str, Any] | None = None
        self.evaluator_score: LinearScore | None = None
        self.fused_score: LinearScore | None = None

    # -- state ------------------------------------------------------------------------------------
    def use(
        self,
        mode: str,
        evaluator: RelevanceEvaluator | None = None,
        evaluator_score: LinearScore | None = None,
        fused_score: LinearScore | None = None,
    ) -> Grading:
        """Switch to ``mode`` with what it needs (raises ValueError, unchanged, when something is missing)."""
        _check(mode, evaluator is not None, evaluator_score, fused_score)
        self.mode, self.evaluator = mode, evaluator
        self.evaluator_score, self.fused_score = evaluator_score, fused_score
        self.manifest = None  # written by save_program next to the weights
        return self

    @property
    def uses_llm(self) -> bool:
        return self.mode in ("llm", "fused")

    @property
    def uses_evaluator(self) -> bool:
        return self.mode in ("evaluator", "fused")

    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "evaluator": self.manifest,
            "evaluator_score": self.evaluator_score.as_dict() if self.evaluator_score else None,
            "fused_score": self.fused_score.as_dict() if self.fused_score else None,
        }

    def cache_state(self) -> tuple[dict[str, Any], str | None]:
        """What its grades depend on, for caches of them: its state and the evaluator's weights."""
        return self.dump_state(), self.evaluator.fingerprint if self.evaluator is not None else None

    def load_state(self, state: dict[str, Any]) -> Grading:
        mode = state.get("mode", "llm")
        try:
            evaluator_score = _linear(state.get("evaluator_score"))
            fused_score = _linear(state.get("fused_score"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"grading state has a malformed score map: {exc}") from exc
        manifest = state.get("evaluator")
        if manifest is not None:
            _check_manifest(manifest)
        _check(mode, manifest is not None, evaluator_score, fused_score)
        if manifest != self.manifest:
            self.evaluator = None  # other weights: attach() loads them
        self.mode, self.manifest = mode, manifest
        self.evaluator_score, self.fused_score = evaluator_score, fused_score
        return self

    def attach(self, program_dir: Path) -> None:
        """Verify and load the evaluator weights named by the manifest, relative to ``program_dir``.

        Raises :class:`~crag_dspy.judges.evaluator.EvaluatorError` naming the file that is missing or altered.
        """
        if self.manifest is None or self.evaluator is not None:
            return
        folder = program_dir / self.manifest["path"]
        self.evaluator = RelevanceEvaluator.load(folder, self.manifest["files"])

    def reset(self) -> None:
        """Fitted state, not demos: optimizers' resets keep it."""

    def __deepcopy__(self, memo: dict) -> Grading:
        new = Grading()
        new.mode, new.evaluator, new.manifest = self.mode, self.evaluator, dict(self.manifest or {}) or None
        new.evaluator_score, new.fused_score = self.evaluator_score, self.fused_score
        return new

    # -- scoring ----------------------------------------------------------------------------------
    def evaluator_logits(self, question: str, texts: Sequence[str]) -> list[float] | None:
        """The evaluator's logits for ``texts`` in one batched pass; None when the mode does not use it."""
        return self.evaluator_logits_for([(question, t) for t in texts])

    def evaluator_logits_for(self, pairs: Sequence[tuple[str, str]]) -> list[float] | None:
        """The evaluator's logits for (question, text) pairs; None when the mode does not use it."""
        if not self.uses_evaluator:
            return None
        if self.evaluator is None:
            raise EvaluatorError(
                "this program grades with a trained evaluator whose weights are not loaded; load the "
                "program with crag_dspy.load_program (which verifies and loads them)"
            )
        return self.evaluator.logits(pairs)

    def combine(
        self, llm_score: float | None, llm_source: str, evaluator_logit: float | None, similarity: float
    ) -> SignalScores:
        """The grade of one passage in this mode from its signals (``llm_score`` None: the judge failed)."""
        if self.mode == "llm":
            return SignalScores(llm_score, llm_source)
        assert evaluator_logit is not None and self.evaluator_score is not None
        evaluator_only = {"evaluator": evaluator_logit}
        if self.mode == "evaluator":
            return SignalScores(self.evaluator_score(evaluator_only), "evaluator", evaluator_only)
        if llm_score is None:
            return SignalScores(
                self.evaluator_score(evaluator_only),
                "evaluator",
                evaluator_only,
                note="the LLM judge failed; graded by the trained evaluator alone",
            )
        assert self.fused_score is not None
        signals = fused_signals(llm_score, evaluator_logit, similarity)
        return SignalScores(self.fused_score(signals), "fused", {k: round(v, 4) for k, v in signals.items()})


def _linear(state: Mapping[str, Any] | None) -> LinearScore | None:
    return None if state is None else LinearScore.from_dict(state)


def _check(
    mode: str, has_evaluator: bool, evaluator_score: LinearScore | None, fused: LinearScore | None
) -> None:
    if mode not in GRADE_MODES:
        raise ValueError(f"unknown grade mode {mode!r}; choose from {GRADE_MODES}")
    if mode != "llm" and not (has_evaluator and evaluator_score is not None):
        raise ValueError(f"grade mode {mode!r} needs a trained evaluator and its score map")
    if mode == "fused" and fused is None:
        raise ValueError("grade mode 'fused' needs its fused score map")


def _check_manifest(manifest: Any) -> None:
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("the evaluator manifest needs 'path' and 'files'")  # noqa: TRY004 - load_state's contract
    path = manifest.get("path")
    # A name beside the program JSON, never a path elsewhere on disk.
    if not isinstance(path, str) or not path or Path(path).name != path or path in (".", ".."):
        raise ValueError(f"the evaluator's folder must be a name beside the program file, got {path!r}")
