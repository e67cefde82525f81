"""Joint (lower, upper) threshold tuning with Optuna over cached per-question results.

The thresholds only choose among three actions, so each validation question is graded once and each
action's answer generated at most once (:func:`precompute_routes`); a trial then re-routes the cached
results with the pure :func:`~crag_dspy.routing.decide_action` and makes no LM call at all.
"""

from __future__ import annotations

import logging
import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import optuna
from tqdm.auto import tqdm

from crag_dspy.domain import QAPair
from crag_dspy.faults import CRAGRunError
from crag_dspy.module import CRAG, knowledge_for
from crag_dspy.routing import Action, decide_action
from crag_dspy.strips import format_context
from crag_dspy.trace import StageUsage

from .metrics import answer_matches

__all__ = [
    "QuestionRoutes",
    "TuningResult",
    "accuracy_landscape",
    "precompute_routes",
    "route_accuracy",
    "routes_fingerprint",
    "tune_thresholds",
]

log = logging.getLogger(__name__)


@dataclass
class QuestionRoutes:
    """One question's grades and, for each action, its answer and whether that answer is right."""

    question_id: str
    scores: list[float | None]
    answers: dict[str, str]
    correct: dict[str, bool]

    def is_correct(self, lower: float, upper: float) -> bool:
        return self.correct[decide_action(self.scores, lower, upper).value]


def precompute_routes(
    crag: CRAG,
    questions: Sequence[QAPair],
    *,
    progress: bool = True,
) -> tuple[list[QuestionRoutes], StageUsage]:
    """Grade each question once and answer it once per distinct action context; count the LM usage.

    Internal and external knowledge do not depend on the thresholds (see ``CRAG.internal_knowledge``),
    so CORRECT uses k_in, INCORRECT k_ex (k_in when the web gave nothing, as at run time) and
    AMBIGUOUS both; actions whose contexts coincide share one answer.
    """
    routes, usage = [], StageUsage()
    for q in tqdm(questions, desc="routes", disable=not progress):
        run = crag.new_run(q.question)
        try:
            with crag.lm_scope(run.trace):
                passages, scores = crag.grade_documents(q.question, run)
                internal = crag.internal_knowledge(q.question, passages, scores, run)
                external = crag.external_knowledge(q.question, run)
                contexts = {action: knowledge_for(action, internal, external) for action in Action}
                # Actions whose contexts coincide (e.g. AMBIGUOUS when the web gave nothing) share one answer.
                by_context: dict[str, str] = {}
                answers = {}
                for action, (internal_part, external_part) in contexts.items():
                    key = format_context(internal_part, external_part)
                    if key not in by_context:
                        by_context[key] = crag.generate(q.question, internal_part, external_part, run)
                    answers[action.value] = by_context[key]
        except CRAGRunError as exc:
            # A question the LM or store failed on is wrong under every threshold; tuning goes on.
            log.warning("question %s failed, counted as wrong on every route: %s", q.id, exc)
            scores, answers = [], {action.value: "" for action in Action}
        usage = usage.add(run.trace.total_usage)
        routes.append(
            QuestionRoutes(
                q.id, scores, answers, {a: answer_matches(ans, q.answers) for a, ans in answers.items()}
            )
        )
    return routes, usage


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


def _upper(lower: float, gap: float) -> float:
    # Fixed-range reparametrisation: `upper` in [lower, 1] without a dynamic search space, so that
    # multivariate TPE models both parameters instead of falling back to random sampling.
    return lower + gap * (1.0 - lower)


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
    history: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def tune_thresholds(
    routes: Sequence[QuestionRoutes],
    *,
    trials: int = 2000,
    seed: int = 0,
    storage: Path | None = None,
    study_name: str = "crag-thresholds",
    default: tuple[float, float] = (0.3, 0.7),
) -> TuningResult:
    """Maximise :func:`route_accuracy` over (lower, upper) with seeded multivariate TPE.

    With ``storage`` the study lives in sqlite and a rerun resumes it (only the missing trials run).
    Ties in accuracy are broken toward the widest AMBIGUOUS band among the best trials, the choice the
    paper found most robust to grader mistakes.
    """
    if not routes:
        raise ValueError("no validation questions to tune thresholds on")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{storage}" if storage else None
    study = optuna.create_study(
        study_name=study_name,
        storage=url,
        load_if_exists=True,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True),
    )

    def objective(trial: optuna.Trial) -> float:
        lower = trial.suggest_float("lower", 0.0, 1.0)
        upper = _upper(lower, trial.suggest_float("gap", 0.0, 1.0))
        trial.set_user_attr("upper", upper)
        return route_accuracy(routes, lower, upper)

    remaining = max(0, trials - len(study.trials))
    started = time.perf_counter()
    if remaining:
        study.optimize(objective, n_trials=remaining)
    seconds = time.perf_counter() - started
    done = [t for t in study.trials if t.value is not None]
    best_value = max(t.value for t in done)
    best = max(
        (t for t in done if math.isclose(t.value, best_value)),
        key=lambda t: (t.user_attrs["upper"] - t.params["lower"], -t.number),
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
        storage=url,
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
