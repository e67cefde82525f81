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
The same search serves any per-question, per-action value (right answers, truthfulness scores, web
searches, LM requests: :func:`value_grid`) and any :class:`Objective` (a web budget masks the cells
that search too often).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from crag_dspy.routing import DEFAULT_THRESHOLDS, Action

__all__ = [
    "ACCURACY",
    "ACTIONS",
    "Objective",
    "RouteTable",
    "ThresholdChoice",
    "accuracy_grid",
    "cell_midpoints",
    "choose_thresholds",
    "cross_validated_correct",
    "least_web",
    "truthfulness_scores",
    "value_grid",
]

ACTIONS: tuple[Action, ...] = (Action.CORRECT, Action.AMBIGUOUS, Action.INCORRECT)
_CORRECT, _AMBIGUOUS, _INCORRECT = range(3)
Bound = float | np.ndarray
RASTER_STEPS = 400
"""The tie-break measures depth on a raster of (RASTER_STEPS + 1)^2 points: thresholds in 0.0025 steps."""


def _per_action(rows: Sequence[dict[str, float]] | None, n: int) -> np.ndarray:
    """Per-question dicts keyed by action value as an (n, 3) float array in :data:`ACTIONS` order;
    missing rows or actions count 0."""
    rows = rows or [{}] * n
    return np.array([[r.get(a.value, 0) for a in ACTIONS] for r in rows], dtype=float).reshape(-1, 3)


def truthfulness_scores(correct: np.ndarray, abstained: np.ndarray) -> np.ndarray:
    """Element-wise truthfulness (Meta's CRAG benchmark): right +1, "I don't know" 0, wrong -1 (the
    array form of :func:`~optimize.metrics.truthfulness_score`)."""
    return np.where(correct, 1.0, np.where(abstained, 0.0, -1.0))


@dataclass(frozen=True)
class RouteTable:
    """Per question: best known grade (-inf when none), whether every grade is known, and per action (as
    arrays in :data:`ACTIONS` order) whether its answer is right, whether it is "I don't know", what it
    costs at run time in LM requests, web searches and LM tokens."""

    best: np.ndarray
    all_known: np.ndarray
    correct: np.ndarray
    requests: np.ndarray
    abstained: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=bool))
    web: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    tokens: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))

    def __post_init__(self) -> None:
        # Tables built without the optional columns get zeros of the right shape (nothing abstains,
        # nothing is searched), so every column indexes like ``correct``.
        for name, dtype in (("abstained", bool), ("web", float), ("tokens", float)):
            if getattr(self, name).shape != self.correct.shape:
                object.__setattr__(self, name, np.zeros(self.correct.shape, dtype=dtype))

    @classmethod
    def build(
        cls,
        scores: Sequence[Sequence[float | None]],
        correct: Sequence[dict[str, bool]],
        requests: Sequence[dict[str, int]] | None = None,
        *,
        abstained: Sequence[dict[str, bool]] | None = None,
        web: Sequence[dict[str, int]] | None = None,
        tokens: Sequence[dict[str, int]] | None = None,
    ) -> RouteTable:
        best = np.array(
            [max((s for s in grades if s is not None), default=-np.inf) for grades in scores], dtype=float
        )
        all_known = np.array([all(s is not None for s in grades) for grades in scores], dtype=bool)
        right = np.array([[c[a.value] for a in ACTIONS] for c in correct], dtype=bool).reshape(-1, 3)
        n = len(scores)
        return cls(
            best,
            all_known,
            right,
            _per_action(requests, n),
            _per_action(abstained, n).astype(bool),
            _per_action(web, n),
            _per_action(tokens, n),
        )

    @property
    def scores(self) -> np.ndarray:
        """Truthfulness per question and action (Meta's CRAG benchmark): right +1, "I don't know" 0,
        wrong -1."""
        return truthfulness_scores(self.correct, self.abstained)

    def __len__(self) -> int:
        return len(self.best)

    def subset(self, index: np.ndarray) -> RouteTable:
        return RouteTable(
            self.best[index],
            self.all_known[index],
            self.correct[index],
            self.requests[index],
            self.abstained[index],
            self.web[index],
            self.tokens[index],
        )

    def actions(self, lower: Bound, upper: Bound) -> np.ndarray:
        """Each question's action index (into :data:`ACTIONS`), as ``decide_action`` would route it;
        ``lower``/``upper`` are one pair for all, or arrays of one pair per question."""
        incorrect = self.all_known & (self.best < lower)
        return np.where(self.best >= upper, _CORRECT, np.where(incorrect, _INCORRECT, _AMBIGUOUS))

    def at(self, values: np.ndarray, lower: Bound, upper: Bound) -> np.ndarray:
        """Each question's entry of the per-action ``values`` (an (n, 3) array) where (lower, upper)
        routes it."""
        return values[np.arange(len(self)), self.actions(lower, upper)]

    def correct_at(self, lower: Bound, upper: Bound) -> np.ndarray:
        return self.at(self.correct, lower, upper)

    def accuracy(self, lower: Bound, upper: Bound) -> float:
        return float(self.correct_at(lower, upper).mean()) if len(self) else 0.0

    def requests_at(self, lower: Bound, upper: Bound) -> float:
        return float(self.at(self.requests, lower, upper).mean()) if len(self) else 0.0

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


