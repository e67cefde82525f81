"""Joint (lower, upper) threshold tuning with Optuna over cached per-question results.

The thresholds only choose among three actions, so each validation question is graded once and each
action's answer generated at most once (:func:`precompute_routes`); a trial then re-routes the cached
results with the pure :func:`~crag_dspy.routing.decide_action` and makes no LM call at all, so
thousands of trials run per second (``python benchmarks/optuna_trials.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalStorage
from optuna.trial import FrozenTrial, TrialState
from tqdm.auto import tqdm

from crag_dspy.domain import QAPair
from crag_dspy.faults import CRAGRunError
from crag_dspy.module import CRAG
from crag_dspy.routing import Action, decide_action
from crag_dspy.trace import StageUsage

from .metrics import answer_matches
from .shared_work import CRAGPieces, SharedWork

__all__ = [
    "SAMPLERS",
    "QuestionRoutes",
    "SobolSampler",
    "TuningResult",
    "accuracy_landscape",
    "precompute_routes",
    "route_accuracy",
    "route_requests",
    "routes_fingerprint",
    "tune_thresholds",
]

log = logging.getLogger(__name__)


@dataclass
class QuestionRoutes:
    """One question's grades and, for each action, its answer, whether that answer is right and how
    many LM requests the question costs at run time when routed there (grading included)."""

    question_id: str
    scores: list[float | None]
    answers: dict[str, str]
    correct: dict[str, bool]
    requests: dict[str, int] = field(default_factory=dict)

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
) -> tuple[list[QuestionRoutes], StageUsage]:
    """Grade each question once and answer it once per distinct action context; count the LM usage.

    Internal and external knowledge do not depend on the thresholds (see ``CRAG.internal_knowledge``),
    so CORRECT uses k_in, INCORRECT k_ex (k_in when the web gave nothing, as at run time) and
    AMBIGUOUS both; actions whose contexts coincide share one answer (:class:`CRAGPieces`). Each
    route also records what it would cost alone at run time, in LM requests (cache hits included, so
    the count does not depend on what is cached). Pass ``work`` to share pieces with other
    computations; the usage returned is what this call added.
    """
    work = work if work is not None else SharedWork()
    pieces = CRAGPieces(crag, work)
    before = work.total()
    routes = []
    for q in tqdm(questions, desc="routes", disable=not progress):
        answers, requests = {}, {}
        try:
            _, scores = pieces.documents(q.question)
            for action in Action:
                # Each action's standalone cost: the pieces it needs, shared or not (grading included).
                with work.consumer(action.value) as used:
                    pieces.documents(q.question)
                    answers[action.value] = pieces.route(q.question, action)
                requests[action.value] = work.cost(used).requests
        except CRAGRunError as exc:
            # A question the LM or store failed on is wrong under every threshold; tuning goes on.
            log.warning("question %s failed, counted as wrong on every route: %s", q.id, exc)
            scores, answers, requests = [], {action.value: "" for action in Action}, {}
        routes.append(
            QuestionRoutes(
                q.id,
                scores,
                answers,
                {a: answer_matches(ans, q.answers) for a, ans in answers.items()},
                requests,
            )
        )
    return routes, work.total().minus(before).usage


def routes_fingerprint(routes: Sequence[QuestionRoutes]) -> str:
    """A short hash of everything a trial's score depends on (each question's grades and which
    actions answer it correctly)."""
    payload = json.dumps(
        [[r.question_id, r.scores, sorted(r.correct.items())] for r in routes], separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


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


def _upper(lower: float, gap: float) -> float:
    # Fixed-range reparametrisation: `upper` in [lower, 1] without a dynamic search space, so that
    # every sampler (Sobol points, multivariate TPE) covers the valid triangle with both parameters.
    return lower + gap * (1.0 - lower)


class SobolSampler(optuna.samplers.BaseSampler):
    """Scrambled, seeded Sobol points: trial ``i`` takes point ``i``, so a resumed study continues the
    same sequence, at O(1) per trial.

    Route accuracy is a step function of (lower, upper) that costs microseconds to evaluate, so an even
    covering of the square is what the search needs. Optuna's TPE costs O(trials) per trial (7 ms on
    average over 2000 trials, 35x the objective) and its QMCSampler rescans the study every trial;
    ``python benchmarks/optuna_trials.py`` compares their speed and best accuracy (BENCHMARKS.md).
    """

    def __init__(self, params: Sequence[str], n: int, seed: int = 0):
        from scipy.stats import qmc

        self._index = {name: i for i, name in enumerate(params)}
        self._points = qmc.Sobol(len(params), scramble=True, seed=seed).random_base2(
            max(1, math.ceil(math.log2(max(n, 2))))
        )

    def infer_relative_search_space(self, study, trial) -> dict:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict:
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution) -> float:
        if trial.number >= len(self._points):
            raise ValueError(f"SobolSampler was built for {len(self._points)} trials, not {trial.number + 1}")
        u = float(self._points[trial.number][self._index[param_name]])
        return param_distribution.low + u * (param_distribution.high - param_distribution.low)


SAMPLERS = ("sobol", "tpe")


@dataclass
class TuningResult:
    lower: float
    upper: float
    accuracy: float
    trials: int
    seconds: float
    trials_per_second: float
    default_accuracy: float
    study_name: str
    storage: str | None
    sampler: str = "sobol"
    requests_per_question: float = 0.0
    default_requests_per_question: float = 0.0
    persist_seconds: float = 0.0
    history: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class _LogBuffer(BaseJournalBackend):
    """Journal operations held in memory, so that a finished study reaches its file in one write:
    Optuna's file backend syncs the disk after every operation, which costs more than a trial."""

    def __init__(self, logs: list[dict[str, Any]]):
        self.logs = logs

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        return self.logs[log_number_from:]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.logs.extend(logs)


