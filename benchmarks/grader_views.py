"""Is a second look worth an LM call? The grader asked about a passage's best sentences one at a time.

The grader reads a passage's title and the one sentence that best matches the question
(``crag_dspy.focus``); when that sentence is the wrong one, the model says "no" to a passage that
holds the answer. This asks the uncompiled grader about each of the ``--views`` best sentences
separately (one LM call each; the instruction, question and title are a shared prompt prefix) and
scores a passage by the highest P(yes) among its first k views, for k = 1 .. ``--views``. For each
k it reports, on the val split:

- the uncompiled grader (that score >= 0.5): accuracy and ROC AUC;
- the compiled grader as ``optimize.compile`` fits it (P(yes) plus lexical evidence, on the first
  ``--calibration-pairs`` of the seeded, label-interleaved train pairs), on the compile's val sample
  (``--judge-val-limit``) and on the whole split;
- the mean and range of the whole-split accuracy over ``--fits`` calibrations fitted on random
  balanced train samples of the same size (how much of a compile's result is its draw);
- the accuracy of the best possible cut of the compiled score on the whole split: an upper bound of
  what any recalibration of those scores could reach.

    python benchmarks/grader_views.py [--views 3] [--fits 30] [--out FILE]

The domain and LM are the CLI's (``--domain``, ``--lm``), and so is the sentence choice
(``CRAG_GRADE_TERM_WEIGHT``, ``CRAG_GRADE_TERM_STEMS``); answers come from the DSPy disk cache when
they are there. A judgement that failed makes its passage's score unknown (a wrong answer), and the
number of failures is printed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy

from crag_dspy.calibration import Calibration, fit_calibration
from crag_dspy.domain import Domain, load_domain
from crag_dspy.evidence import evidence_features
from crag_dspy.focus import SentenceFocus
from crag_dspy.judging import BinaryJudge
from crag_dspy.lm import build_lm
from crag_dspy.module import CRAG
from crag_dspy.settings import Settings
from optimize.datasets import interleave_balanced, relevance_examples, spread
from optimize.evaluation import judge_outcomes
from optimize.metrics import binary_report


class _NoBackend:
    """The grader never retrieves or searches: any call here is a bug in this benchmark."""

    def retrieve(self, query: str, k: int):
        raise RuntimeError("grader_views.py does not retrieve")

    def search(self, query: str, max_results: int):
        raise RuntimeError("grader_views.py does not search the web")


class RankedSentenceView:
    """The judge's inputs with ``document`` cut to its title and its ``rank``-th best sentence (0 = the
    best, what the grader reads by default), ranked as :class:`~crag_dspy.focus.SentenceFocus` ranks."""

    def __init__(self, focus: SentenceFocus, rank: int):
        self.focus, self.rank = focus, rank

    def sentence(self, question: str, document: str) -> str | None:
        """The passage's title and its ``rank``-th best sentence; None when it has no such sentence."""
        return self.focus.ranked_excerpt(document, question, self.rank)

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        shown = self.sentence(str(inputs["question"]), str(inputs["document"]))
        if shown is None:
            raise ValueError(f"the passage has no sentence of rank {self.rank}")
        return {**inputs, "document": shown}


def view_scores(
    grader: BinaryJudge, examples: Sequence[dspy.Example], views: int, *, progress: bool = True
) -> tuple[list[list[float | None]], int]:
    """Per example, the raw P(yes) of each view the passage has (a failed judgement is None), and how
    many judgements failed. View 0 is the grader's own view, so its answers are the compile's."""
    if not isinstance(grader.view, SentenceFocus) or grader.view.sentences != 1:
        raise ValueError("the grader must read one sentence per passage (grade_sentences=1)")
    per_example: list[list[float | None]] = [[] for _ in examples]
    failures = 0
    for rank in range(views):
        judge = grader.deepcopy()
        if rank:
            judge.view = RankedSentenceView(grader.view, rank)
        indices = [
            i
            for i, e in enumerate(examples)
            if rank == 0 or judge.view.sentence(e.question, e.document) is not None
        ]
        outcomes = judge_outcomes(
            judge, [examples[i] for i in indices], desc=f"view {rank + 1}", progress=progress
        )
        for i, outcome in zip(indices, outcomes, strict=True):
            failures += outcome.score_source == "error"
            per_example[i].append(outcome.raw_score)
    return per_example, failures


