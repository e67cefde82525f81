"""Threshold tuning: how fast the exact search runs, and which tie rule holds up on held-out questions.

Without ``--program`` (no model): on seeded synthetic validation sets (grades and per-action correctness
drawn like a small grader's), the grid points per second of the Optuna study over the breakpoint cells
(``optimize.thresholds.tune_thresholds``, in memory and saved to a journal file as the compile saves it),
the whole tuning call (grid, tie rule, out-of-fold noise check, per-type candidates), the LM calls it
made (a counting LM is configured: there must be none), and its optimum minus a brute-force scan of every
breakpoint pair with the product's routing rule; medians over ``--seeds`` sets.

With ``--program``: every val and test question's routes (its grades and each action's answer, computed
once with the program's grader and prompts; DSPy's cache serves what a compile or an evaluation already
asked), thresholds chosen on val by the defaults, by the shipped tie rule (``choose_thresholds``) and by
the cheapest routing among the optima, then scored on test: accuracy (Wilson 95% interval), LM requests
per question, and exact McNemar p-values between the rules.

    python benchmarks/thresholds.py
    python benchmarks/thresholds.py --program runs/default/program.json
    python benchmarks/thresholds.py --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev

Writes benchmarks/results/thresholds_synthetic.json, or thresholds_<domain>.json with ``--program``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dspy
import harness
import numpy as np
from tqdm.auto import tqdm

from optimize.datasets import qa_split
from optimize.metrics import mcnemar_exact
from optimize.shared_work import SharedWork
from optimize.threshold_search import RouteTable, accuracy_grid, cell_midpoints, choose_thresholds
from optimize.thresholds import (
    QuestionRoutes,
    precompute_routes,
    route_accuracy,
    route_table,
    tune_thresholds,
)

SCRIPT = "thresholds"

# --- grid throughput on synthetic routes ----------------------------------------------------------------


class CountingLM(dspy.BaseLM):
    """Counts requests and fails them: threshold tuning must make none."""

    def __init__(self) -> None:
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
        scores: list[float | None] = [
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


def brute_force_optimum(routes: list[QuestionRoutes]) -> float:
    """Route accuracy only changes where a threshold crosses a question's best known grade, so trying
    every such breakpoint (and just above it) finds the true maximum."""
    best = {max((s for s in r.scores if s is not None), default=0.0) for r in routes}
    values = sorted({0.0, 1.0} | best | {min(1.0, b + 1e-9) for b in best})
    return max(route_accuracy(routes, lo, up) for i, lo in enumerate(values) for up in values[i:])


def grid_throughput(questions: int, seeds: int) -> dict[str, Any]:
    """``{"summary": {storage: medians}, "runs": {storage: [one row per seed]}}``."""
    lm = CountingLM()
    tune_thresholds(synthetic_routes(10, 0))  # imports and first-call set-up are not trials
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp, dspy.context(lm=lm):
        for seed in tqdm(range(seeds), desc="synthetic sets"):
            routes = synthetic_routes(questions, seed)
            brute = brute_force_optimum(routes)
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
    summary = {}
    for name, rows in runs.items():
        median = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "shipped"}
        median["worst_optimum_minus_brute_force"] = min(r["optimum_minus_brute_force"] for r in rows)
        summary[name] = median
    return {"questions": questions, "seeds": seeds, "summary": summary, "runs": runs}


def report_grid(results: dict[str, Any]) -> None:
    print(f"{results['questions']} synthetic questions, {results['seeds']} seeds (medians)")
    print(
        f"{'':14} {'grid points':>11} {'points/s':>9} {'incl. save':>10} {'tuning s':>9} "
        f"{'LM calls':>9} {'opt - brute':>12}"
    )
    for name, m in results["summary"].items():
        print(
            f"{name:14} {m['grid_points']:11.0f} {m['grid_points_per_second']:9.0f} "
            f"{m['grid_points_per_second_including_save']:10.0f} {m['tuning_seconds']:9.2f} "
            f"{m['lm_calls']:9.0f} {m['worst_optimum_minus_brute_force']:12.4f}"
        )


# --- tie rules on a program's held-out questions -----------------------------------------------------------


def cheapest_first(table: RouteTable) -> tuple[float, float]:
    """Among the optimal cells, the fewest LM requests, then the widest AMBIGUOUS band."""
    points = cell_midpoints(table.breakpoints())
    grid = accuracy_grid(table, points)
    lo, up = np.nonzero(~np.isnan(grid) & np.isclose(grid, np.nanmax(grid)))
    pairs = [(float(points[i]), float(points[j])) for i, j in zip(lo, up, strict=True)]
    return min(pairs, key=lambda p: (round(table.requests_at(*p), 9), p[0] - p[1], p[0]))


def tie_rules(val: RouteTable, test: RouteTable, defaults: tuple[float, float]) -> dict[str, Any]:
    """Thresholds chosen on ``val`` by each rule, scored on ``test``; paired McNemar tests between them."""
    shipped = choose_thresholds(val, defaults)
    rules = {
        f"defaults {defaults[0]:g} / {defaults[1]:g}": defaults,
        f"shipped rule ({shipped.rule})": (shipped.lower, shipped.upper),
        "cheapest first": cheapest_first(val),
    }
    right = {name: test.correct_at(*pair) for name, pair in rules.items()}
    rows = []
    for name, (lower, upper) in rules.items():
        r = harness.rate(int(right[name].sum()), len(test))
        rows.append(
            {
                "rule": name,
                "lower": lower,
                "upper": upper,
                "val_accuracy": val.accuracy(lower, upper),
                "test_accuracy": r["rate"],
                "test_interval": r["interval"],
                "test_requests_per_question": test.requests_at(lower, upper),
            }
        )
    names = list(rules)
    paired = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            only_a, only_b = int((right[a] & ~right[b]).sum()), int((right[b] & ~right[a]).sum())
            paired.append(
                {"a": a, "b": b, "only_a": only_a, "only_b": only_b, "p": mcnemar_exact(right[a], right[b])}
            )
    return {
        "val_questions": len(val),
        "test_questions": len(test),
        "val_optimum": shipped.accuracy,
        "tied_fraction": shipped.tied_fraction,
        "grid_points": shipped.grid_points,
        "rows": rows,
        "paired": paired,
    }


def report_rules(results: dict[str, Any]) -> None:
    print(
        f"{results['domain']}: thresholds chosen on {results['val_questions']} val questions (optimum "
        f"{results['val_optimum']:.1%}, {results['tied_fraction']:.1%} of {results['grid_points']} cells tie), "
        f"scored on {results['test_questions']} test questions"
    )
    print(f"{'rule':30} {'lower':>6} {'upper':>6} {'val':>6} {'test [95% CI]':>22} {'LM req/q':>8}")
    for r in results["rows"]:
        low, high = r["test_interval"]
        print(
            f"{r['rule']:30} {r['lower']:6.3f} {r['upper']:6.3f} {r['val_accuracy']:6.1%} "
            f"{r['test_accuracy']:7.1%} [{low:.1%}, {high:.1%}] {r['test_requests_per_question']:8.2f}"
        )
    for pair in results["paired"]:
        verdict = (
            "no measured difference"
            if pair["p"] >= 0.05
            else ("a better" if pair["only_a"] > pair["only_b"] else "b better")
        )
        print(
            f"  {pair['a']} vs {pair['b']}: {pair['only_a']} / {pair['only_b']} right only by one, "
            f"McNemar p={pair['p']:.3f} ({verdict})"
        )


def main(argv: list[str] | None = None, *, lm: dspy.BaseLM | None = None) -> int:
    p = harness.parser(__doc__, program=True)
    p.add_argument("--questions", type=int, default=100, help="synthetic: questions per set (default 100)")
    p.add_argument("--seeds", type=int, default=3, help="synthetic: validation sets (default 3)")
    p.add_argument("--val-limit", type=int, help="with --program: N val questions (default: all)")
    p.add_argument("--test-limit", type=int, help="with --program: N test questions (default: all)")
    args = harness.parse(p, argv)
    if args.program is None:
        if args.questions < 1 or args.seeds < 1:
            p.error("--questions and --seeds must be at least 1")
        results = grid_throughput(args.questions, args.seeds)
        report_grid(results)
        harness.write_result(harness.result_path(args, SCRIPT, "synthetic"), SCRIPT, argv, results)
        return 0
    document = harness.read_document(args.program)
    settings = harness.settings_for(args, document)
    lm = harness.lm_for(settings, args, lm)
    crag, domain = harness.open_crag(settings, lm, document, args.program)
    work = SharedWork()  # each piece (grades, web results, answers) computed once for both splits
    val, _ = precompute_routes(crag, qa_split(domain, "val", args.val_limit), work=work)
    test, _ = precompute_routes(crag, qa_split(domain, "test", args.test_limit), work=work)
    if not val or not test:
        p.error(f"domain `{domain.name}` needs val and test questions")
    results = {"domain": domain.name, "program": str(args.program)}
    results |= tie_rules(route_table(val), route_table(test), (settings.config.lower, settings.config.upper))
    report_rules(results)
    harness.write_result(harness.result_path(args, SCRIPT, domain.name), SCRIPT, argv, results, lm=lm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