def _stored_trials(storage: JournalStorage, study_name: str) -> list[FrozenTrial]:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # no such study in the journal yet
        return []
    return [t for t in study.trials if t.state == TrialState.COMPLETE]


def tune_thresholds(
    routes: Sequence[QuestionRoutes],
    *,
    trials: int = 2000,
    seed: int = 0,
    storage: Path | None = None,
    study_name: str = "crag-thresholds",
    default: tuple[float, float] = (0.3, 0.7),
    sampler: str = "sobol",
) -> TuningResult:
    """Maximise :func:`route_accuracy` over (lower, upper) with an Optuna study (no LM calls).

    ``sampler`` is ``"sobol"`` (:class:`SobolSampler`, thousands of trials per second) or ``"tpe"``
    (seeded multivariate TPE, ~35x slower at 2000 trials). With ``storage`` (an Optuna journal file,
    ``optuna-dashboard <file>`` shows it) a rerun resumes the study: only the missing trials run. The
    trials run in memory and are appended to the journal in one write at the end, because syncing every
    trial to disk as it finishes costs more than the trial itself; one process writes a study at a time.

    Accuracy on a few dozen questions is a step function with wide plateaus, so ties are common. They
    are broken toward the fewest LM requests per question (:func:`route_requests`: a question sent to
    the web costs a rewrite and strip judgements that CORRECT does not), then toward the widest
    AMBIGUOUS band, the action the paper found robust to grader mistakes.
    """
    if not routes:
        raise ValueError("no validation questions to tune thresholds on")
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose from {SAMPLERS}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if storage:
        storage.parent.mkdir(parents=True, exist_ok=True)
        file = JournalFileBackend(str(storage))
        buffer = _LogBuffer(list(file.read_logs(0)))
        written = len(buffer.logs)
        journal = JournalStorage(buffer)
    stored = _stored_trials(journal, study_name) if storage else []
    study = optuna.create_study(
        study_name=study_name,
        direction="maximize",
        sampler=SobolSampler(("lower", "gap"), max(trials, len(stored)), seed)
        if sampler == "sobol"
        else optuna.samplers.TPESampler(seed=seed, multivariate=True),
    )
    study.add_trials(stored)

    def objective(trial: optuna.Trial) -> float:
        lower = trial.suggest_float("lower", 0.0, 1.0)
        upper = _upper(lower, trial.suggest_float("gap", 0.0, 1.0))
        trial.set_user_attr("upper", upper)
        return route_accuracy(routes, lower, upper)

    remaining = max(0, trials - len(stored))
    started = time.perf_counter()
    if remaining:
        study.optimize(objective, n_trials=remaining)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    if storage and remaining:
        persistent = optuna.create_study(
            study_name=study_name, storage=journal, load_if_exists=True, direction="maximize"
        )
        persistent.add_trials(study.trials[len(stored) :])
        file.append_logs(buffer.logs[written:])
    persist_seconds = time.perf_counter() - started
    done = [t for t in study.trials if t.value is not None]
    best_value = max(t.value for t in done)
    best = min(
        (t for t in done if math.isclose(t.value, best_value)),
        key=lambda t: (
            round(route_requests(routes, t.params["lower"], t.user_attrs["upper"]), 9),
            t.params["lower"] - t.user_attrs["upper"],
            t.number,
        ),
    )
    return TuningResult(
        lower=best.params["lower"],
        upper=best.user_attrs["upper"],
        accuracy=best_value,
        trials=len(done),
        seconds=seconds,
        trials_per_second=remaining / seconds if seconds and remaining else float("nan"),
        default_accuracy=route_accuracy(routes, *default),
        study_name=study_name,
        requests_per_question=route_requests(routes, best.params["lower"], best.user_attrs["upper"]),
        default_requests_per_question=route_requests(routes, *default),
        storage=str(storage) if storage else None,
        sampler=sampler,
        persist_seconds=persist_seconds,
        history=[
            {"lower": t.params["lower"], "upper": t.user_attrs["upper"], "accuracy": t.value} for t in done
        ],
    )


def accuracy_landscape(
    routes: Sequence[QuestionRoutes], steps: int = 41
) -> tuple[list[float], list[list[float]]]:
    """Accuracy on a grid: grid[i][j] for lower = axis[i], upper = axis[j]; NaN where lower > upper."""
    axis = [i / (steps - 1) for i in range(steps)]
    grid = [[route_accuracy(routes, lo, up) if lo <= up else float("nan") for up in axis] for lo in axis]
    return axis, grid
