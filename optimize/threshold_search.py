"""Exact threshold search: the whole (lower, upper) plane reduced to the cells between observed grades.

A question's action depends on the thresholds only through its best known grade ``m`` and whether all
its grades are known (:func:`~crag_dspy.routing.decide_action`): CORRECT when ``m >= upper``,
INCORRECT when every grade is known and ``m < lower``. So with the distinct best grades
``v_1 < ... < v_n`` of a validation set, a threshold ``t`` in ``[0, 1]`` only matters through its cell
``[0, v_1], (v_1, v_2], ..., (v_n, 1]`` and route accuracy is constant on each (lower cell, upper cell)
pair. Evaluating one point per cell pair finds the optimum exactly; everything here is pure NumPy.

Among tied optima, :func:`choose_thresholds` prefers robustness to cost: the defaults when they are
optimal; otherwise the point deepest inside the optimal region (farthest from any non-optimal point,
so that grades drifting a little on new questions keep it optimal); fewer LM requests only after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crag_dspy.routing import DEFAULT_THRESHOLDS, Action

__all__ = [
    "ACTIONS",
    "RouteTable",
    "ThresholdChoice",
    "accuracy_grid",
    "cell_midpoints",
    "choose_thresholds",
    "cross_validated_correct",
]

ACTIONS: tuple[Action, ...] = (Action.CORRECT, Action.AMBIGUOUS, Action.INCORRECT)
_CORRECT, _AMBIGUOUS, _INCORRECT = range(3)
Bound = float | np.ndarray
RASTER_STEPS = 400
"""The tie-break measures depth on a raster of (RASTER_STEPS + 1)^2 points: thresholds in 0.0025 steps."""


@dataclass(frozen=True)
class RouteTable:
    """Per question: best known grade (-inf when none), whether every grade is known, which action's
    answer is right and what each action costs (LM requests), as arrays in :data:`ACTIONS` order."""

    best: np.ndarray
    all_known: np.ndarray
    correct: np.ndarray
    requests: np.ndarray

    @classmethod
    def build(
        cls,
        scores: Sequence[Sequence[float | None]],
        correct: Sequence[dict[str, bool]],
        requests: Sequence[dict[str, int]] | None = None,
    ) -> RouteTable:
        best = np.array(
            [max((s for s in grades if s is not None), default=-np.inf) for grades in scores], dtype=float
        )
        all_known = np.array([all(s is not None for s in grades) for grades in scores], dtype=bool)
        right = np.array([[c[a.value] for a in ACTIONS] for c in correct], dtype=bool).reshape(-1, 3)
        costs = requests or [{}] * len(scores)
        spent = np.array([[r.get(a.value, 0) for a in ACTIONS] for r in costs], dtype=float).reshape(-1, 3)
        return cls(best, all_known, right, spent)

    def __len__(self) -> int:
        return len(self.best)

    def subset(self, index: np.ndarray) -> RouteTable:
        return RouteTable(self.best[index], self.all_known[index], self.correct[index], self.requests[index])

    def actions(self, lower: Bound, upper: Bound) -> np.ndarray:
        """Each question's action index (into :data:`ACTIONS`), as ``decide_action`` would route it;
        ``lower``/``upper`` are one pair for all, or arrays of one pair per question."""
        incorrect = self.all_known & (self.best < lower)
        return np.where(self.best >= upper, _CORRECT, np.where(incorrect, _INCORRECT, _AMBIGUOUS))

    def correct_at(self, lower: Bound, upper: Bound) -> np.ndarray:
        return self.correct[np.arange(len(self)), self.actions(lower, upper)]

    def accuracy(self, lower: Bound, upper: Bound) -> float:
        return float(self.correct_at(lower, upper).mean()) if len(self) else 0.0

    def requests_at(self, lower: Bound, upper: Bound) -> float:
        return (
            float(self.requests[np.arange(len(self)), self.actions(lower, upper)].mean())
            if len(self)
            else 0.0
        )

    def breakpoints(self) -> np.ndarray:
        """The distinct best grades inside [0, 1]: the only values where accuracy can change."""
        finite = self.best[np.isfinite(self.best)]
        return np.unique(np.clip(finite, 0.0, 1.0))


def cell_midpoints(breakpoints: np.ndarray) -> np.ndarray:
    """One threshold per cell ``[0, v_1], (v_1, v_2], ..., (v_n, 1]``: its midpoint (empty cells left out)."""
    if len(breakpoints) == 0:
        return np.array([0.5])
    edges = np.concatenate([[0.0], breakpoints, [1.0]])
    mids = (edges[:-1] + edges[1:]) / 2
    # The last cell (v_n, 1] is empty when v_n == 1; the first, [0, v_1], holds 0 even when v_1 == 0.
    return mids if breakpoints[-1] < 1.0 else mids[:-1]


def _cell_index(breakpoints: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    # t in (v_j, v_{j+1}] has exactly j breakpoints strictly below it.
    return np.searchsorted(breakpoints, thresholds, side="left")


def accuracy_grid(table: RouteTable, points: np.ndarray) -> np.ndarray:
    """Accuracy for every (lower, upper) in ``points`` x ``points``: grid[i, j] for lower = points[i],
    upper = points[j]; NaN where lower > upper. One matrix product, no loop over the grid."""
    if len(table) == 0:
        raise ValueError("no validation questions to tune thresholds on")
    right_c, right_a, right_i = (table.correct[:, k].astype(float) for k in range(3))
    is_correct = (table.best[None, :] >= points[:, None]).astype(float)  # by upper: (U, Q)
    is_incorrect = (table.all_known[None, :] & (table.best[None, :] < points[:, None])).astype(
        float
    )  # by lower
    not_correct = 1.0 - is_correct
    hits = (
        (is_correct @ right_c)[None, :]
        + (not_correct @ right_a)[None, :]
        + is_incorrect @ (not_correct * (right_i - right_a)[None, :]).T
    )
    grid = hits / len(table)
    grid[points[:, None] > points[None, :]] = np.nan
    return grid


@dataclass(frozen=True)
class ThresholdChoice:
    """The chosen thresholds, the optimum's accuracy and how the tie among optima was broken."""

    lower: float
    upper: float
    accuracy: float
    rule: str
    """``"defaults"``, ``"deepest"`` or ``"cheapest cell"`` (no raster point fell in the optimal region)."""
    depth: float
    """Distance (in threshold units, max-norm) from the point to the nearest non-optimal point."""
    tied_fraction: float
    """Share of the valid grid cells that reach the optimum."""
    grid_points: int


