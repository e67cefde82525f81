"""Learned calibration of a judge's P(yes): the part of a compiled judge that small models need most.

A small LLM (the embedded one) ranks relevant passages above irrelevant ones well (ROC AUC ~0.9 on the default domain)
but its P(yes) is biased, and few-shot demos shift that bias further (docs/compile.md). Platt scaling,
``sigmoid(slope * logit(p) + intercept)`` fitted on labelled training pairs, moves the decision point
to where the labels say it is. It is monotone, so the ranking (and AUC) is untouched, and it costs no
LM call at run time or when it is fitted on scores the compile has already computed.

A calibration may also weigh lexical evidence (:mod:`crag_dspy.judges.evidence`: how many of the question's
terms and numbers the judged text holds), ``sigmoid(slope * logit(p) + sum(w_i * f_i) + intercept)``.
That changes the ranking, which is the point: the LM reads an excerpt, the evidence the whole text.
The score stays increasing in the model's P(yes) for any fixed text (the slope is always positive).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dspy.predict.parameter import Parameter

from .evidence import EVIDENCE_FEATURES

__all__ = ["Calibration", "check_evidence_names", "fit_calibration", "logistic_fit", "logit"]

# P(yes) from top-10 logprobs saturates at exactly 0 or 1; clipping keeps logit finite and the map monotone.
_EPS = 1e-6


def logit(p: float) -> float:
    """log(p / (1 - p)) with p clipped to [1e-6, 1 - 1e-6], so that saturated P(yes) stays finite."""
    p = min(1.0 - _EPS, max(_EPS, p))
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


NAMES_SHOWN = 5
"""Unknown evidence names an error quotes; the rest are counted ("and 99995 more")."""


def check_evidence_names(weights: Mapping[str, Any]) -> None:
    """ValueError unless every name ``weights`` weighs is a known evidence feature; the message names the
    first :data:`NAMES_SHOWN` unknown ones and counts the rest (100,000 names made a 1 MB error line)."""
    unknown = sorted(set(weights) - set(EVIDENCE_FEATURES))
    if unknown:
        shown = ", ".join(repr(name[:40]) for name in unknown[:NAMES_SHOWN])
        more = f" and {len(unknown) - NAMES_SHOWN} more" if len(unknown) > NAMES_SHOWN else ""
        raise ValueError(
            f"calibration weighs unknown evidence {shown}{more}; this crag-dspy knows "
            f"{sorted(EVIDENCE_FEATURES)}"
        )


class Calibration(Parameter):
    """``sigmoid(slope * logit(p) + sum(weights[f] * evidence[f]) + intercept)`` as DSPy state, saved
    with the program JSON.

    The default (slope 1, intercept 0, no evidence weights) is the identity, so an uncompiled judge
    reports the model's own P(yes).
    """

    def __init__(
        self, slope: float = 1.0, intercept: float = 0.0, weights: Mapping[str, float] | None = None
    ):
        self.slope, self.intercept, self.weights = self._checked(slope, intercept, weights or {})

    @staticmethod
    def _checked(
        slope: float, intercept: float, weights: Mapping[str, float]
    ) -> tuple[float, float, dict[str, float]]:
        slope, intercept = float(slope), float(intercept)
        weights = {str(name): float(w) for name, w in weights.items()}
        if not all(math.isfinite(x) for x in (slope, intercept, *weights.values())):
            raise ValueError(
                f"calibration must be finite, got slope={slope}, intercept={intercept}, weights={weights}"
            )
        if slope <= 0:
            # A non-positive slope would invert or flatten the model's ranking: never a calibration.
            raise ValueError(f"calibration slope must be > 0, got {slope}")
        check_evidence_names(weights)
        return slope, intercept, weights

    @property
    def is_identity(self) -> bool:
        return self.slope == 1.0 and self.intercept == 0.0 and not self.weights

    @property
    def uses_evidence(self) -> bool:
        """Whether scores depend on the judged text's lexical evidence (callers must then pass it)."""
        return bool(self.weights)

    def __call__(self, p: float, evidence: Mapping[str, float] | None = None) -> float:
        if self.is_identity:
            return p
        return _sigmoid(self.slope * logit(p) + self._shift(evidence))

    def _shift(self, evidence: Mapping[str, float] | None) -> float:
        if not self.weights:
            return self.intercept
        missing = sorted(set(self.weights) - set(evidence or {}))
        if missing:
            raise ValueError(f"this calibration weighs evidence {missing}, which was not given")
        return self.intercept + sum(w * evidence[name] for name, w in self.weights.items())  # type: ignore[index]

    def cut(self, evidence: Mapping[str, float] | None = None) -> float:
        """The raw P(yes) that the calibration maps to 0.5 (for a text with this ``evidence``)."""
        return _sigmoid(-self._shift(evidence) / self.slope)

    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        return {"slope": self.slope, "intercept": self.intercept, "weights": dict(self.weights)}

    def load_state(self, state: dict[str, Any]) -> Calibration:
        # Programs of format 2 have no evidence weights.
        self.slope, self.intercept, self.weights = self._checked(
            state["slope"], state["intercept"], state.get("weights") or {}
        )
        return self

    def reset(self) -> None:
        """Fitted state, not demos: optimizers' resets keep it."""

    def __repr__(self) -> str:
        weights = "".join(f", {name}={w:.4g}" for name, w in self.weights.items())
        return f"Calibration(slope={self.slope:.4g}, intercept={self.intercept:.4g}{weights})"


