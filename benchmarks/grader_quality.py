"""How well the grader tells relevant passages from the rest, on every labelled relevance pair of a split.

For the uncompiled grader and, with ``--program``, the compiled program's (through its grade source:
LLM judge, trained evaluator or both fused), on the same pairs: accuracy at 0.5 (Wilson 95% interval),
precision, recall and ROC AUC (bootstrap over questions), the exact McNemar p of compiled against
uncompiled, and the seconds per pair and per question (each question's pairs graded together, as CRAG
grades its k passages; the trained evaluator's own share when it grades). Next to them, without an
LM: the ROC AUC of the bundled MiniLM's question/passage cosine similarity (the baseline a grader must
beat), and how often the excerpt the grader reads still shows a gold answer its passage holds.

    python benchmarks/grader_quality.py --program runs/default/program.json
    python benchmarks/grader_quality.py --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev
    python benchmarks/grader_quality.py --domain default --no-cache --judges grader,strip_filter

The domain is the program's own unless ``--domain``/``--domain-dir`` name one. DSPy's cache is on by
default: when the compile kept the zero-shot prompt, both graders read the same LM answers and reruns
are free; ``--no-cache`` makes every call (and so the seconds per pair) real. ``--judges`` adds the strip
filter on the split's strips. Writes benchmarks/results/grader_quality_<domain>.json.

``--training`` measures the trained evaluator's training instead (no LM): the train pairs are split as
the compile splits them (the questions of its ``--calibration-pairs`` calibration pairs held out to
choose the epoch and fit the logit-to-probability map), and the evaluator is trained with the settings
before the training speed-ups (fp32, plain shuffled batches) and with today's (batches grouped by
length, bf16 autocast where the CPU has it). For each: seconds, pair-epochs per second, the epoch
kept, and on the split's pairs ROC AUC and accuracy at 0.5 with intervals; between them the speed
ratio and the exact McNemar p, from this one run. ``--timing-pairs N`` adds a timing-only run of
every epoch on N pairs drawn (with repeats) from all of the domain's pairs, for the "<= 3 minutes
for 2,000 pairs" target; its scores are not reported (the split is in it).

    python benchmarks/grader_quality.py --training --domain-dir ../shared/data/popqa-dev --timing-pairs 2000

Writes benchmarks/results/evaluator_training_<domain>.json.

``--distill`` measures distillation (issue 22: what teaches the evaluator a domain whose labelled pairs
are too few or too hard). The program's calibrated LLM judge (the teacher) grades each train question's
top-k retrieved passages that no relevance label covers (never a held-out calibration question or one
labelled outside train); the evaluator is trained on the compile's fit pairs alone and with the teacher's
labels at 0.5 added, split, epoch and logit map as the compile's. On the split's labelled pairs: the
teacher, both evaluators and the teacher fused with the distilled evaluator (fitted on the held-out
pairs, as the compile fits it), with intervals and exact McNemar p. The teacher's calls go through
DSPy's cache.

    python benchmarks/grader_quality.py --distill --program data/default/program.json --frozen-layers 0
    python benchmarks/grader_quality.py --distill --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev

Writes benchmarks/results/distillation_<domain>.json.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
import harness
from pydantic import ValidationError
from tqdm.auto import tqdm

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.domain import Domain
from crag_dspy.embeddings import Embedder, bundled_model_path
from crag_dspy.judges.evaluator import TrainingConfig, native_bf16, train_evaluator
from crag_dspy.judges.fusion import fit_linear_score, fused_signals
from optimize.datasets import (
    answers_by_question,
    domain_questions,
    interleave_balanced,
    relevance_examples,
    strip_examples,
)
from optimize.grade_source import (
    distilled_pairs,
    evaluator_pairs,
    evaluator_split,
    measured,
    program_grades,
    retrieval_similarities,
)
from optimize.measure import judge_scores
from optimize.metrics import bootstrap_auc_interval, contains_answer, mcnemar_exact, roc_auc

SCRIPT = "grader_quality"
TRAINING_SCRIPT = "evaluator_training"
DISTILL_SCRIPT = "distillation"
JUDGES = ("grader", "strip_filter")
# "previous": the evaluator's training before length-grouped batches, bf16 and frozen lower layers.
TRAINING_SETTINGS = {
    "previous": TrainingConfig(precision="fp32", bucket_batches=1, frozen_layers=0, learning_rate=5e-5),
    "current": TrainingConfig(),
}
Pair = tuple[str, str, int]


def by_question(examples: Sequence[dspy.Example]) -> list[list[int]]:
    """Indices of ``examples`` grouped by question, groups in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(e.question, []).append(i)
    return list(groups.values())


