"""Joint (lower, upper) threshold tuning with Optuna over cached per-question results.

The thresholds only choose among three actions, so each validation question is graded once and each
action's answer generated at most once (:func:`precompute_routes`); a trial then re-routes the cached
results and makes no LM call at all. Only the cells between observed grades matter
(:mod:`optimize.threshold_search`), so an Optuna study with one trial per valid pair of cells
(:class:`BreakpointGridSampler`) finds the optimum exactly, and tuned thresholds ship only when they beat
the defaults beyond noise: out-of-fold on the val questions, by an exact McNemar test
(``python benchmarks/thresholds.py`` times it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from crag_dspy.domain import QAPair
from crag_dspy.faults import CRAGRunError, describe_error, raise_if_lm_down
from crag_dspy.module import CRAG
from crag_dspy.routing import DEFAULT_THRESHOLDS, Action, decide_action, question_type
from crag_dspy.stages import SearchWeb, pieces_of
from crag_dspy.trace import StageUsage

from .metrics import answer_matches, beats_beyond_noise, is_abstention, sign_test, wilson_interval
from .parallel import map_questions
from .shared_work import SharedWork
from .threshold_search import (
    ACCURACY,
    Objective,
    RouteTable,
    ThresholdChoice,
    accuracy_grid,
    cell_midpoints,
    choose_thresholds,
    cross_validated_correct,
)

__all__ = [
    "BreakpointGridSampler",
    "QuestionRoutes",
    "TuningResult",
    "accuracy_landscape",
    "defaults_on_scale",
    "grid_cells",
    "precompute_routes",
    "route_accuracy",
    "route_requests",
    "route_table",
    "routes_fingerprint",
    "tune_thresholds",
]

log = logging.getLogger(__name__)


@dataclass
class QuestionRoutes:
    """One question's grades and, for each action, its answer, whether that answer is right, and what
    the question costs at run time when routed there (grading included): LM requests, web searches
    and LM tokens (both counted for cache hits too, :class:`~optimize.cost.Cost`)."""

    question_id: str
    scores: list[float | None]
    answers: dict[str, str]
    correct: dict[str, bool]
    requests: dict[str, int] = field(default_factory=dict)
    question_type: str = "other"
    error: str | None = None
    """Why the question failed (it is then wrong on every route), or None."""
    web: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def abstained(self) -> dict[str, bool]:
        """Per action, whether its answer is "I don't know"."""
        return {a: is_abstention(answer) for a, answer in self.answers.items()}

    def action(self, lower: float, upper: float) -> str:
        return decide_action(self.scores, lower, upper).value

    def is_correct(self, lower: float, upper: float) -> bool:
        return self.correct[self.action(lower, upper)]


def precompute_routes(
    crag: CRAG,
    questions: Sequence[QAPair],
    *,
    progress: bool = True,
    work: SharedWork | None = None,
    num_threads: int = 1,
    correct: Callable[[QAPair, str], bool] | None = None,
) -> tuple[list[QuestionRoutes], StageUsage]:
    """Grade each question once and answer it once per distinct action context; count the LM usage.

    Each question is three forwards with a forced action over one shared stage cache: internal and
    external knowledge do not depend on the thresholds (see ``stages.RefineInternal``), so CORRECT uses
    k_in, INCORRECT k_ex (k_in when the web gave nothing, as at run time) and AMBIGUOUS both, and
    actions whose contexts coincide share one answer. Each
    route also records what it would cost alone at run time, in LM requests (cache hits included, so
    the count does not depend on what is cached). Pass ``work`` to share pieces with other
    computations; the usage returned is what this call added. ``num_threads`` questions are routed at
    a time (:func:`~optimize.parallel.map_questions`), with the same routes as one by one.
    ``correct(question, answer)`` says whether an answer is right (default: it matches a gold alias,
    :func:`~optimize.metrics.answer_matches`); questions need ``id``, ``question`` and ``answers``.
    """
    correct = correct or (lambda q, answer: answer_matches(answer, q.answers))
    work = work if work is not None else SharedWork()
    before = work.total()

    def route(q: QAPair) -> QuestionRoutes:
        raise_if_lm_down()
        answers, requests, web, tokens, scores, error = {}, {}, {}, {}, [], None
        try:
            for action in Action:
                # Each action's standalone cost: the pieces it needs, shared or not (grading included).
                with work.consumer(action.value) as used:
                    prediction = crag(question=q.question, action=action, cache=work, witness=False)
                answers[action.value] = prediction.answer
                cost = work.cost(used)
                requests[action.value] = cost.requests
                tokens[action.value] = cost.tokens
                web[action.value] = pieces_of(used, SearchWeb)
            scores = [grade.score for grade in prediction.trace.documents]
        except CRAGRunError as exc:
            raise_if_lm_down()  # an LM that is down is no wrong answer: the run stops
            # A question the LM or store failed on is wrong under every threshold; tuning goes on.
            error = describe_error(exc)
            log.warning("question %s failed, counted as wrong on every route: %s", q.id, error)
            scores, answers, requests, web, tokens = [], {action.value: "" for action in Action}, {}, {}, {}
        return QuestionRoutes(
            q.id,
            scores,
            answers,
            {a: correct(q, ans) for a, ans in answers.items()},
            requests,
            question_type(q.question),
            error,
            web,
            tokens,
        )

    routes = map_questions(route, questions, num_threads=num_threads, desc="routes", progress=progress)
    return routes, work.total().minus(before).usage


def routes_fingerprint(routes: Sequence[QuestionRoutes]) -> str:
    """A short hash of everything a trial's score depends on (each question's grades and which
    actions answer it correctly)."""
    payload = json.dumps(
        [[r.question_id, r.scores, sorted(r.correct.items())] for r in routes], separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def route_table(routes: Sequence[QuestionRoutes]) -> RouteTable:
    """The routes as arrays for the exact search (:mod:`optimize.threshold_search`)."""
    return RouteTable.build(
        [r.scores for r in routes],
        [r.correct for r in routes],
        [r.requests for r in routes],
        abstained=[r.abstained for r in routes],
        web=[r.web for r in routes],
        tokens=[r.tokens for r in routes],
    )


def route_accuracy(routes: Sequence[QuestionRoutes], lower: float, upper: float) -> float:
    """Answer accuracy if every question were routed with (lower, upper): pure, no LM."""
    return sum(r.is_correct(lower, upper) for r in routes) / len(routes) if routes else 0.0


def route_requests(routes: Sequence[QuestionRoutes], lower: float, upper: float) -> float:
    """Mean LM requests per question if every question were routed with (lower, upper): pure, no LM.

    Questions without recorded costs count 0, so routes without costs leave the tie-break to the band.
    """
    if not routes:
        return 0.0
    return sum(r.requests.get(r.action(lower, upper), 0) for r in routes) / len(routes)


PARAMETERS = ("lower", "upper")
"""The grid study's parameters, in the order a trial suggests them."""


