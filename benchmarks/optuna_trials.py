"""Threshold tuning speed: Optuna trials per second and LM calls per trial on cached routes of a
100-question validation set, for each sampler, in memory and with the study saved to a journal file;
the best accuracy found against the exact optimum; and the previous implementation (TPE writing each
trial to sqlite) for comparison.

    python benchmarks/optuna_trials.py [--questions 100] [--trials 2000] [--seeds 3] [--out results.json]

The routes are synthetic (seeded): grades and per-action correctness drawn like a small grader's, so
the numbers need no model. Any LM request made during tuning would be counted: a counting LM is the
configured DSPy LM while trials run.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import dspy
import optuna

from optimize.thresholds import QuestionRoutes, _upper, route_accuracy, tune_thresholds


class CountingLM(dspy.BaseLM):
    """Counts requests; tuning must make none."""

    def __init__(self):
        super().__init__(model="counting/none")
        self.requests = 0

    def forward(self, prompt=None, messages=None, **kwargs):
        self.requests += 1
        raise RuntimeError("threshold tuning must not call the LM")


def synthetic_routes(n: int, seed: int) -> list[QuestionRoutes]:
    """Questions whose retrieval is relevant 60% of the time; grades like a fair logprob grader's."""
    rng = random.Random(seed)
    routes = []
    for i in range(n):
        relevant = rng.random() < 0.6
        scores = [
            rng.betavariate(5, 1.5) if relevant and j == 0 else rng.betavariate(1.2, 4) for j in range(5)
        ]
        if rng.random() < 0.05:
            scores[-1] = None  # a failed grade
        correct = {
            "CORRECT": relevant and rng.random() < 0.85,
            "AMBIGUOUS": rng.random() < (0.75 if relevant else 0.55),
            "INCORRECT": not relevant and rng.random() < 0.6,
        }
        routes.append(QuestionRoutes(f"q{i}", scores, dict.fromkeys(correct, ""), correct))
    return routes


def exact_optimum(routes: list[QuestionRoutes]) -> float:
    """Route accuracy only changes where a threshold crosses a question's best known grade, so trying
    every such breakpoint (and just above it) finds the true maximum."""
    best = {max((s for s in r.scores if s is not None), default=0.0) for r in routes}
    values = sorted({0.0, 1.0} | best | {min(1.0, b + 1e-9) for b in best})
    return max(route_accuracy(routes, lo, up) for i, lo in enumerate(values) for up in values[i:])


def previous_implementation(routes: list[QuestionRoutes], trials: int, seed: int, folder: Path) -> float:
    """Before this benchmark: multivariate TPE with every trial written to sqlite as it finished."""
    study = optuna.create_study(
        storage=f"sqlite:///{folder / 'previous.db'}",
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True),
    )

    def objective(trial: optuna.Trial) -> float:
        lower = trial.suggest_float("lower", 0.0, 1.0)
        return route_accuracy(routes, lower, _upper(lower, trial.suggest_float("gap", 0.0, 1.0)))

    started = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return trials / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3, help="synthetic validation sets (and sampler seeds)")
    parser.add_argument("--previous-trials", type=int, default=200, help="trials of the old sqlite+TPE path")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    lm = CountingLM()
    tune_thresholds(synthetic_routes(10, 0), trials=16)  # imports and first-call set-up are not trials
    tune_thresholds(synthetic_routes(10, 0), trials=16, sampler="tpe")
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm):
        folder = Path(tmp)
        for seed in range(args.seeds):
            routes = synthetic_routes(args.questions, seed)
            exact = exact_optimum(routes)
            for sampler in ("sobol", "tpe"):
                for storage in (None, folder / f"{sampler}-{seed}.log"):
                    before = lm.requests
                    started = time.perf_counter()
                    result = tune_thresholds(
                        routes, trials=args.trials, seed=seed, storage=storage, sampler=sampler
                    )
                    wall = time.perf_counter() - started
                    runs.setdefault(f"{sampler}, {'journal file' if storage else 'in memory'}", []).append(
                        {
                            "trials_per_second": result.trials_per_second,
                            "trials_per_second_including_save": args.trials / wall,
                            "save_seconds": result.persist_seconds,
                            "lm_calls_per_trial": (lm.requests - before) / args.trials,
                            "best": result.accuracy,
                            "exact": exact,
                        }
                    )
            runs.setdefault("previous: tpe, sqlite per trial", []).append(
                {"trials_per_second": previous_implementation(routes, args.previous_trials, seed, folder)}
            )

    print(
        f"{args.questions} questions, {args.trials} trials, {args.seeds} seeds "
        f"({platform.machine()}, Python {platform.python_version()}, optuna {optuna.__version__})"
    )
    print(f"{'':34} {'trials/s':>9} {'incl. save':>10} {'LM calls/trial':>15} {'best - exact':>13}")
    summary = {}
    for name, rows in runs.items():
        median = {
            key: statistics.median(r[key] for r in rows) for key in rows[0] if key not in ("best", "exact")
        }
        if "best" in rows[0]:
            median["worst_gap_to_exact"] = max(r["exact"] - r["best"] for r in rows)
        summary[name] = median
        print(
            f"{name:34} {median['trials_per_second']:9.0f} "
            f"{median.get('trials_per_second_including_save', float('nan')):10.0f} "
            f"{median.get('lm_calls_per_trial', float('nan')):15.1f} "
            f"{-median['worst_gap_to_exact'] if 'worst_gap_to_exact' in median else float('nan'):13.3f}"
        )
    default = summary["sobol, journal file"]
    old = summary["previous: tpe, sqlite per trial"]["trials_per_second"]
    print(
        f"default (sobol, journal file) vs previous implementation: "
        f"{default['trials_per_second_including_save'] / old:.0f}x the trials per second, saving included"
    )
    if args.out:
        record = {"args": vars(args) | {"out": str(args.out)}, "summary": summary, "runs": runs}
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
