"""Where does the compiled grader top out? Every kind of calibration, refitted on one set of LM answers.

``optimize.compile`` fits the grader's calibration, a logistic regression of the label on the model's
logit P(yes) and the lexical evidence of the whole passage, on 64 train pairs. Whether a compiled
grader could do better from the same model is a question about the data, not about one fit, so this
scores every train and val pair once with the uncompiled grader (one LM call each, from the DSPy
cache when it is there) and then, without the LM:

- refits the calibration with other calibrators: the shipped one (``linear C=1``), stronger and weaker
  regularisation, pairwise interactions (a degree-2 polynomial of the features), gradient-boosted trees;
- on ``--fits`` random balanced train samples of each ``--sizes`` (0 = every train pair, one fit);
- optionally with more LM signals as features (``--signals``; each is its own LM calls):
  ``null``, P(yes) of the question against a content-free document ("N/A"), once per question: the
  model's yes-bias for that question ("contextual calibration", Zhao et al. 2021); ``title``, P(yes)
  of the passage's title alone, once per passage: how much of the grade is the entity's name;

and prints the mean whole-split val accuracy of each, the best possible cut of the shipped fit's
scores, and the issue's target for the compiled grader (the uncompiled grader + 10 points).

    python benchmarks/grader_ceiling.py [--signals null,title] [--fits 20] [--sizes 64,128,0] [--out FILE]

The domain and LM are the CLI's (``--domain``, ``--lm``), the excerpt the settings' (as in
``benchmarks/grader_views.py``); a judgement that failed makes its pair unknown (wrong at every cut),
and the failures are counted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
import numpy as np
from grader_views import best_cut_accuracy, grader_and_pairs
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from crag_dspy.calibration import logit as _logit  # the shipped calibration's clipping of P(yes) = 0 or 1
from crag_dspy.evidence import FITTED_FEATURES, evidence_features
from crag_dspy.judging import BinaryJudge
from optimize.evaluation import judge_outcomes
from optimize.metrics import binary_report

SIGNALS = ("null", "title")
# The document of the "null" signal: no content, so P(yes) is what the question alone draws.
NULL_DOCUMENT = "N/A"

CALIBRATORS: dict[str, Callable[[], Any]] = {
    # The compile's own fit (crag_dspy.calibration.fit_calibration): standardised features, C=1.
    "linear C=1": lambda: make_pipeline(StandardScaler(), LogisticRegression(C=1.0)),
    "linear C=0.1": lambda: make_pipeline(StandardScaler(), LogisticRegression(C=0.1)),
    "linear C=10": lambda: make_pipeline(StandardScaler(), LogisticRegression(C=10.0)),
    "pairwise C=0.3": lambda: make_pipeline(
        StandardScaler(), PolynomialFeatures(2), StandardScaler(), LogisticRegression(C=0.3, max_iter=2000)
    ),
    "boosted trees": lambda: GradientBoostingClassifier(
        n_estimators=100, max_depth=2, learning_rate=0.05, random_state=0
    ),
}


def signal_scores(
    grader: BinaryJudge, examples: Sequence[dspy.Example], names: Sequence[str]
) -> tuple[list[dict[str, float | None]], int]:
    """Per example, the raw P(yes) of each extra signal in ``names`` (None when its judgement failed),
    and how many judgements failed. The signals are asked of the grader's prompt without its view."""
    unknown = sorted(set(names) - set(SIGNALS))
    if unknown:
        raise ValueError(f"unknown signals {unknown}; choose from {list(SIGNALS)}")
    bare = grader.deepcopy()
    bare.view = None
    failures = 0

    def ask(question: str, document: str) -> float | None:
        nonlocal failures
        judgement = bare(question=question, document=document).judgement
        failures += judgement.score_source == "error"
        return judgement.raw_score if judgement.score_source == "logprobs" else None

    per_example: list[dict[str, float | None]] = [{} for _ in examples]
    if "null" in names:
        null = {q: ask(q, NULL_DOCUMENT) for q in sorted({e.question for e in examples})}
        for row, e in zip(per_example, examples, strict=True):
            row["null"] = null[e.question]
    if "title" in names:
        for row, e in zip(per_example, examples, strict=True):
            row["title"] = ask(e.question, e.document.partition("\n")[0])
    return per_example, failures