def grid_cells(points: Sequence[float]) -> list[tuple[float, float]]:
    """The valid (lower <= upper) pairs of breakpoint cells' points, row by row: one trial each."""
    return [(lo, up) for i, lo in enumerate(points) for up in points[i:]]


class BreakpointGridSampler(optuna.samplers.BaseSampler):
    """Gives each trial of a study the next (lower, upper) pair of ``cells``, O(1) per trial.

    Optuna's ``GridSampler`` rescans every trial of the study after each trial (O(n^2) over a grid of n
    points: ~10 points/s on a 3,600-point grid here) and takes only full products, half of which would
    be invalid pairs here. This one needs only the sampler interface: the study runs one trial per
    cell, in order, and which cells a resumed study still lacks is the caller's to say.
    """

    def __init__(self, cells: Sequence[tuple[float, float]]) -> None:
        self._cells = iter(cells)
        self._cell: dict[str, float] = {}

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}  # nothing is sampled jointly: each trial's pair is given

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        cell = next(self._cells, None)
        if cell is None:
            raise ValueError(f"trial {trial.number} is past the last cell of the grid")
        self._cell = dict(zip(PARAMETERS, cell, strict=True))

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> float:
        return self._cell[param_name]


@dataclass
class TuningResult:
    """What the threshold stage found and what it ships (``lower``/``upper``, maybe per question type)."""

    lower: float
    upper: float
    accuracy: float
    """Val accuracy of what ships."""
    shipped: str
    """``"tuned"``, ``"defaults"`` or ``"per type"``; why is in ``reason``."""
    reason: str
    tuned_lower: float
    tuned_upper: float
    tuned_accuracy: float
    tuned_interval: tuple[float, float]
    tie_rule: str
    depth: float
    tied_fraction: float
    default_accuracy: float
    default_interval: tuple[float, float]
    cross_validation: dict[str, Any]
    grid_points: int
    trials: int
    seconds: float
    trials_per_second: float
    study_name: str
    storage: str | None
    by_type: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_type: dict[str, Any] = field(default_factory=dict)
    requests_per_question: float = 0.0
    default_requests_per_question: float = 0.0
    persist_seconds: float = 0.0
    objective: str = "accuracy"
    """What the search maximised (:class:`~optimize.threshold_search.Objective`'s label)."""
    objective_value: float = 0.0
    default_objective_value: float = 0.0
    web_per_question: float = 0.0
    """Web searches per val question the routes of what ships make (and the defaults')."""
    default_web_per_question: float = 0.0
    default_lower: float = DEFAULT_THRESHOLDS[0]
    default_upper: float = DEFAULT_THRESHOLDS[1]
    """The defaults compared against, on the grader's scale (:func:`defaults_on_scale`)."""

    def as_dict(self) -> dict:
        return asdict(self)