def best_of(scores: Sequence[float | None], k: int) -> float | None:
    """The highest P(yes) among the first ``k`` views; unknown if any of them failed."""
    first = scores[:k]
    return None if any(s is None for s in first) else max(first)  # type: ignore[type-var]


def best_cut_accuracy(scores: Sequence[float | None], labels: Sequence[int]) -> float:
    """The accuracy of the best threshold on ``scores`` (unknown scores are wrong at every cut)."""
    by_score: dict[float, list[int]] = {}
    for s, y in zip(scores, labels, strict=True):
        if s is not None:
            by_score.setdefault(s, []).append(y)
    # Cut below everything: every known score says yes; then move the cut past one score at a time
    # (all examples with that score change sides together).
    correct = best = sum(sum(ys) for ys in by_score.values())
    for s in sorted(by_score):
        ys = by_score[s]
        correct += len(ys) - 2 * sum(ys)
        best = max(best, correct)
    return best / len(labels)


def _compiled(calibration: Calibration, raw: float | None, evidence: dict[str, float]) -> float | None:
    return None if raw is None else calibration(raw, evidence)


def measure(
    train: Sequence[dspy.Example],
    val: Sequence[dspy.Example],
    sample: Sequence[int],
    train_scores: Sequence[Sequence[float | None]],
    val_scores: Sequence[Sequence[float | None]],
    k: int,
    *,
    calibration_pairs: int,
    fits: int,
    seed: int,
) -> dict[str, Any]:
    """The numbers of the module docstring for the best of ``k`` views. ``train`` is in the compile's
    order (seeded, label-interleaved); ``sample`` indexes the compile's val sample in ``val``."""
    labels = [int(bool(e.relevant)) for e in val]
    train_labels = [int(bool(e.relevant)) for e in train]
    raw_val = [best_of(s, k) for s in val_scores]
    raw_train = [best_of(s, k) for s in train_scores]
    evidence_val = [evidence_features(e.question, e.document) for e in val]
    evidence_train = [evidence_features(e.question, e.document) for e in train]

    def fitted(rows: Sequence[int]) -> Calibration:
        return fit_calibration(
            [raw_train[i] for i in rows], [train_labels[i] for i in rows], [evidence_train[i] for i in rows]
        )

    def scored(calibration: Calibration) -> list[float | None]:
        return [_compiled(calibration, r, ev) for r, ev in zip(raw_val, evidence_val, strict=True)]

    compile_fit = fitted(range(min(calibration_pairs, len(train))))
    compiled = scored(compile_fit)
    positives = [i for i, y in enumerate(train_labels) if y]
    negatives = [i for i, y in enumerate(train_labels) if not y]
    rng = random.Random(seed)
    half = calibration_pairs // 2
    drawn = [
        binary_report(
            scored(fitted(rng.sample(positives, half) + rng.sample(negatives, half))), labels
        ).accuracy
        for _ in range(fits)
    ]
    return {
        "views": k,
        "uncompiled": {
            "sample": binary_report([raw_val[i] for i in sample], [labels[i] for i in sample]).as_dict(),
            "whole": binary_report(raw_val, labels).as_dict(),
        },
        "compiled": {
            "calibration": compile_fit.dump_state(),
            "sample": binary_report([compiled[i] for i in sample], [labels[i] for i in sample]).as_dict(),
            "whole": binary_report(compiled, labels).as_dict(),
            "best_cut_accuracy": best_cut_accuracy(compiled, labels),
        },
        "random_fits": {
            "n": fits,
            "mean": statistics.mean(drawn) if drawn else None,
            "min": min(drawn, default=None),
            "max": max(drawn, default=None),
        },
    }


