"""Learned calibration of a judge's P(yes): the part of a compiled judge that small models need most.

A 1.5B model ranks relevant passages above irrelevant ones well (ROC AUC ~0.89 on the default domain)
but its P(yes) is biased, and few-shot demos shift that bias further (docs/compile.md). Platt scaling,
``sigmoid(slope * logit(p) + intercept)`` fitted on labelled training pairs, moves the decision point
to where the labels say it is. It is monotone, so the ranking (and AUC) is untouched, and it costs no
LM call at run time or when it is fitted on scores the compile has already computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from dspy.predict.parameter import Parameter

__all__ = ["Calibration", "fit_calibration"]

# P(yes) from top-10 logprobs saturates at exactly 0 or 1; clipping keeps logit finite and the map monotone.
_EPS = 1e-6


def _logit(p: float) -> float:
    p = min(1.0 - _EPS, max(_EPS, p))
    return math.log(p / (1.0 - p))


class Calibration(Parameter):
    """``sigmoid(slope * logit(p) + intercept)`` as DSPy state, saved with the program JSON.

    The default (slope 1, intercept 0) is the identity, so an uncompiled judge reports the model's own
    P(yes).
    """

    def __init__(self, slope: float = 1.0, intercept: float = 0.0):
        self.slope, self.intercept = self._checked(slope, intercept)

    @staticmethod
    def _checked(slope: float, intercept: float) -> tuple[float, float]:
        slope, intercept = float(slope), float(intercept)
        if not (math.isfinite(slope) and math.isfinite(intercept)):
            raise ValueError(f"calibration must be finite, got slope={slope}, intercept={intercept}")
        if slope <= 0:
            # A non-positive slope would invert or flatten the model's ranking: never a calibration.
            raise ValueError(f"calibration slope must be > 0, got {slope}")
        return slope, intercept

    @property
    def is_identity(self) -> bool:
        return self.slope == 1.0 and self.intercept == 0.0

    def __call__(self, p: float) -> float:
        if self.is_identity:
            return p
        z = self.slope * _logit(p) + self.intercept
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def cut(self) -> float:
        """The raw P(yes) that the calibration maps to 0.5."""
        z = -self.intercept / self.slope
        return 1.0 / (1.0 + math.exp(-z))

    def dump_state(self, json_mode: bool = True) -> dict[str, float]:
        return {"slope": self.slope, "intercept": self.intercept}

    def load_state(self, state: dict[str, Any]) -> Calibration:
        self.slope, self.intercept = self._checked(state["slope"], state["intercept"])
        return self

    def reset(self) -> None:
        """Fitted state, not demos: optimizers' resets keep it."""

    def __repr__(self) -> str:
        return f"Calibration(slope={self.slope:.4g}, intercept={self.intercept:.4g})"


def fit_calibration(scores: Sequence[float | None], labels: Sequence[int | bool]) -> Calibration:
    """Platt scaling of raw P(yes) scores against binary labels (unknown scores are left out).

    Raises ValueError when the data cannot define a calibration: fewer than 2 known scores of each
    label, or scores that rank the labels backwards (the fitted slope would not be positive).
    """
    from sklearn.linear_model import LogisticRegression

    known = [(_logit(s), int(bool(y))) for s, y in zip(scores, labels, strict=True) if s is not None]
    positives = sum(y for _, y in known)
    if positives < 2 or len(known) - positives < 2:
        raise ValueError(
            f"calibration needs at least 2 positive and 2 negative scored examples, got "
            f"{positives} positive and {len(known) - positives} negative"
        )
    # C=1.0 regularises lightly: with tens of examples it keeps a separable set from an infinite slope.
    model = LogisticRegression(C=1.0).fit([[x] for x, _ in known], [y for _, y in known])
    slope, intercept = float(model.coef_[0][0]), float(model.intercept_[0])
    if slope <= 0:
        raise ValueError(f"scores do not rank the labels (fitted slope {slope:.3g}); judge is not usable")
    return Calibration(slope, intercept)