def feature_rows(
    examples: Sequence[dspy.Example],
    raw: Sequence[float | None],
    signals: Sequence[Mapping[str, float | None]],
    names: Sequence[str],
) -> list[list[float] | None]:
    """The calibration's inputs per example: logit P(yes), the fitted evidence features and the logits of
    the signals ``names``; None where any LM score is unknown."""
    rows: list[list[float] | None] = []
    for e, p, extra in zip(examples, raw, signals, strict=True):
        scores = [p, *(extra[n] for n in names)]
        if any(s is None for s in scores):
            rows.append(None)
            continue
        evidence = evidence_features(e.question, e.document)
        rows.append([_logit(p), *(evidence[f] for f in FITTED_FEATURES), *(_logit(s) for s in scores[1:])])  # type: ignore[arg-type]
    return rows


def _val_scores(model: Any, rows: Sequence[list[float] | None]) -> list[float | None]:
    known = [r for r in rows if r is not None]
    probabilities = iter(model.predict_proba(np.array(known))[:, 1] if known else [])
    return [None if r is None else float(next(probabilities)) for r in rows]


def measure(
    train_rows: Sequence[list[float] | None],
    train_labels: Sequence[int],
    val_rows: Sequence[list[float] | None],
    val_labels: Sequence[int],
    *,
    sizes: Sequence[int],
    fits: int,
    seed: int,
    calibrators: Mapping[str, Callable[[], Any]] = CALIBRATORS,
) -> dict[str, dict[str, Any]]:
    """``{calibrator: {size: {"mean", "min", "max", "n", "best_cut_mean"}}}``: whole-split val accuracy of
    the calibrator fitted on ``fits`` random balanced train samples of each size (0 or a size at least the
    train split's: every known train example, one fit). Unknown val rows count as wrong."""
    known = [i for i, r in enumerate(train_rows) if r is not None]
    positives = [i for i in known if train_labels[i]]
    negatives = [i for i in known if not train_labels[i]]
    results: dict[str, dict[str, Any]] = {}
    for name, make in calibrators.items():
        rng = random.Random(seed)  # every calibrator is fitted on the same draws: a paired comparison
        results[name] = {}
        for size in sizes:
            half = size // 2
            whole = size <= 0 or half > min(len(positives), len(negatives))
            samples = (
                [known]
                if whole
                else [rng.sample(positives, half) + rng.sample(negatives, half) for _ in range(fits)]
            )
            accuracies, cuts = [], []
            for rows in samples:
                model = make().fit(np.array([train_rows[i] for i in rows]), [train_labels[i] for i in rows])
                scores = _val_scores(model, val_rows)
                accuracies.append(binary_report(scores, val_labels).accuracy)
                cuts.append(best_cut_accuracy(scores, val_labels))
            results[name]["all" if whole else str(size)] = {
                "n": len(samples),
                "mean": statistics.mean(accuracies),
                "min": min(accuracies),
                "max": max(accuracies),
                "best_cut_mean": statistics.mean(cuts),
            }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default=None, help="a bundled domain (default: the settings')")
    parser.add_argument("--lm", help="LM as in the CLI (default: the embedded model)")
    parser.add_argument(
        "--signals", default="", help=f"comma-separated extra LM signals: {', '.join(SIGNALS)} (default none)"
    )
    parser.add_argument("--fits", type=int, default=20, help="random train samples per size (default 20)")
    parser.add_argument(
        "--sizes", default="64,128,0", help="train sample sizes, 0 = every train pair (default 64,128,0)"
    )
    parser.add_argument("--calibration-pairs", type=int, default=64, help="the compile's own fit")
    parser.add_argument("--judge-val-limit", type=int, default=80, help="the compile's val sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.signals.split(",") if s.strip()]
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes takes comma-separated whole numbers, got {args.sizes!r}")
    if args.fits < 1:
        parser.error("--fits must be >= 1")

    domain, lm, grader, train, val, sample = grader_and_pairs(
        args.domain, args.lm, seed=args.seed, judge_val_limit=args.judge_val_limit
    )
    rows, labels, failed = {}, {}, 0
    with dspy.context(lm=lm):
        for split, examples in (("train", train), ("val", val)):
            outcomes = judge_outcomes(grader, examples, desc=f"grader {split}")
            raw = [o.raw_score if o.score_source == "logprobs" else None for o in outcomes]
            failed += sum(o.score_source == "error" for o in outcomes)
            extra, extra_failed = signal_scores(grader, examples, names)
            failed += extra_failed
            rows[split] = feature_rows(examples, raw, extra, names)
            labels[split] = [int(bool(e.relevant)) for e in examples]
            if split == "val":
                uncompiled = binary_report(raw, labels["val"])
                uncompiled_sample = binary_report(
                    [raw[i] for i in sample], [labels["val"][i] for i in sample]
                )

    first = [i for i in range(min(args.calibration_pairs, len(train))) if rows["train"][i] is not None]
    compile_fit = CALIBRATORS["linear C=1"]().fit(
        np.array([rows["train"][i] for i in first]), [labels["train"][i] for i in first]
    )
    compiled = _val_scores(compile_fit, rows["val"])
    results = measure(
        rows["train"],
        labels["train"],
        rows["val"],
        labels["val"],
        sizes=sizes,
        fits=args.fits,
        seed=args.seed,
    )
    target = uncompiled.accuracy + 0.10
    print(
        f"domain `{domain.name}`, LM {lm.model}, signals {names or 'none'}: {len(val)} val pairs, "
        f"{len(train)} train pairs; failed judgements {failed}"
    )
    print(
        f"uncompiled (P(yes) >= 0.5): {uncompiled.accuracy:.1%} on all val pairs (AUC {uncompiled.roc_auc:.3f}), "
        f"{uncompiled_sample.accuracy:.1%} on the compile's {len(sample)}-pair sample; target for the compiled "
        f"grader: >= {target:.1%}"
    )
    compiled_report = binary_report(compiled, labels["val"])
    compiled_cut = best_cut_accuracy(compiled, labels["val"])
    print(
        f"the compile's fit (first {args.calibration_pairs} train pairs, linear C=1): {compiled_report.accuracy:.1%} "
        f"(AUC {compiled_report.roc_auc:.3f}); best possible cut of its scores "
        f"{compiled_cut:.1%}"
    )
    columns = list(next(iter(results.values())))
    print(f"{'calibrator':<15} | " + " | ".join(f"{'train ' + c:>28}" for c in columns))
    for name, by_size in results.items():
        cells = []
        for c in columns:
            r = by_size[c]
            spread_text = f" ({r['min']:.1%}-{r['max']:.1%})" if r["n"] > 1 else ""
            cells.append(f"{r['mean']:.1%}{spread_text} cut {r['best_cut_mean']:.1%}")
        print(f"{name:<15} | " + " | ".join(f"{cell:>28}" for cell in cells))
    if args.out:
        payload = {
            "domain": domain.name,
            "lm": lm.model,
            "signals": names,
            "failed": failed,
            "uncompiled": {"whole": uncompiled.as_dict(), "sample": uncompiled_sample.as_dict()},
            "target": target,
            "compile_fit": {
                "whole": compiled_report.as_dict(),
                "best_cut_accuracy": compiled_cut,
            },
            "calibrators": results,
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