def defaults_on_scale(
    grader: Any, default: tuple[float, float] = DEFAULT_THRESHOLDS
) -> tuple[tuple[float, float], str]:
    """The default thresholds on ``grader``'s scale of grades, and a sentence saying how.

    The defaults were chosen on the LLM judge's own P(yes). A compiled calibration of that P(yes) alone
    is monotone, so the defaults carried through it, ``(c(lower), c(upper))``, route every question as
    the uncalibrated judge routes it with the defaults: a calibration by itself then moves no question
    to another action (left as they were, grades squeezed between them by a calibration would send every
    question AMBIGUOUS by accident). A routing that differs is the threshold search's, shipped only
    beyond noise, collapse warning included. A calibration that weighs lexical evidence, a trained
    evaluator or a fused grade has no such map: the defaults stay as they are, and the sentence says so.
    """
    calibration = getattr(grader, "calibration", None)
    if calibration is None or calibration.is_identity:
        return default, "the grader reports the LLM judge's own P(yes): the defaults as they are"
    if calibration.uses_evidence:
        return default, (
            "the grader's calibration weighs lexical evidence, so no map carries the defaults to its "
            "scale: the defaults as they are"
        )
    lower, upper = (round(calibration(t), 6) for t in default)
    return (lower, upper), (
        f"the defaults {default[0]}/{default[1]} on P(yes), carried through the grader's calibration to "
        f"{lower:.3f}/{upper:.3f}: every question routed as by the uncalibrated judge"
    )


def _journal_study(path: Path, study_name: str) -> optuna.Study:
    """The study ``study_name`` of the journal file at ``path`` (what ``optuna-dashboard`` reads), made
    if the file or the study is not there yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(path)))
    return optuna.create_study(
        study_name=study_name, storage=storage, load_if_exists=True, direction="maximize"
    )


INFEASIBLE = -2.0
"""A trial's value for thresholds over the web budget: below any feasible value (scores are >= -1)."""


