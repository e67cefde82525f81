"""What CRAG's routing buys, from one precompute and no LM call: the cost-quality frontier over every
pair of thresholds, the lift over a router that knows nothing, and the headroom an oracle would have.

Every (lower, upper) routes each question to one of three actions whose answers the precompute holds
(:func:`~optimize.thresholds.precompute_routes`), so accuracy, truthfulness, web searches and LM
requests and tokens per question are known for the whole threshold plane (:func:`frontier_points`). The two
baselines are the ends of the cheapest line: plain RAG never searches, RAG + web always searches for
every question, and a router with no information that searches for a random share ``s`` of the
questions reaches ``(1 - s) * plain + s * always`` on average. CRAG's *routing lift* is its accuracy
minus that line's at its own web share (:func:`routing_lift`). The *oracle* takes the best action per
question (:func:`oracle_headroom`): what any evaluator could reach with these answers. Intervals are
percentile bootstraps over the questions (seed 0, so a report always prints the same interval).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .threshold_search import ACTIONS, RouteTable, cell_midpoints, truthfulness_scores, value_grid

__all__ = [
    "COLLAPSE_SHARE",
    "Baselines",
    "Estimate",
    "FrontierPoint",
    "collapse",
    "frontier_points",
    "frontier_summary",
    "oracle_headroom",
    "pareto",
    "routing_lift",
]

RESAMPLES = 2000


@dataclass(frozen=True)
class Baselines:
    """The routers with no information, per question (same order as the route table): plain RAG's and,
    when web search is configured, RAG + web always's answer right / "I don't know", and the LM tokens
    each answer costs (None when not measured)."""

    rag_correct: np.ndarray
    rag_abstained: np.ndarray
    web_correct: np.ndarray | None = None
    web_abstained: np.ndarray | None = None
    rag_tokens: np.ndarray | None = None
    web_tokens: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        rag: Sequence[tuple[bool, bool]],
        web: Sequence[tuple[bool, bool]] | None = None,
        *,
        rag_tokens: Sequence[int] | None = None,
        web_tokens: Sequence[int] | None = None,
    ) -> Baselines:
        """From (right, abstained) per question for plain RAG and (optional) RAG + web always, and
        (optional) each answer's LM tokens."""
        rag_arr = np.array(rag, dtype=bool).reshape(-1, 2)
        web_arr = np.array(web, dtype=bool).reshape(-1, 2) if web is not None else None
        return cls(
            rag_arr[:, 0],
            rag_arr[:, 1],
            None if web_arr is None else web_arr[:, 0],
            None if web_arr is None else web_arr[:, 1],
            None if rag_tokens is None else np.array(rag_tokens, dtype=float),
            None if web_tokens is None or web_arr is None else np.array(web_tokens, dtype=float),
        )

    @property
    def has_web(self) -> bool:
        return self.web_correct is not None

    def subset(self, index: np.ndarray) -> Baselines:
        def part(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[index]

        return Baselines(
            self.rag_correct[index],
            self.rag_abstained[index],
            part(self.web_correct),
            part(self.web_abstained),
            part(self.rag_tokens),
            part(self.web_tokens),
        )

    def points(self) -> dict[str, dict[str, float]]:
        """Each baseline as a point of the frontier plots (RAG + web always searches once a question)."""
        out = {"plain RAG": _point(self.rag_correct, self.rag_abstained, self.rag_tokens, web=0.0)}
        if self.web_correct is not None and self.web_abstained is not None:
            out["RAG + web always"] = _point(self.web_correct, self.web_abstained, self.web_tokens, web=1.0)
        return out


def _metric(correct: np.ndarray, abstained: np.ndarray, metric: str) -> np.ndarray:
    """Per question (and action): 1/0 for accuracy, or the truthfulness score."""
    return correct.astype(float) if metric == "accuracy" else truthfulness_scores(correct, abstained)


def _point(
    correct: np.ndarray, abstained: np.ndarray, tokens: np.ndarray | None, *, web: float
) -> dict[str, float]:
    point = {
        "accuracy": float(correct.mean()) if len(correct) else 0.0,
        "truthfulness": float(truthfulness_scores(correct, abstained).mean()) if len(correct) else 0.0,
        "web": web,
        "requests": 1.0,  # one answer from the top-k passages (and results)
    }
    if tokens is not None and len(tokens):
        point["tokens"] = float(tokens.mean())
    return point


@dataclass(frozen=True)
class FrontierPoint:
    """One pair of thresholds and what it gives per question on average."""

    lower: float
    upper: float
    accuracy: float
    truthfulness: float
    web: float
    """Web searches per question the routes make."""
    requests: float
    """LM requests per question (cache hits included), grading and refinement too."""
    tokens: float
    """LM tokens (prompt and completion) per question those requests cost."""
    correct: float
    ambiguous: float
    incorrect: float
    """The action mix: the share of questions routed CORRECT / AMBIGUOUS / INCORRECT."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def frontier_points(table: RouteTable) -> list[FrontierPoint]:
    """Every distinct outcome over the (lower, upper) plane: one point per pair of breakpoint cells
    (:func:`~optimize.threshold_search.cell_midpoints`), duplicates (same accuracy, truthfulness, web,
    requests and tokens) dropped, keeping the first pair in grid order."""
    points = cell_midpoints(table.breakpoints())
    grids = {
        "accuracy": value_grid(table, points, table.correct.astype(float)),
        "truthfulness": value_grid(table, points, table.scores),
        "web": value_grid(table, points, table.web),
        "requests": value_grid(table, points, table.requests),
        "tokens": value_grid(table, points, table.tokens),
        **{
            action.value.lower(): value_grid(table, points, np.eye(3)[k][None, :].repeat(len(table), 0))
            for k, action in enumerate(ACTIONS)
        },
    }
    seen: set[tuple[float, ...]] = set()
    out = []
    for i, lower in enumerate(points):
        for j in range(i, len(points)):
            values = {name: float(grid[i, j]) for name, grid in grids.items()}
            key = tuple(
                round(values[k], 9) for k in ("accuracy", "truthfulness", "web", "requests", "tokens")
            )
            if key in seen:
                continue
            seen.add(key)
            out.append(FrontierPoint(float(lower), float(points[j]), **values))
    return out


def pareto(
    points: Sequence[FrontierPoint], quality: str = "accuracy", cost: str = "web"
) -> list[FrontierPoint]:
    """The points no other point beats on ``quality`` at no more ``cost``, cheapest first: the best
    ``quality`` each budget of ``cost`` can buy."""
    front: list[FrontierPoint] = []
    best = -np.inf
    for p in sorted(points, key=lambda p: (getattr(p, cost), -getattr(p, quality))):
        if getattr(p, quality) > best + 1e-12:
            front.append(p)
            best = getattr(p, quality)
    return front


@dataclass(frozen=True)
class Estimate:
    """A value measured on the questions, with its 95% percentile bootstrap interval."""

    value: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _bootstrap(statistic, n: int, resamples: int, seed: int) -> Estimate:
    """``statistic(index)`` on all questions, and its percentile interval over resampled questions."""
    value = statistic(np.arange(n))
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = np.array([statistic(rng.integers(0, n, n)) for _ in range(resamples)])
    low, high = np.quantile(draws, [0.025, 0.975])
    return Estimate(float(value), float(low), float(high))


def routing_lift(
    table: RouteTable,
    baselines: Baselines,
    lower: float,
    upper: float,
    *,
    metric: str = "accuracy",
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Estimate:
    """CRAG's ``metric`` (accuracy or truthfulness) at (lower, upper) minus what a router with no
    information reaches at the same web share: the line from plain RAG (no search) to RAG + web always
    (every question searched). Without web search configured the line is plain RAG itself."""
    crag = table.at(_metric(table.correct, table.abstained, metric), lower, upper)
    rag = _metric(baselines.rag_correct, baselines.rag_abstained, metric)
    always = None
    if baselines.web_correct is not None and baselines.web_abstained is not None:
        always = _metric(baselines.web_correct, baselines.web_abstained, metric)
    web = np.minimum(table.at(table.web, lower, upper), 1.0)  # a share of questions searched

    def lift(index: np.ndarray) -> float:
        share = float(web[index].mean())
        line = (
            rag[index].mean()
            if always is None
            else (1 - share) * rag[index].mean() + share * always[index].mean()
        )
        return float(crag[index].mean() - line)

    return _bootstrap(lift, len(table), resamples, seed)


def oracle_headroom(
    table: RouteTable,
    lower: float,
    upper: float,
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[Estimate, Estimate]:
    """(oracle accuracy, headroom): the share of questions some action answers right (the best any
    evaluator could route these answers), and that minus the accuracy at (lower, upper)."""
    oracle = table.correct.any(axis=1).astype(float)
    at = table.correct_at(lower, upper).astype(float)
    return (
        _bootstrap(lambda i: float(oracle[i].mean()), len(table), resamples, seed),
        _bootstrap(lambda i: float(oracle[i].mean() - at[i].mean()), len(table), resamples, seed),
    )


def frontier_summary(
    table: RouteTable,
    baselines: Baselines,
    at: tuple[float, float],
    *,
    defaults: tuple[float, float] | None = None,
    resamples: int = RESAMPLES,
) -> dict:
    """Everything a report says about routing, as plain data: every distinct point of the threshold
    plane, the accuracy and truthfulness frontiers against web searches, LM requests and LM tokens per
    question, the baselines, the point ``at`` (the
    program's thresholds; ``defaults`` too when they differ) with its routing lift on both metrics and
    the oracle headroom."""

    def described(pair: tuple[float, float]) -> dict:
        lower, upper = pair
        actions = table.actions(lower, upper)
        oracle, headroom = oracle_headroom(table, lower, upper, resamples=resamples)
        return {
            "lower": lower,
            "upper": upper,
            "accuracy": table.accuracy(lower, upper),
            "truthfulness": float(table.at(table.scores, lower, upper).mean()),
            "web": float(table.at(table.web, lower, upper).mean()),
            "requests": table.requests_at(lower, upper),
            "tokens": float(table.at(table.tokens, lower, upper).mean()) if len(table) else 0.0,
            "actions": {a.value: int((actions == k).sum()) for k, a in enumerate(ACTIONS)},
            "lift": routing_lift(table, baselines, lower, upper, resamples=resamples).as_dict(),
            "truthfulness_lift": routing_lift(
                table, baselines, lower, upper, metric="truthfulness", resamples=resamples
            ).as_dict(),
            "oracle": oracle.as_dict(),
            "headroom": headroom.as_dict(),
        }

    points = frontier_points(table)
    summary = {
        "questions": len(table),
        "points": [p.as_dict() for p in points],
        "accuracy_frontier": [p.as_dict() for p in pareto(points, "accuracy", "web")],
        "truthfulness_frontier": [p.as_dict() for p in pareto(points, "truthfulness", "web")],
        "accuracy_requests_frontier": [p.as_dict() for p in pareto(points, "accuracy", "requests")],
        "truthfulness_requests_frontier": [p.as_dict() for p in pareto(points, "truthfulness", "requests")],
        "accuracy_tokens_frontier": [p.as_dict() for p in pareto(points, "accuracy", "tokens")],
        "truthfulness_tokens_frontier": [p.as_dict() for p in pareto(points, "truthfulness", "tokens")],
        "baselines": baselines.points(),
        "at": described(at),
    }
    if defaults is not None and tuple(defaults) != tuple(at):
        summary["defaults"] = described(defaults)
    return summary


COLLAPSE_SHARE = 0.9
"""A routing that sends at least this share of the questions to one action has collapsed to it."""


def collapse(actions: dict[str, int], share: float = COLLAPSE_SHARE) -> str | None:
    """A warning when one action takes nearly every question (``actions``: questions per action): the
    thresholds then choose nothing, and CRAG is that action with a grader's cost on top. None when the
    routing is mixed."""
    total = sum(actions.values())
    if not total:
        return None
    action, count = max(actions.items(), key=lambda item: item[1])
    if count / total < share:
        return None
    return (
        f"routing collapsed: {count} of {total} questions go {action}, so the thresholds choose nothing "
        f"and CRAG is 'always {action}' plus grading; see where the grades fall against (lower, upper) "
        "and whether the other actions' points on the frontier do better"
    )
