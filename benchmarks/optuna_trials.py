"""Exact threshold search speed: grid points per second of the Optuna GridSampler study over the
breakpoints (in memory and saved to a journal file), LM calls per point, the whole tuning (exact
search, tie rule, out-of-fold noise check, per-type candidates), and the optimum checked against a
brute-force scan of every breakpoint pair with the product's routing rule.

    python benchmarks/optuna_trials.py [--questions 100] [--seeds 3] [--out results.json]

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

from optimize.thresholds import QuestionRoutes, route_accuracy, tune_thresholds


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
        kind = rng.choice(("person", "place", "other"))
        routes.append(QuestionRoutes(f"q{i}", scores, dict.fromkeys(correct, ""), correct, {}, kind))
    return routes


def exact_optimum(routes: list[QuestionRoutes]) -> float:
    """Route accuracy only changes where a threshold crosses a question's best known grade, so trying
    every such breakpoint (and just above it) finds the true maximum."""
    best = {max((s for s in r.scores if s is not None), default=0.0) for r in routes}
    values = sorted({0.0, 1.0} | best | {min(1.0, b + 1e-9) for b in best})
    return max(route_accuracy(routes, lo, up) for i, lo in enumerate(values) for up in values[i:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3, help="synthetic validation sets")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lm = CountingLM()
    tune_thresholds(synthetic_routes(10, 0))  # imports and first-call set-up are not trials
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm):
        for seed in range(args.seeds):
            routes = synthetic_routes(args.questions, seed)
            brute = exact_optimum(routes)
            for storage in (None, Path(tmp) / f"grid-{seed}.log"):
                before, started = lm.requests, time.perf_counter()
                result = tune_thresholds(routes, storage=storage, seed=seed)
                wall = time.perf_counter() - started
                runs.setdefault("journal file" if storage else "in memory", []).append(
                    {
                        "grid_points": result.trials,
                        "grid_points_per_second": result.trials_per_second,
                        "grid_points_per_second_including_save": result.trials
                        / (result.seconds + result.persist_seconds),
                        "tuning_seconds": wall,
                        "lm_calls": lm.requests - before,
                        "optimum_minus_brute_force": result.tuned_accuracy - brute,
                        "shipped": result.shipped,
                    }
                )
    print(f"{args.questions} questions, {args.seeds} seeds (median; Python {platform.python_version()})")
    print(
        f"{'':14} {'grid points':>11} {'points/s':>9} {'incl. save':>10} {'tuning s':>9} {'LM calls':>9} {'opt - brute':>12}"
    )
    summary = {}
    for name, rows in runs.items():
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "shipped"}
        median["worst_optimum_minus_brute_force"] = min(r["optimum_minus_brute_force"] for r in rows)
        summary[name] = median
        print(
            f"{name:14} {median['grid_points']:11.0f} {median['grid_points_per_second']:9.0f} "
            f"{median['grid_points_per_second_including_save']:10.0f} {median['tuning_seconds']:9.2f} "
            f"{median['lm_calls']:9.0f} {median['worst_optimum_minus_brute_force']:12.4f}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"questions": args.questions, "seeds": args.seeds, "summary": summary, "runs": runs}, indent=2
            )
        )


if __name__ == "__main__":
    main()
