"""Threshold tie rules on held-out questions: thresholds chosen on a program's QA-val routes by the
current rule (defaults if optimal, else the deepest optimal point, then cost) and by the previous one
(the cheapest routing among the optima, then the widest AMBIGUOUS band), both scored on the test
split's routes, with Wilson intervals and exact McNemar p-values against each other and the defaults.

    python benchmarks/tie_rules.py --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev
    python benchmarks/tie_rules.py --program runs/default/program.json [--val-limit N] [--test-limit N]

Every question's routes (its grades and each action's answer) are computed once with the program's
grader and prompts (DSPy's cache serves what the compile or an evaluation already asked); choosing and
scoring thresholds then makes no LM call.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from crag_dspy.app import load_program
from crag_dspy.cli import add_lm_arguments, add_storage_arguments, settings_from_args
from crag_dspy.domain import load_domain
from crag_dspy.lm import build_lm
from optimize.datasets import qa_split
from optimize.metrics import mcnemar_exact, wilson_interval
from optimize.shared_work import SharedWork
from optimize.threshold_search import RouteTable, accuracy_grid, cell_midpoints, choose_thresholds
from optimize.thresholds import precompute_routes, route_table

DEFAULTS = (0.3, 0.7)


def cheapest_first(table: RouteTable) -> tuple[float, float]:
    """The previous tie rule: among the optimal cells, the fewest LM requests, then the widest band."""
    points = cell_midpoints(table.breakpoints())
    grid = accuracy_grid(table, points)
    lo, up = np.nonzero(~np.isnan(grid) & np.isclose(grid, np.nanmax(grid)))
    pairs = [(float(points[i]), float(points[j])) for i, j in zip(lo, up, strict=True)]
    return min(pairs, key=lambda p: (round(table.requests_at(*p), 9), p[0] - p[1], p[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    parser.add_argument("--program", type=Path, required=True, help="compiled program JSON")
    parser.add_argument("--val-limit", type=int, help="N val questions (default: all)")
    parser.add_argument("--test-limit", type=int, help="N test questions (default: all)")
    parser.add_argument("--out", type=Path, help="write the numbers as JSON")
    args = parser.parse_args()
    settings = settings_from_args(args)
    domain = load_domain(settings.resolved_domain_dir)
    lm = build_lm(settings)
    crag = load_program(args.program, settings=settings, lm=lm)
    work = SharedWork()
    val, _ = precompute_routes(crag, qa_split(domain, "val", args.val_limit), work=work)
    test, _ = precompute_routes(crag, qa_split(domain, "test", args.test_limit), work=work)
    val_table, test_table = route_table(val), route_table(test)
    deepest = choose_thresholds(val_table, DEFAULTS)
    rules = {
        "defaults 0.3 / 0.7": DEFAULTS,
        f"current rule ({deepest.rule})": (deepest.lower, deepest.upper),
        "previous rule (cheapest first)": cheapest_first(val_table),
    }
    right = {name: test_table.correct_at(*pair) for name, pair in rules.items()}
    n = len(test_table)
    print(
        f"{domain.name}: thresholds chosen on {len(val_table)} val questions (optimum "
        f"{deepest.accuracy:.1%}, {deepest.tied_fraction:.1%} of {deepest.grid_points} cells tie), "
        f"scored on {n} test questions"
    )
    print(f"{'rule':34} {'lower':>6} {'upper':>6} {'val':>6} {'test [95% CI]':>22} {'LM req/q':>8}")
    rows = []
    for name, (lower, upper) in rules.items():
        low, high = wilson_interval(int(right[name].sum()), n)
        row = {
            "rule": name,
            "lower": lower,
            "upper": upper,
            "val_accuracy": val_table.accuracy(lower, upper),
            "test_accuracy": float(right[name].mean()),
            "test_interval": [low, high],
            "test_requests_per_question": test_table.requests_at(lower, upper),
        }
        rows.append(row)
        print(
            f"{name:34} {lower:6.3f} {upper:6.3f} {row['val_accuracy']:6.1%} "
            f"{row['test_accuracy']:7.1%} [{low:.1%}, {high:.1%}] {row['test_requests_per_question']:8.2f}"
        )
    names = list(rules)
    paired = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            p = mcnemar_exact(right[a], right[b])
            only_a, only_b = int((right[a] & ~right[b]).sum()), int((right[b] & ~right[a]).sum())
            paired.append({"a": a, "b": b, "only_a": only_a, "only_b": only_b, "p": p})
            verdict = (
                "no measured difference" if p >= 0.05 else ("a better" if only_a > only_b else "b better")
            )
            print(f"  {a} vs {b}: {only_a} / {only_b} right only by one, McNemar p={p:.3f} ({verdict})")
    if args.out:
        args.out.write_text(json.dumps({"domain": domain.name, "rows": rows, "paired": paired}, indent=2))


if __name__ == "__main__":
    main()