def timed_grades(
    crag: CRAG, examples: Sequence[dspy.Example], embedder: Embedder, *, desc: str, progress: bool = True
) -> tuple[list[float | None], dict[str, Any]]:
    """What ``crag`` grades each example (as :func:`~optimize.grade_source.program_grades`), one question's
    pairs at a time, and the seconds it took: per pair, per question, and the trained evaluator's share."""
    scores: list[float | None] = [None] * len(examples)
    per_question, evaluator = [], []
    for group in tqdm(by_question(examples), desc=desc, disable=not progress):
        chosen = [examples[i] for i in group]
        started = time.perf_counter()
        for i, score in zip(group, program_grades(crag, chosen, embedder, progress=False), strict=True):
            scores[i] = score
        per_question.append(time.perf_counter() - started)
        if crag.grading.uses_evaluator:  # its batched pass alone, as CRAG makes it per question
            started = time.perf_counter()
            crag.grading.evaluator_logits_for([(e.question, e.document) for e in chosen])
            evaluator.append(time.perf_counter() - started)
    timing: dict[str, Any] = {
        "seconds_per_pair": sum(per_question) / max(len(examples), 1),
        "seconds_per_question": _spread(per_question),
    }
    if evaluator:
        timing["evaluator_seconds_per_question"] = _spread(evaluator)
    return scores, timing


def _spread(seconds: Sequence[float]) -> dict[str, float] | None:
    if not seconds:
        return None
    return {"median": statistics.median(seconds), "max": max(seconds), "n": len(seconds)}


def right_at_half(scores: Sequence[float | None], gold: Sequence[int]) -> list[bool]:
    """Per pair, whether the score read at 0.5 gives the gold label (a missing score is wrong)."""
    return [s is not None and (s >= 0.5) == bool(y) for s, y in zip(scores, gold, strict=True)]


def cosine_baseline(embedder: Embedder, examples: Sequence[dspy.Example]) -> dict[str, Any]:
    """ROC AUC (bootstrap interval over questions) of the question/passage cosine similarity: no LM."""
    scores = retrieval_similarities(embedder, examples)
    gold = [int(bool(e.relevant)) for e in examples]
    return {
        "roc_auc": roc_auc(scores, gold),
        "roc_auc_ci": bootstrap_auc_interval(scores, gold, [e.question for e in examples]),
    }


def excerpt_recall(
    crag: CRAG, examples: Sequence[dspy.Example], aliases: dict[str, list[str]]
) -> dict[str, Any]:
    """Of the positive pairs whose passage text holds a gold answer of its question, how many show it in
    what the grader reads (its view of the passage: the title and the chosen sentences). No LM."""
    held = [
        e
        for e in examples
        if e.relevant and contains_answer(e.document.partition("\n")[2], aliases.get(e.question, []))
    ]
    shown = sum(
        contains_answer(
            crag.grader.shown_inputs({"question": e.question, "document": e.document})[0]["document"],
            aliases[e.question],
        )
        for e in held
    )
    return harness.rate(shown, len(held))