def _grid_study(
    table: RouteTable,
    points: Sequence[float],
    storage: Path | None,
    study_name: str,
    objective: Objective = ACCURACY,
) -> tuple[float, int, float, float]:
    """Evaluate every valid (lower, upper) grid point in an Optuna study (resumed from ``storage``:
    the pairs it holds are not run again); returns the best accuracy, the trials run now, and the
    seconds spent running and saving them.

    The trials run in memory and are then added to the journal: a study run on the journal itself
    writes and syncs each trial's every operation to disk, ~65 trials/s here."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = _journal_study(storage, study_name) if storage else None
    complete = (TrialState.COMPLETE,)
    stored = journal.get_trials(deepcopy=False, states=complete) if journal is not None else []
    done = {tuple(t.params[name] for name in PARAMETERS) for t in stored}
    cells = [cell for cell in grid_cells([float(p) for p in points]) if cell not in done]
    study = optuna.create_study(direction="maximize", sampler=BreakpointGridSampler(cells))

    def score(trial: optuna.Trial) -> float:
        pair = [trial.suggest_float(name, 0.0, 1.0) for name in PARAMETERS]
        return objective.value(table, *pair) if objective.feasible(table, *pair) else INFEASIBLE

    started = time.perf_counter()
    if cells:
        study.optimize(score, n_trials=len(cells))
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    ran = study.get_trials(deepcopy=False, states=complete)
    if journal is not None and ran:
        journal.add_trials(ran)
    best = max(t.value for t in [*stored, *ran])
    return best, len(ran), seconds, time.perf_counter() - started


MIN_TYPE_QUESTIONS = 12
"""A question type gets thresholds of its own only with this many val questions; others use the pair."""


def _per_type(
    table: RouteTable, types: Sequence[str], index: Any, fallback: tuple[float, float]
) -> dict[str, tuple[float, float]]:
    """Thresholds per question type, tuned on the questions ``index`` (types with too few keep
    ``fallback``, which is also each type's preferred tie: a type moves only when it gains)."""
    chosen: dict[str, tuple[float, float]] = {}
    for kind in sorted({types[i] for i in index}):
        members = [i for i in index if types[i] == kind]
        if len(members) >= MIN_TYPE_QUESTIONS:
            c = choose_thresholds(table.subset(members), fallback)
            if (c.lower, c.upper) != fallback:
                chosen[kind] = (c.lower, c.upper)
    return chosen


def _bounds(
    types: Sequence[str],
    index: Sequence[int],
    pairs: dict[str, tuple[float, float]],
    fallback: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray]:
    """Each question's (lower, upper) as two arrays: its type's pair, else ``fallback``. RouteTable's
    routing broadcasts, so these route every question with its own pair in one pass."""
    chosen = np.array([pairs.get(types[i], fallback) for i in index], dtype=float).reshape(-1, 2)
    return chosen[:, 0], chosen[:, 1]


def _routed(table: RouteTable, types: Sequence[str], pairs: dict[str, tuple[float, float]], fallback):
    def correct(index) -> np.ndarray:
        index = list(index)
        return table.subset(index).correct_at(*_bounds(types, index, pairs, fallback))

    return correct


def tune_thresholds(
    routes: Sequence[QuestionRoutes],
    *,
    storage: Path | None = None,
    study_name: str = "crag-thresholds",
    default: tuple[float, float] = DEFAULT_THRESHOLDS,
    folds: int = 5,
    alpha: float = 0.05,
    seed: int = 0,
    by_type: bool = True,
    objective: Objective = ACCURACY,
) -> TuningResult:
    """Find the exact optimum of :func:`route_accuracy` over (lower, upper) and decide what ships.

    Every cell of the breakpoint grid is one trial of an Optuna study (``optuna-dashboard <storage>``
    shows it; a rerun resumes it); ties go by :func:`~optimize.threshold_search.choose_thresholds`.
    The optimum of a few dozen questions is partly luck, so the tuning *procedure* is measured
    out-of-fold (``folds``-fold cross-validation over the val questions) against the defaults with an
    exact McNemar test: tuned thresholds ship only at p < ``alpha`` and more questions right, else the
    defaults ship and the reason says so. With ``by_type``, thresholds per question type
    (:func:`~crag_dspy.routing.question_type`) are tuned the same way and ship only if they beat what
    ships without them, by the same test.
    """
    if not routes:
        raise ValueError("no validation questions to tune thresholds on")
    table = route_table(routes)
    breakpoints = table.breakpoints()
    points = cell_midpoints(breakpoints)
    best, ran, seconds, persist_seconds = _grid_study(table, points, storage, study_name, objective)
    choice: ThresholdChoice = choose_thresholds(table, default, objective)
    if abs(best - choice.accuracy) > 1e-9:  # two exact computations of one optimum must agree
        raise RuntimeError(f"grid study found {best}, the exact grid {choice.accuracy}")
    n = len(table)
    tuned = (choice.lower, choice.upper)
    defaults_right = table.correct_at(*default)

    def tune_global(index):
        try:
            c = choose_thresholds(table.subset(index), default, objective)
        except ValueError:  # these folds cannot meet the web budget: the whole val's choice does
            return tuned
        return c.lower, c.upper

    types = [r.question_type for r in routes]
    test_types = by_type and objective == ACCURACY and len(set(types)) > 1 and n >= 2 * folds
    # Two procedures are tested against what would ship without them: Bonferroni keeps the chance that
    # either ships on noise at most ``alpha``.
    alpha = alpha / 2 if test_types else alpha
    cv: dict[str, Any] = {"folds": folds, "alpha": alpha, "seed": seed}
    shipped, reason, pair = "defaults", "the defaults are among the optima on val", default
    reference = defaults_right
    over_budget = not objective.feasible(table, *default)
    if choice.rule != "defaults" and over_budget:
        shipped, pair = "tuned", tuned
        reason = (
            f"the defaults search the web for {table.at(table.web, *default).mean():.2f} of val questions, "
            f"over the budget {objective.web_budget:g}; the best thresholds within it ship"
        )
        reference = table.correct_at(*tuned)
    elif choice.rule != "defaults":
        if n < 2 * folds:
            reason = f"{n} val questions are too few to cross-validate the tuning; the defaults ship"
        elif objective.metric == "truthfulness":
            oof_scores = cross_validated_correct(
                table, tune_global, folds=folds, seed=seed, values=table.scores
            )
            test = sign_test(oof_scores, table.at(table.scores, *default))
            cv.update(tuned_out_of_fold=float(oof_scores.sum()), sign_test=test.as_dict(), questions=n)
            if test.p_value < alpha and test.wins > test.losses:
                shipped, pair = "tuned", tuned
                reason = (
                    f"tuning beat the defaults' truthfulness out-of-fold ({test.wins} better / "
                    f"{test.losses} worse of {n}, sign test p={test.p_value:.3f})"
                )
            else:
                reason = (
                    f"no measured gain in truthfulness: out-of-fold {test.wins} better / {test.losses} worse "
                    f"of {n} (sign test p={test.p_value:.3f}); the defaults ship"
                )
        else:
            oof = cross_validated_correct(table, tune_global, folds=folds, seed=seed)
            gain, p = beats_beyond_noise(oof, defaults_right, alpha)
            cv.update(tuned_out_of_fold=int(oof.sum()), defaults=int(defaults_right.sum()), p=p, questions=n)
            if gain:
                shipped, pair, reference = "tuned", tuned, oof
                reason = f"tuning beat the defaults out-of-fold ({oof.sum()} vs {defaults_right.sum()} of {n}, p={p:.3f})"
            else:
                reason = (
                    f"no measured gain: tuned out-of-fold {oof.sum()} vs defaults {defaults_right.sum()} of {n} "
                    f"right (McNemar p={p:.3f}); the defaults ship"
                )
    per_type: dict[str, Any] = {}
    pairs: dict[str, tuple[float, float]] = {}
    if test_types:
        candidate = _per_type(table, types, range(n), pair)
        per_type = {"candidate": {k: list(v) for k, v in candidate.items()}, "types": _counts(types)}
        if candidate:

            def tune_types(index):
                inner = tune_global(index) if shipped == "tuned" else default
                return _routed(table, types, _per_type(table, types, list(index), inner), inner)

            oof_types = cross_validated_correct(table, tune_types, folds=folds, seed=seed)
            gain, p = beats_beyond_noise(oof_types, reference, alpha)
            per_type.update(out_of_fold=int(oof_types.sum()), against=int(reference.sum()), p=p)
            if gain:
                pairs, shipped = candidate, "per type"
                reason += f"; per-type thresholds beat it out-of-fold ({oof_types.sum()} vs {reference.sum()}, p={p:.3f})"
            else:
                per_type["verdict"] = (
                    f"not shipped: out-of-fold {oof_types.sum()} vs {reference.sum()} of {n} (p={p:.3f})"
                )
        else:
            per_type["verdict"] = "no question type gained from thresholds of its own on val"
    right = _routed(table, types, pairs, pair)(range(n))
    shipped_bounds = _bounds(types, range(n), pairs, pair)
    return TuningResult(
        lower=pair[0],
        upper=pair[1],
        accuracy=float(right.mean()),
        shipped=shipped,
        reason=reason,
        tuned_lower=choice.lower,
        tuned_upper=choice.upper,
        tuned_accuracy=table.accuracy(*tuned),
        tuned_interval=wilson_interval(int(table.correct_at(*tuned).sum()), n),
        tie_rule=choice.rule,
        depth=choice.depth,
        tied_fraction=choice.tied_fraction,
        default_accuracy=float(defaults_right.mean()),
        default_interval=wilson_interval(int(defaults_right.sum()), n),
        cross_validation=cv,
        grid_points=choice.grid_points,
        trials=len(points) * (len(points) + 1) // 2,
        seconds=seconds,
        trials_per_second=ran / seconds if seconds and ran else float("nan"),
        study_name=study_name,
        storage=str(storage) if storage else None,
        by_type=pairs,
        per_type=per_type,
        requests_per_question=table.requests_at(*shipped_bounds),
        default_requests_per_question=table.requests_at(*default),
        persist_seconds=persist_seconds,
        objective=objective.label,
        objective_value=objective.value(table, *shipped_bounds),
        default_objective_value=objective.value(table, *default),
        web_per_question=float(table.at(table.web, *shipped_bounds).mean()),
        default_web_per_question=float(table.at(table.web, *default).mean()),
        default_lower=default[0],
        default_upper=default[1],
    )


def _counts(types: Sequence[str]) -> dict[str, int]:
    return {t: types.count(t) for t in sorted(set(types))}


def accuracy_landscape(
    routes: Sequence[QuestionRoutes], steps: int = 41
) -> tuple[list[float], list[list[float]]]:
    """Accuracy on a grid: grid[i][j] for lower = axis[i], upper = axis[j]; NaN where lower > upper."""
    axis = np.linspace(0.0, 1.0, steps)
    grid = accuracy_grid(route_table(routes), axis)
    return axis.tolist(), [[float(v) for v in row] for row in grid]
