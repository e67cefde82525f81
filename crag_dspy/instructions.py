"""A learned second opinion on instruction-like sentences, for the grounding check.

Logistic regression over the bundled MiniLM sentence embeddings (:class:`~crag_dspy.embeddings.Embedder`)
of a sentence whose numbers and names are masked (:func:`mask_specifics`: the classifier should learn
how a sentence addresses its reader, not which product it is about). Trained on the instruction
sentences of the injection suite's *tuned* sets (``dev``, ``round2``, ``round3``: the sentences the
phrase rule recognises) as positives and every sentence of the default domain's corpus and web as
negatives; the ``held-out`` sets are never read. The threshold is the lowest whose cross-validated false
positives on the negatives stay within ``max_false_positive_rate``. The weights are a small JSON file
in the package (never a pickle):

    python benchmarks/service.py train-classifier

The measured generalisation is modest (docs/reliability.md): a second opinion, not a defence.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .embeddings import Embedder

__all__ = ["TUNED_SETS", "WEIGHTS", "InstructionClassifier", "default_classifier", "fit", "mask_specifics"]

WEIGHTS = Path(__file__).with_name("instruction_weights.json")
TUNED_SETS = ("dev", "round2", "round3")
"""The injection suite's sets the classifier may learn from; the ``held-out`` sets are kept for measuring."""


def mask_specifics(sentence: str) -> str:
    """Numbers as ``N`` and capitalised words after the first as ``X``: "the AquaProbe 220 costs 990
    velds" -> "the X N costs N velds"."""
    sentence = re.sub(r"\d[\d,.:/-]*", "N", sentence)
    return re.sub(r"(?<=\w )[A-Z][\w-]*", "X", sentence)


@dataclass(frozen=True)
class InstructionClassifier:
    """P(instruction) of a sentence: ``sigmoid(w . embed(mask(sentence)) + bias)``; flagged at
    ``threshold`` or above."""

    weights: tuple[float, ...]
    bias: float
    threshold: float
    embedder: Embedder

    @classmethod
    def load(cls, path: Path = WEIGHTS, embedder: Embedder | None = None) -> InstructionClassifier:
        state = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            tuple(state["weights"]), float(state["bias"]), float(state["threshold"]), embedder or Embedder()
        )

    def scores(self, sentences: Sequence[str]) -> list[float]:
        if not sentences:
            return []
        vectors = np.asarray(self.embedder.encode([mask_specifics(s) for s in sentences]))
        z = vectors @ np.asarray(self.weights) + self.bias
        return [1.0 / (1.0 + math.exp(-float(v))) for v in z]

    def __call__(self, sentences: Sequence[str]) -> list[bool]:
        """Which of ``sentences`` read as instructions to the model."""
        return [score >= self.threshold for score in self.scores(sentences)]


@functools.cache
def default_classifier() -> InstructionClassifier:
    """The package's classifier on its own embedder, loaded once per process (on first use)."""
    return InstructionClassifier.load()


def fit(
    positives: Sequence[str],
    negatives: Sequence[str],
    embedder: Embedder,
    *,
    c: float = 10.0,
    max_false_positive_rate: float = 0.005,
    folds: int = 5,
) -> dict:
    """Weights, bias and threshold (see the module docstring) and the cross-validated recall and false
    positives behind the threshold."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    x = np.asarray(embedder.encode([mask_specifics(s) for s in [*positives, *negatives]]))
    y = np.array([1] * len(positives) + [0] * len(negatives))
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
    cv = StratifiedKFold(folds, shuffle=True, random_state=0)
    p = cross_val_predict(model, x, y, cv=cv, method="predict_proba")[:, 1]
    allowed = math.floor(max_false_positive_rate * len(negatives))
    # The lowest threshold with at most `allowed` negatives at or above it: just above the
    # (allowed+1)-th highest negative score.
    ranked = np.sort(p[y == 0])[::-1]
    threshold = float(min(0.999, ranked[allowed] + 1e-6)) if len(ranked) > allowed else 0.5
    model.fit(x, y)
    return {
        "weights": [round(float(w), 6) for w in model.coef_[0]],
        "bias": round(float(model.intercept_[0]), 6),
        "threshold": round(threshold, 6),
        "trained_on": {"positives": len(positives), "negatives": len(negatives), "c": c},
        "cross_validated": {
            "recall": float((p[y == 1] >= threshold).mean()),
            "false_positives": int((p[y == 0] >= threshold).sum()),
            "folds": folds,
        },
    }