def logistic_fit(
    rows: Sequence[Sequence[float]], labels: Sequence[int], *, c: float = 1.0
) -> tuple[list[float], float]:
    """(coefficients, intercept) of an L2 logistic regression on the raw features of ``rows``.

    Fitted on standardised features so that the penalty treats a logit (range ~±14) and a coverage
    (0..1) alike, then mapped back; C=1.0 regularises lightly: with tens of examples it keeps a
    separable set from infinite weights.
    """
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    x = np.array(rows, dtype=float)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    model = LogisticRegression(C=c).fit((x - mean) / std, list(labels))
    coef = model.coef_[0] / std
    return [float(w) for w in coef], float(model.intercept_[0] - (coef * mean).sum())


def fit_calibration(
    scores: Sequence[float | None],
    labels: Sequence[int | bool],
    evidence: Sequence[Mapping[str, float]] | None = None,
) -> Calibration:
    """Logistic regression of binary labels on logit(raw P(yes)) and, given ``evidence`` (one mapping
    of feature values per score), on those features too. Unknown scores are left out.

    Raises ValueError when the data cannot define a calibration: fewer than 2 known scores of each
    label, or scores that rank the labels backwards (the fitted slope would not be positive).
    """
    if evidence is not None and len(evidence) != len(scores):
        raise ValueError(f"{len(evidence)} evidence rows for {len(scores)} scores")
    names = sorted(evidence[0]) if evidence else []
    rows = [
        ([logit(s), *(evidence[i][n] for n in names)] if evidence else [logit(s)], int(bool(y)))
        for i, (s, y) in enumerate(zip(scores, labels, strict=True))
        if s is not None
    ]
    positives = sum(y for _, y in rows)
    if positives < 2 or len(rows) - positives < 2:
        raise ValueError(
            f"calibration needs at least 2 positive and 2 negative scored examples, got "
            f"{positives} positive and {len(rows) - positives} negative"
        )
    coef, intercept = logistic_fit([r for r, _ in rows], [y for _, y in rows])
    slope = float(coef[0])
    if slope <= 0:
        raise ValueError(f"scores do not rank the labels (fitted slope {slope:.3g}); judge is not usable")
    return Calibration(slope, intercept, {name: float(w) for name, w in zip(names, coef[1:])})