def choose_thresholds(
    table: RouteTable, defaults: tuple[float, float] = DEFAULT_THRESHOLDS
) -> ThresholdChoice:
    """The exact optimum of route accuracy over (lower, upper), ties broken by the documented rule:
    the defaults if they are optimal, else the deepest optimal point, then fewer LM requests, then the
    wider AMBIGUOUS band (the action the paper found robust to grader mistakes)."""
    from scipy.ndimage import distance_transform_cdt

    breakpoints = table.breakpoints()
    points = cell_midpoints(breakpoints)
    grid = accuracy_grid(table, points)
    best = np.nanmax(grid)
    valid = ~np.isnan(grid)
    optimal = valid & np.isclose(grid, best)
    tied = float(optimal.sum() / valid.sum())
    if np.isclose(table.accuracy(*defaults), best):
        return ThresholdChoice(*defaults, float(best), "defaults", np.nan, tied, int(valid.sum()))

    axis = np.linspace(0.0, 1.0, RASTER_STEPS + 1)
    cells = _cell_index(breakpoints, axis)
    # Infeasible points (lower > upper) are no edge of the region: only non-optimal valid points are.
    feasible = axis[:, None] <= axis[None, :]
    good = optimal[cells[:, None], cells[None, :]] | ~feasible
    candidates = good & feasible
    if candidates.any() and not good.all():
        depth = distance_transform_cdt(good, metric="chessboard").astype(float) / RASTER_STEPS
        lo, up = np.nonzero(candidates & np.isclose(depth, depth[candidates].max()))
        pairs = [(axis[i], axis[j]) for i, j in zip(lo, up, strict=True)]
        deepest = depth[candidates].max()
        rule = "deepest"
    else:  # the optimal cells are all narrower than the raster step
        lo, up = np.nonzero(optimal)
        pairs = [(points[i], points[j]) for i, j in zip(lo, up, strict=True)]
        deepest, rule = 0.0, "cheapest cell"
    lower, upper = min(pairs, key=lambda p: (round(table.requests_at(*p), 9), p[0] - p[1], p[0]))
    return ThresholdChoice(
        float(lower), float(upper), float(best), rule, float(deepest), tied, int(valid.sum())
    )


def cross_validated_correct(
    table: RouteTable,
    tune,
    *,
    folds: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Out-of-fold right/wrong of a tuning procedure: each question is answered with thresholds chosen
    by ``tune(table_without_its_fold) -> (lower, upper) | callable`` on the other folds' questions.

    ``tune`` returns either a (lower, upper) pair or a function from question indices of the held-out
    fold to a right/wrong array (for procedures, like per-type thresholds, that route by question).
    Folds are a seeded permutation, so the estimate is reproducible.
    """
    n = len(table)
    if n < folds:
        raise ValueError(f"{n} questions cannot be split into {folds} folds")
    order = np.random.default_rng(seed).permutation(n)
    out = np.zeros(n, dtype=bool)
    for fold in np.array_split(order, folds):
        rest = np.setdiff1d(order, fold)
        chosen = tune(rest)
        if callable(chosen):
            out[fold] = chosen(fold)
        else:
            out[fold] = table.subset(fold).correct_at(*chosen)
    return out