def grader_and_pairs(
    domain_name: str | None, lm_name: str | None, *, seed: int, judge_val_limit: int | None
) -> tuple[Domain, dspy.BaseLM, BinaryJudge, list[dspy.Example], list[dspy.Example], list[int]]:
    """The settings' domain (or ``domain_name``) and LM (or ``lm_name``, cached), the uncompiled grader
    with the settings' sentence choice, the train pairs in the compile's order (seeded,
    label-interleaved), the val pairs, and the indices in val of the compile's val sample."""
    overrides = {k: v for k, v in (("domain", domain_name), ("lm", lm_name)) if v}
    settings = Settings(**overrides)
    domain = load_domain(settings.resolved_domain_dir)
    lm = build_lm(settings, cache=True)
    grader = CRAG(
        _NoBackend(),
        _NoBackend(),
        lm=lm,
        grade_term_weight=settings.grade_term_weight,
        grade_term_stems=settings.grade_term_stems,
    ).grader
    train = interleave_balanced(relevance_examples(domain.relevance, "train"), "relevant", seed)
    val = relevance_examples(domain.relevance, "val")
    in_sample = {id(e) for e in spread(val, lambda e: e.question, judge_val_limit)}
    return domain, lm, grader, train, val, [i for i, e in enumerate(val) if id(e) in in_sample]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default=None, help="a bundled domain (default: the settings')")
    parser.add_argument("--lm", help="LM as in the CLI (default: the embedded model)")
    parser.add_argument("--views", type=int, default=3, help="sentences asked about separately (default 3)")
    parser.add_argument("--fits", type=int, default=30, help="random calibration fits (default 30)")
    parser.add_argument("--calibration-pairs", type=int, default=64)
    parser.add_argument("--judge-val-limit", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.views < 1:
        parser.error("--views must be >= 1")

    domain, lm, grader, train, val, sample = grader_and_pairs(
        args.domain, args.lm, seed=args.seed, judge_val_limit=args.judge_val_limit
    )
    with dspy.context(lm=lm):
        val_scores, val_failed = view_scores(grader, val, args.views)
        train_scores, train_failed = view_scores(grader, train, args.views)
    results = [
        measure(
            train,
            val,
            sample,
            train_scores,
            val_scores,
            k,
            calibration_pairs=args.calibration_pairs,
            fits=args.fits,
            seed=args.seed,
        )
        for k in range(1, args.views + 1)
    ]

    print(
        f"domain `{domain.name}`, LM {lm.model}: {len(val)} val pairs ({len(sample)} in the compile's "
        f"sample), {len(train)} train pairs; failed judgements: val {val_failed}, train {train_failed}"
    )
    print(
        f"{'views':>5} | {'uncompiled sample':>17} {'whole':>6} {'AUC':>6} | {'compiled sample':>15} "
        f"{'whole':>6} {'AUC':>6} {'best cut':>8} | {'random fits mean (min-max)':>26}"
    )

    def auc(report: dict[str, Any]) -> str:
        return "-" if report["roc_auc"] is None else f"{report['roc_auc']:.3f}"

    for r in results:
        u, c, f = r["uncompiled"], r["compiled"], r["random_fits"]
        spread_text = "-" if f["mean"] is None else f"{f['mean']:.1%} ({f['min']:.1%}-{f['max']:.1%})"
        print(
            f"{r['views']:>5} | {u['sample']['accuracy']:>17.1%} {u['whole']['accuracy']:>6.1%} "
            f"{auc(u['whole']):>6} | {c['sample']['accuracy']:>15.1%} {c['whole']['accuracy']:>6.1%} "
            f"{auc(c['whole']):>6} {c['best_cut_accuracy']:>8.1%} | {spread_text:>26}"
        )
    if args.out:
        payload = {
            "domain": domain.name,
            "lm": lm.model,
            "val_pairs": len(val),
            "sample_pairs": len(sample),
            "train_pairs": len(train),
            "grade_term_weight": grader.view.term_weight,
            "grade_term_stems": grader.view.term_stems,
            "failed": {"val": val_failed, "train": train_failed},
            "results": results,
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
