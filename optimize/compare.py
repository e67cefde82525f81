"""Two evaluation runs of one CRAG row, question by question: right / "I don't know" / wrong, accuracy and
truthfulness with their intervals, and the paired tests (exact McNemar on right/wrong, sign test on the
per-question truthfulness scores). For choosing a default: run ``python -m optimize.evaluate`` once per
setting on the same split, then compare.

    python -m optimize.compare runs/eval/owndocs-s1.json runs/eval/owndocs-s0.json
    python -m optimize.compare runs/eval/owndocs-s1.json --incorrect-abstains

``--incorrect-abstains`` compares a run with itself answering "I don't know" wherever its route was
INCORRECT (what CRAG would do without web search if it abstained instead of answering from the internal
knowledge the strip filter kept); ``--ungrounded-abstains`` wherever the grounding check found key
content of the answer in no kept strip (the rows' ``ungrounded``). Such a counterfactual needs no second
run: an abstention needs no LM call, and nothing after the answer depends on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .metrics import (
    mcnemar_exact,
    sign_test,
    truthfulness_score,
    truthfulness_summary,
    wilson_interval,
)

ROW = "CRAG (default thresholds)"


def rows_of(path: Path, variant: str) -> dict[str, dict[str, Any]]:
    report = json.loads(path.read_text())
    rows = {r["id"]: r for r in report["rows"] if r["variant"] == variant}
    if not rows:
        names = sorted({r["variant"] for r in report["rows"]})
        raise SystemExit(f"{path}: no rows of {variant!r} (rows: {', '.join(names)})")
    return rows


def abstaining_where(
    rows: dict[str, dict[str, Any]], when: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    """``rows`` answering "I don't know" wherever ``when(row)`` (right only when unanswerable)."""
    changed = {}
    for qid, row in rows.items():
        if when(row):
            correct = not row["answerable"]
            row = row | {"answer": "I don't know", "correct": correct, "abstained": True}
            row["score"] = truthfulness_score(correct, True)
        changed[qid] = row
    return changed


def abstaining_on_incorrect(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rows`` with every INCORRECT route answering "I don't know"."""
    return abstaining_where(rows, lambda row: row["action"] == "INCORRECT")


def abstaining_when_ungrounded(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``rows`` answering "I don't know" where the answer's key content is in no kept strip."""
    missing = [qid for qid, row in rows.items() if "ungrounded" not in row]
    if missing:
        raise SystemExit(f"rows without 'ungrounded' (evaluated before it was recorded): {missing[:3]}")
    return abstaining_where(rows, lambda row: bool(row["ungrounded"]))


def summary(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Right / "I don't know" / wrong counts (an unanswerable question answered "I don't know" is
    right, not an abstention here) and accuracy, with evaluate's truthfulness summary
    (:func:`~optimize.metrics.truthfulness_summary`)."""
    n = len(rows)
    right = sum(r["correct"] for r in rows.values())
    idk = sum(r["abstained"] and not r["correct"] for r in rows.values())
    return {
        "n": n,
        "right": right,
        "idk": idk,
        "wrong": n - right - idk,
        "accuracy": right / n,
        "accuracy_interval": wilson_interval(right, n),
    } | truthfulness_summary(list(rows.values()))


def compare(first: dict[str, dict[str, Any]], second: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ids = sorted(first.keys() & second.keys())
    if len(ids) != len(first) or len(ids) != len(second):
        print(f"note: compared on the {len(ids)} questions both runs answered", file=sys.stderr)
    a = {i: first[i] for i in ids}
    b = {i: second[i] for i in ids}
    test = sign_test([b[i]["score"] for i in ids], [a[i]["score"] for i in ids])
    return {
        "first": summary(a),
        "second": summary(b),
        "mcnemar_p": mcnemar_exact([b[i]["correct"] for i in ids], [a[i]["correct"] for i in ids]),
        "sign_test": test.as_dict(),
        "changed": [
            {
                "id": i,
                "first": a[i]["answer"],
                "second": b[i]["answer"],
                "delta": b[i]["score"] - a[i]["score"],
            }
            for i in ids
            if a[i]["score"] != b[i]["score"]
        ],
    }


def line(name: str, s: dict[str, Any]) -> str:
    lo, hi = s["accuracy_interval"]
    truth, wrong = s["truthfulness"], s["hallucination"]
    tlo, thi = truth["interval"]
    hlo, hhi = wrong["interval"]
    answerable, unanswerable = s["answerable_right"], s["unanswerable_abstained"]
    return (
        f"{name}: right {s['right']}/{s['n']} = {s['accuracy']:.1%} [{lo:.1%}, {hi:.1%}]; "
        f"I don't know {s['idk']}; wrong {s['wrong']} = {wrong['rate']:.1%} [{hlo:.1%}, {hhi:.1%}]; "
        f"answerable right {answerable['n']}/{answerable['of']}, "
        f"unanswerable abstained {unanswerable['n']}/{unanswerable['of']}; "
        f"truthfulness {truth['mean']:+.2f} [{tlo:+.2f}, {thi:+.2f}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path, nargs="?")
    parser.add_argument("--variant", default=ROW, help=f"the row to compare (default: {ROW!r})")
    parser.add_argument("--second-variant", help="the second run's row, when it has another name")
    counterfactual = parser.add_argument_group("counterfactuals of the first run (both may be given)")
    counterfactual.add_argument(
        "--incorrect-abstains", action="store_true", help="second = first abstaining on INCORRECT"
    )
    counterfactual.add_argument(
        "--ungrounded-abstains",
        action="store_true",
        help="second = first abstaining where the answer's key content is in no kept strip",
    )
    parser.add_argument("--out", type=Path, help="write the comparison as JSON")
    args = parser.parse_args(argv)
    first = rows_of(args.first, args.variant)
    if args.incorrect_abstains or args.ungrounded_abstains:
        second, changes = first, []
        if args.incorrect_abstains:
            second, changes = abstaining_on_incorrect(second), [*changes, "on INCORRECT"]
        if args.ungrounded_abstains:
            second, changes = abstaining_when_ungrounded(second), [*changes, "when ungrounded"]
        names = (args.first.stem, f"{args.first.stem} abstaining {' and '.join(changes)}")
    elif args.second is not None:
        second = rows_of(args.second, args.second_variant or args.variant)
        names = (args.first.stem, args.second.stem)
    else:
        parser.error("give a second run, or --incorrect-abstains / --ungrounded-abstains")
    result = compare(first, second)
    print(line(names[0], result["first"]))
    print(line(names[1], result["second"]))
    t = result["sign_test"]
    print(
        f"second vs first: McNemar p = {result['mcnemar_p']:.3f}; truthfulness wins/losses/ties "
        f"{t['wins']}/{t['losses']}/{t['ties']}, sign test p = {t['p_value']:.3f}"
    )
    for c in result["changed"]:
        print(f"  {c['id']}: {c['delta']:+d}  {c['first']!r} -> {c['second']!r}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=list))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