def graders(
    lm: dspy.BaseLM,
    config: CRAGConfig | None = None,
    document: dict[str, Any] | None = None,
    program_dir: Path | None = None,
    embedder: Embedder | None = None,
) -> dict[str, CRAG]:
    """The judges to measure: the uncompiled ones with ``config`` and, with a program ``document``, the
    compiled ones. The uncompiled side then has the program's config (the grader's view) with a fresh
    module's state: what the compile measured as "uncompiled" before it fitted anything."""
    if document is None:
        return {"uncompiled": harness.judges_only(lm, config, embedder=embedder)}
    # A fresh module's parameter states under the program's config (the file keeps them side by side).
    fresh = harness.judges_only(lm, config).dump_state(json_mode=True)
    fresh.pop("config")
    return {
        "uncompiled": harness.judges_only(lm, config, {**document, **fresh}, embedder=embedder),
        "compiled": harness.judges_only(lm, config, document, program_dir, embedder),
    }


def measure(
    sides: dict[str, CRAG],
    examples: Sequence[dspy.Example],
    lm: dspy.BaseLM,
    *,
    strips: Sequence[dspy.Example] | None = None,
    embedder: Embedder | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """``{judge: {side: metrics}}`` for the grader of each of ``sides`` on ``examples`` (and the strip
    filter on ``strips`` when given); metrics as :func:`optimize.grade_source.measured` gives them, the
    grader's with its seconds, the compiled side's with McNemar's p against the uncompiled one."""
    embedder = embedder or Embedder()
    work = {"grader": (examples, "relevant")}
    if strips is not None:
        work["strip_filter"] = (strips, "keep")
    results: dict[str, Any] = {}
    for judge, (exs, label) in work.items():
        gold = [int(bool(e[label])) for e in exs]
        right: dict[str, list[bool]] = {}
        for name, crag in sides.items():
            timing: dict[str, Any] = {}
            with dspy.context(lm=lm):
                if judge == "grader":
                    scores, timing = timed_grades(
                        crag, exs, embedder, desc=f"grader ({name})", progress=progress
                    )
                else:
                    scores = judge_scores(crag.strip_filter, exs, desc=f"{judge} ({name})", progress=progress)
            results.setdefault(judge, {})[name] = measured(scores, gold, [e.question for e in exs]) | timing
            right[name] = right_at_half(scores, gold)
        if "compiled" in right:  # paired: the same examples judged by both
            results[judge]["compiled"]["mcnemar_p"] = mcnemar_exact(right["compiled"], right["uncompiled"])
    return results


def report(results: dict[str, Any]) -> None:
    print(
        f"\n{results['program'] or 'uncompiled defaults'} on the {results['split']} split of `{results['domain']}` "
        f"({results['pairs']} pairs, {results['positives']} relevant); grade source {results['grade_source']}"
    )
    print("95% intervals: Wilson (accuracy), bootstrap over questions (ROC AUC)")
    print(
        f"{'judge':<13} {'program':<11} {'n':>4} {'accuracy [95% CI]':>23} {'prec':>6} {'recall':>6} {'ROC AUC [95% CI]':>22} {'s/pair':>7} failed"
    )
    for judge in JUDGES:
        for name, r in results.get(judge, {}).items():
            low, high = r["accuracy_ci"]
            auc = "-" if r["roc_auc"] is None else f"{r['roc_auc']:.3f}"
            if r["roc_auc_ci"]:
                auc += f" [{r['roc_auc_ci'][0]:.3f}, {r['roc_auc_ci'][1]:.3f}]"
            seconds = f"{r['seconds_per_pair']:.2f}" if "seconds_per_pair" in r else "-"
            print(
                f"{judge:<13} {name:<11} {r['n']:>4} {r['accuracy']:>7.1%} [{low:.1%}, {high:.1%}] "
                f"{r['precision']:>6.1%} {r['recall']:>6.1%} {auc:>22} {seconds:>7} {r['unknown']:>6}"
            )
        if "compiled" in results.get(judge, {}):
            p = results[judge]["compiled"]["mcnemar_p"]
            print(
                f"{judge}: compiled vs uncompiled, exact McNemar p = {p:.4f} ({'a difference' if p < 0.05 else 'no measured difference'})"
            )
    shipped = results["grader"].get("compiled", results["grader"]["uncompiled"])
    if shipped["seconds_per_question"]:
        q = shipped["seconds_per_question"]
        print(
            f"grading one question's pairs: median {q['median']:.3f} s, max {q['max']:.3f} s ({q['n']} questions)"
        )
    if shipped.get("evaluator_seconds_per_question"):
        q = shipped["evaluator_seconds_per_question"]
        print(
            f"  of which the trained evaluator's batched pass: median {q['median']:.3f} s, max {q['max']:.3f} s"
        )
    cosine = results["cosine"]
    ci = cosine["roc_auc_ci"]
    interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
    print(
        f"cosine similarity baseline (no LM): ROC AUC {cosine['roc_auc']:.3f}{interval}"
        if cosine["roc_auc"] is not None
        else "cosine baseline: -"
    )
    print(
        f"the grader's excerpt shows the gold answer its passage holds: {harness.fmt_rate(results['excerpt_shows_answer'])}"
    )


# --- --training: the evaluator's training ---------------------------------------------------------------


def compile_split(
    train: Sequence[dspy.Example], calibration_pairs: int, seed: int = 0
) -> tuple[list[Pair], list[Pair]]:
    """(fit, held-out) pairs as the compile splits the train examples when the LLM judge keeps no
    demos: in the compile's seeded, label-balanced order, the questions of the first
    ``calibration_pairs`` examples (the judge's calibration pairs) are held out whole."""
    ordered = interleave_balanced(train, "relevant", seed)
    return evaluator_split(ordered, {e.question for e in ordered[:calibration_pairs]})


def train_and_score(
    fit: list[Pair], holdout: list[Pair], val: list[Pair], config: TrainingConfig
) -> dict[str, Any]:
    """Train with ``config``; the epoch kept, time, and on ``val`` (through the logit map fitted on
    ``holdout``, as the compile fits it) what :func:`~optimize.grade_source.measured` reports."""
    started = time.perf_counter()
    evaluator, report = train_evaluator(fit, holdout, base=bundled_model_path(), config=config)
    seconds = time.perf_counter() - started
    held_logits = evaluator.logits([(q, p) for q, p, _ in holdout])
    val_logits = evaluator.logits([(q, p) for q, p, _ in val])
    score = fit_linear_score([{"evaluator": x} for x in held_logits], [y for *_, y in holdout])
    probabilities = [score({"evaluator": x}) for x in val_logits]
    gold = [y for *_, y in val]
    return {
        "config": config.model_dump(),
        "precision": report.precision,
        "seconds": round(seconds, 1),
        "pair_epochs_per_second": round(len(fit) * len(report.epochs) / report.seconds, 2),
        "epochs": report.epochs,
        "best_epoch": report.best_epoch,
        "val": measured(probabilities, gold, [q for q, _, _ in val]),
        "_right": right_at_half(probabilities, gold),
        "_logits": {"holdout": held_logits, "val": val_logits},
    }


def timing_run(
    pairs: Sequence[Pair], holdout: list[Pair], n: int, config: TrainingConfig, seed: int = 0
) -> dict[str, Any]:
    """Seconds to train on ``n`` pairs drawn from ``pairs`` for all of ``config.max_epochs`` (no early
    stop: the longest the compile can take), choosing the epoch on ``holdout``."""
    rng = random.Random(seed)
    drawn = [pairs[rng.randrange(len(pairs))] for _ in range(n)]
    config = config.model_copy(update={"patience": config.max_epochs})
    started = time.perf_counter()
    _, report = train_evaluator(drawn, holdout, base=bundled_model_path(), config=config)
    return {
        "pairs": len(drawn),
        "holdout_pairs": len(holdout),
        "epochs_run": len(report.epochs),
        "seconds": round(time.perf_counter() - started, 1),
        "precision": report.precision,
        "frozen_layers": report.frozen_layers,
    }


def training(args: Any, argv: Sequence[str] | None, domain: Any) -> dict[str, Any]:
    """``--training``: both settings on the compile's split, and the timing run if asked."""
    val = evaluator_pairs(relevance_examples(domain.relevance, args.split))
    fit, holdout = compile_split(relevance_examples(domain.relevance, "train"), args.calibration_pairs)
    print(
        f"{domain.name}: {len(fit)} training pairs, {len(holdout)} held out, {len(val)} {args.split}; "
        f"native bf16: {native_bf16()}"
    )
    runs: dict[str, Any] = {}
    for name, config in TRAINING_SETTINGS.items():
        runs[name] = r = train_and_score(fit, holdout, val, config)
        print(
            f"{name:9} {r['precision']}: {r['seconds']:.0f} s, {r['pair_epochs_per_second']} pair-epochs/s, "
            f"epoch {r['best_epoch']} of {len(r['epochs'])}; {args.split} ROC AUC {r['val']['roc_auc']:.3f} "
            f"[{r['val']['roc_auc_ci'][0]:.3f}, {r['val']['roc_auc_ci'][1]:.3f}], "
            f"accuracy {r['val']['accuracy']:.1%} [{r['val']['accuracy_ci'][0]:.1%}, {r['val']['accuracy_ci'][1]:.1%}]"
        )
    previous, current = runs["previous"], runs["current"]
    results: dict[str, Any] = {
        "domain": domain.name,
        "split": args.split,
        "fit_pairs": len(fit),
        "holdout_pairs": len(holdout),
        "speedup": round(previous["seconds"] / current["seconds"], 2),
        "accuracy_mcnemar_p": mcnemar_exact(current["_right"], previous["_right"]),
        "runs": {name: public(r) for name, r in runs.items()},
    }
    print(
        f"current / previous: {results['speedup']}x faster; {args.split} accuracy McNemar p = "
        f"{results['accuracy_mcnemar_p']:.3f}"
    )
    if args.timing_pairs:
        everything = [(r.question, r.passage, int(r.label)) for r in domain.relevance]
        results["timing"] = t = timing_run(
            everything, holdout, args.timing_pairs, TRAINING_SETTINGS["current"]
        )
        print(
            f"timing: {t['pairs']} pairs x {t['epochs_run']} epochs in {t['seconds']:.0f} s ({t['precision']})"
        )
    harness.write_result(
        harness.result_path(args, TRAINING_SCRIPT, domain.name), TRAINING_SCRIPT, argv, results
    )
    return results


def public(run: dict[str, Any]) -> dict[str, Any]:
    """A run's result without the per-pair working keys (``_right``, ``_logits``)."""
    return {k: v for k, v in run.items() if not k.startswith("_")}


# --- --distill: the LLM judge's labels as the evaluator's training data --------------------------------


def train_questions(domain: Domain, excluded: set[str]) -> list[str]:
    """The domain's train questions (QA, the relevance questions file, the relevance pairs), in order of
    first appearance, none of ``excluded``."""
    questions = [q.question for q in domain_questions(domain) if q.split == "train"]
    questions += [r.question for r in domain.relevance if r.split == "train"]
    return [q for q in dict.fromkeys(questions) if q not in excluded]


def as_example(question: str, document: str, relevant: bool = False) -> dspy.Example:
    return dspy.Example(question=question, document=document, relevant=relevant).with_inputs(
        "question", "document"
    )


def distillation(
    args: Any, argv: Sequence[str] | None, lm: dspy.BaseLM | None, config: TrainingConfig
) -> dict[str, Any]:
    """``--distill``: the evaluator trained on the compile's fit pairs alone and with the teacher's (the
    program's calibrated LLM judge) hard labels on the unlabelled combinations of the train questions;
    both, the teacher and the teacher fused with the distilled evaluator, measured on the split."""
    document = harness.read_document(args.program)
    settings = harness.settings_for(args, document)
    lm = harness.lm_for(settings, args, lm)
    crag, domain = harness.open_crag(settings, lm, document, args.program)
    crag.grading.use("llm")  # the teacher, whatever grade source the program shipped
    val_examples = relevance_examples(domain.relevance, args.split)
    val = evaluator_pairs(val_examples)
    fit, holdout = compile_split(relevance_examples(domain.relevance, "train"), args.calibration_pairs)
    # Neither a held-out (calibration) question nor a question with labels outside train is distilled.
    excluded = {q for q, _, _ in holdout} | {r.question for r in domain.relevance if r.split != "train"}
    questions = train_questions(domain, excluded)
    held_examples = [as_example(q, d, bool(y)) for q, d, y in holdout]
    with dspy.context(lm=lm):  # the compile's --evaluator-distill labels exactly these
        distilled, labelled = distilled_pairs(
            crag,
            questions,
            {(r.question, r.passage) for r in domain.relevance},
            crag.embedder,
            progress=args.progress,
        )
        llm_val = program_grades(crag, val_examples, crag.embedder, progress=args.progress)
        llm_held = program_grades(crag, held_examples, crag.embedder, progress=args.progress)
    print(
        f"{domain.name}: {len(questions)} train questions, {labelled['combinations']} unlabelled combinations"
    )
    print(
        f"teacher labels: {labelled['pairs']} ({labelled['relevant']} relevant, "
        f"{labelled['failed']} failed) in {labelled['seconds']:.0f} s"
    )
    runs = {
        "base evaluator": train_and_score(fit, holdout, val, config),
        "distilled evaluator": train_and_score(fit + distilled, holdout, val, config),
    }
    logits = runs["distilled evaluator"]["_logits"]
    fused = fit_linear_score(
        [
            fused_signals(s, x, c)
            for s, x, c in zip(
                llm_held, logits["holdout"], retrieval_similarities(crag.embedder, held_examples)
            )
        ],
        [y for *_, y in holdout],
    )
    fused_val = [
        None if s is None else fused(fused_signals(s, x, c))
        for s, x, c in zip(llm_val, logits["val"], retrieval_similarities(crag.embedder, val_examples))
    ]
    gold, questions_of = [y for *_, y in val], [q for q, _, _ in val]
    candidates = {name: run["val"] for name, run in runs.items()} | {
        "llm judge": measured(llm_val, gold, questions_of),
        "fused (llm judge + distilled evaluator)": measured(fused_val, gold, questions_of),
    }
    right = {name: run["_right"] for name, run in runs.items()} | {
        name: right_at_half(scores, gold)
        for name, scores in (("llm judge", llm_val), ("fused (llm judge + distilled evaluator)", fused_val))
    }
    pairs = [
        ("distilled evaluator", "base evaluator"),
        ("distilled evaluator", "llm judge"),
        ("fused (llm judge + distilled evaluator)", "llm judge"),
    ]
    tests = {f"{a} vs {b}": mcnemar_exact(right[a], right[b]) for a, b in pairs}
    for name, r in candidates.items():
        auc, acc = r["roc_auc_ci"], r["accuracy_ci"]
        print(
            f"{name:40} ROC AUC {r['roc_auc']:.3f} [{auc[0]:.3f}, {auc[1]:.3f}], "
            f"accuracy {r['accuracy']:.1%} [{acc[0]:.1%}, {acc[1]:.1%}]"
        )
    for name, pval in tests.items():
        print(f"exact McNemar p, {name}: {pval:.2g}")
    results = {
        "domain": domain.name,
        "split": args.split,
        "program": str(args.program),
        "fit_pairs": len(fit),
        "holdout_pairs": len(holdout),
        "train_questions": len(questions),
        "unlabelled_combinations": labelled["combinations"],
        "distilled_pairs": labelled["pairs"],
        "distilled_relevant": labelled["relevant"],
        "label_seconds": labelled["seconds"],
        "runs": {name: public(run) for name, run in runs.items()},
        "candidates": candidates,
        "mcnemar_p": tests,
    }
    harness.write_result(
        harness.result_path(args, DISTILL_SCRIPT, domain.name), DISTILL_SCRIPT, argv, results, lm=lm
    )
    return results


def main(argv: list[str] | None = None, *, lm: dspy.BaseLM | None = None) -> int:
    p = harness.parser(__doc__, program=True, store=True)  # --distill retrieves
    p.add_argument("--split", default="val", help="relevance split (default val)")
    p.add_argument(
        "--judges", default="grader", help="comma-separated: grader, strip_filter (default grader)"
    )
    t = p.add_argument_group("--training: the trained evaluator's training (no LM)")
    t.add_argument("--training", action="store_true", help="measure the evaluator's training instead")
    t.add_argument("--calibration-pairs", type=int, default=64, help="as the compile's flag (default: 64)")
    t.add_argument("--timing-pairs", type=int, default=0, help="also time every epoch on this many pairs")
    d = p.add_argument_group("--distill: the program's LLM judge labels unlabelled pairs for the evaluator")
    d.add_argument("--distill", action="store_true", help="measure distillation instead (needs --program)")
    d.add_argument("--frozen-layers", type=int, help="TrainingConfig.frozen_layers (default: the compile's)")
    d.add_argument("--max-epochs", type=int, help="TrainingConfig.max_epochs (default: the compile's)")
    d.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    args = harness.parse(p, argv)
    if args.training and args.distill:
        p.error("--training and --distill are separate runs")
    if args.training:
        training(args, argv, harness.domain_of(harness.settings_for(args)))
        return 0
    if args.distill:
        if args.program is None:
            p.error("--distill needs --program: its LLM judge is the teacher")
        overrides = {"frozen_layers": args.frozen_layers, "max_epochs": args.max_epochs}
        try:  # before the LM starts and the store opens
            config = TrainingConfig(**{k: v for k, v in overrides.items() if v is not None})
        except ValidationError as exc:
            p.error(
                "; ".join(
                    f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors()
                )
            )
        distillation(args, argv, lm, config)
        return 0
    judges = [j.strip() for j in args.judges.split(",") if j.strip()]
    if not judges or set(judges) - set(JUDGES) or "grader" not in judges:
        p.error(f"--judges takes grader and optionally strip_filter, got {args.judges!r}")
    document = harness.read_document(args.program)
    settings = harness.settings_for(args, document)
    domain = harness.domain_of(settings)
    examples = relevance_examples(domain.relevance, args.split)
    if not examples:
        p.error(f"domain `{domain.name}` has no {args.split} relevance pairs")
    lm = harness.lm_for(settings, args, lm)
    embedder = Embedder(settings.embedding_model)
    config = domain.config.crag_config(settings.config)  # the uncompiled program's, as the app builds it
    sides = graders(lm, config, document, args.program.parent if args.program else None, embedder)
    shipped = sides.get("compiled", sides["uncompiled"])
    strips = (
        strip_examples(domain, args.split, shipped.config.sentences_per_strip)
        if "strip_filter" in judges
        else None
    )
    results = {
        "domain": domain.name,
        "split": args.split,
        "program": str(args.program) if args.program else None,
        "grade_source": shipped.grading.mode,
        "pairs": len(examples),
        "positives": sum(bool(e.relevant) for e in examples),
        **measure(sides, examples, lm, strips=strips, embedder=embedder),
        "cosine": cosine_baseline(embedder, examples),
        "excerpt_shows_answer": excerpt_recall(shipped, examples, answers_by_question(domain)),
    }
    report(results)
    harness.write_result(harness.result_path(args, SCRIPT, domain.name), SCRIPT, argv, results, lm=lm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