def value_grid(table: RouteTable, points: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The mean over questions of the per-action ``values`` ((n, 3), :data:`ACTIONS` order) for every
    (lower, upper) in ``points`` x ``points``: grid[i, j] for lower = points[i], upper = points[j]; NaN
    where lower > upper. One matrix product, no loop over the grid."""
    if len(table) == 0:
        raise ValueError("no validation questions to tune thresholds on")
    v_c, v_a, v_i = (values[:, k].astype(float) for k in range(3))
    is_correct = (table.best[None, :] >= points[:, None]).astype(float)  # by upper: (U, Q)
    is_incorrect = (table.all_known[None, :] & (table.best[None, :] < points[:, None])).astype(
        float
    )  # by lower
    not_correct = 1.0 - is_correct
    total = (
        (is_correct @ v_c)[None, :]
        + (not_correct @ v_a)[None, :]
        + is_incorrect @ (not_correct * (v_i - v_a)[None, :]).T
    )
    grid = total / len(table)
    grid[points[:, None] > points[None, :]] = np.nan
    return grid


def accuracy_grid(table: RouteTable, points: np.ndarray) -> np.ndarray:
    """Accuracy for every (lower, upper) in ``points`` x ``points`` (:func:`value_grid` of right answers)."""
    return value_grid(table, points, table.correct)


_BUDGET = re.compile(r"^web\s*<=\s*(?P<share>[0-9]*\.?[0-9]+)$")


@dataclass(frozen=True)
class Objective:
    """What the threshold search maximises: ``"accuracy"`` (share of right answers) or ``"truthfulness"``
    (right +1, "I don't know" 0, wrong -1), optionally under a web budget: at most ``web_budget`` web
    searches per question (searches the routes make; the grounding check's witness search is the
    same for every threshold and not counted)."""

    metric: str = "accuracy"
    web_budget: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in ("accuracy", "truthfulness"):
            raise ValueError(f"unknown objective metric {self.metric!r}; choose accuracy or truthfulness")
        if self.web_budget is not None and not 0.0 <= self.web_budget <= 1.0:
            raise ValueError(f"a web budget is a share of questions in [0, 1], not {self.web_budget}")

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``"accuracy"``, ``"truthfulness"`` or ``"web<=X"`` (the best accuracy searching the web for at
        most a share X of questions)."""
        text = text.strip().lower()
        if text in ("accuracy", "truthfulness"):
            return cls(text)
        match = _BUDGET.match(text)
        if match is None:
            raise ValueError(
                f"unknown objective {text!r}: use accuracy, truthfulness or web<=X with X in [0, 1] "
                "(e.g. web<=0.5)"
            )
        return cls("accuracy", float(match["share"]))

    @property
    def label(self) -> str:
        return self.metric if self.web_budget is None else f"{self.metric}, web <= {self.web_budget:g}"

    def values(self, table: RouteTable) -> np.ndarray:
        """Per question and action, what the objective averages."""
        return table.scores if self.metric == "truthfulness" else table.correct.astype(float)

    def grid(self, table: RouteTable, points: np.ndarray) -> np.ndarray:
        """The objective on the grid; cells over the web budget are NaN, like invalid ones."""
        grid = value_grid(table, points, self.values(table))
        if self.web_budget is not None:
            grid[value_grid(table, points, table.web) > self.web_budget + 1e-9] = np.nan
        return grid

    def feasible(self, table: RouteTable, lower: Bound, upper: Bound) -> bool:
        return (
            self.web_budget is None
            or float(table.at(table.web, lower, upper).mean()) <= self.web_budget + 1e-9
        )

    def value(self, table: RouteTable, lower: Bound, upper: Bound) -> float:
        """The objective at one point (ignoring the budget)."""
        return float(table.at(self.values(table), lower, upper).mean()) if len(table) else 0.0


ACCURACY = Objective()


@dataclass(frozen=True)
class ThresholdChoice:
    """The chosen thresholds, the optimum's value (``accuracy``: of the objective searched, accuracy
    unless another was asked) and how the tie among optima was broken."""

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


def least_web(table: RouteTable) -> float:
    """The fewest web searches per question any (lower, upper) makes (routing every question with a
    grade CORRECT)."""
    points = cell_midpoints(table.breakpoints())
    return float(np.nanmin(value_grid(table, points, table.web)))


def choose_thresholds(
    table: RouteTable, defaults: tuple[float, float] = DEFAULT_THRESHOLDS, objective: Objective = ACCURACY
) -> ThresholdChoice:
    """The exact optimum of the ``objective`` (route accuracy by default; its value is the choice's
    ``accuracy``) over (lower, upper), ties broken by the documented rule: the defaults if they are
    optimal (and within a web budget), else the deepest optimal point, then fewer LM requests, then
    the wider AMBIGUOUS band (the action the paper found robust to grader mistakes). A web budget no
    pair of thresholds meets is a ValueError that says the least share reachable."""
    from scipy.ndimage import distance_transform_cdt

    breakpoints = table.breakpoints()
    points = cell_midpoints(breakpoints)
    grid = objective.grid(table, points)
    valid = ~np.isnan(grid)
    if not valid.any():
        raise ValueError(
            f"no thresholds meet the web budget {objective.web_budget:g}: the fewest web searches per "
            f"question these questions allow is {least_web(table):.2f} (questions without a grade always "
            "search)"
        )
    best = np.nanmax(grid)
    optimal = valid & np.isclose(grid, best)
    tied = float(optimal.sum() / valid.sum())
    if objective.feasible(table, *defaults) and np.isclose(objective.value(table, *defaults), best):
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
    values: np.ndarray | None = None,
) -> np.ndarray:
    """Out-of-fold right/wrong of a tuning procedure: each question is answered with thresholds chosen
    by ``tune(table_without_its_fold) -> (lower, upper) | callable`` on the other folds' questions.
    With ``values`` (an (n, 3) per-action array, e.g. truthfulness scores or web searches), each
    question's value where the out-of-fold thresholds route it instead (pairs only, not callables).

    ``tune`` returns either a (lower, upper) pair or a function from question indices of the held-out
    fold to a right/wrong array (for procedures, like per-type thresholds, that route by question).
    Folds are a seeded permutation, so the estimate is reproducible.
    """
    n = len(table)
    if n < folds:
        raise ValueError(f"{n} questions cannot be split into {folds} folds")
    order = np.random.default_rng(seed).permutation(n)
    out = np.zeros(n, dtype=bool if values is None else float)
    for fold in np.array_split(order, folds):
        rest = np.setdiff1d(order, fold)
        chosen = tune(rest)
        if callable(chosen):
            if values is not None:
                raise ValueError("values need a tuning procedure that returns a (lower, upper) pair")
            out[fold] = chosen(fold)
        elif values is None:
            out[fold] = table.subset(fold).correct_at(*chosen)
        else:
            out[fold] = table.subset(fold).at(values[fold], *chosen)
    return out
