"""Choose where CRAG's document grades come from, by val: the LLM judge, a trained evaluator, or both.

The compile has already compiled the LLM judge (:func:`optimize.optimizer.compile_judge`) and knows
its scores on the val pairs and on the held-out train pairs its calibration was fitted on. This stage:

1. trains the evaluator (:mod:`crag_dspy.judges.evaluator`) on the train pairs of the other questions, with
   all train pairs of the held-out questions to choose the epoch (no question feeds both);
2. fits ``evaluator`` (a logistic map of its logit) on those held-out pairs, and ``fused`` (LLM score,
   evaluator logit and retrieval similarity) on the held-out pairs the LLM judge scored;
3. measures every candidate on the same val pairs, with intervals, and ships the best (``auto``) or
   the one asked for. An evaluator or fused grade ships under ``auto`` only when it is at least as
   accurate as the uncompiled LLM judge; ties go to fewer LM calls.

No LM call is made here, with one exception asked for by name: with ``distill`` the program's LLM
judge labels each given train question's top-k retrieved passages that no relevance label covers
(:func:`distilled_pairs`), and a second evaluator trains on those labels too; it replaces the first
only when it ranks the held-out pairs better. That teaches the evaluator where labelled pairs are few
and the LLM judge is strong (docs/evaluator.md, "Distilling the LLM judge").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from tqdm.auto import tqdm

from crag_dspy.embeddings import Embedder
from crag_dspy.judges.evaluator import EvaluatorError, RelevanceEvaluator, TrainingConfig, train_evaluator
from crag_dspy.judges.fusion import fit_linear_score, fused_signals
from crag_dspy.judges.protocols import Judge, PairScorer
from crag_dspy.version import installed_version

from .metrics import binary_report, bootstrap_auc_interval, wilson_interval

__all__ = [
    "GRADER_CHOICES",
    "MIN_TRAIN_PAIRS",
    "GradeSourceChoice",
    "JudgeScores",
    "choose_grade_source",
    "distilled_pairs",
    "evaluator_on_strips",
    "evaluator_pairs",
    "evaluator_split",
    "measured",
    "program_grades",
]

log = logging.getLogger(__name__)

GRADER_CHOICES = ("auto", "llm", "evaluator", "fused")
# Below this many labelled train pairs (or with one class only) no evaluator is trained.
MIN_TRAIN_PAIRS = 100
# Fewer LM calls first: the order ties are broken in.
_COST_ORDER = ("evaluator", "llm", "fused")


@dataclass
class JudgeScores:
    """The shipped LLM judge's scores on val and on the held-out train pairs its calibration saw."""

    val: list[float | None]
    held_out: list[dspy.Example]
    held_out_scores: list[float | None]
    uncompiled_val: list[float | None]


@dataclass
class GradeSourceChoice:
    """What :func:`choose_grade_source` measured and shipped (``report``), and the evaluator it trained,
    shipped or not: the compile measures that one on the strip filter's pairs too."""

    report: dict[str, Any]
    evaluator: RelevanceEvaluator | None = None


def measured(scores: Sequence[float | None], gold: Sequence[int], questions: Sequence[str]) -> dict[str, Any]:
    """Accuracy (Wilson 95% interval), precision, recall, ROC AUC (bootstrap over questions) of scores."""
    report = binary_report(scores, gold).as_dict()
    correct = round(report["accuracy"] * report["n"])
    report["accuracy_ci"] = wilson_interval(correct, report["n"])
    report["roc_auc_ci"] = bootstrap_auc_interval(scores, gold, questions)
    return report


def evaluator_pairs(examples: Sequence[dspy.Example], label: str = "relevant") -> list[tuple[str, str, int]]:
    """(question, passage, label) of grader examples, as the evaluator trains on them."""
    return [(e.question, e.document, int(bool(e[label]))) for e in examples]


def evaluator_split(
    train: Sequence[dspy.Example], held_questions: set[str]
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
    """(fit, held-out) evaluator pairs: the train pairs of ``held_questions`` (the judge's calibration
    questions) choose the epoch and fit the logit map, the others train; no question feeds both."""
    return (
        evaluator_pairs([e for e in train if e.question not in held_questions]),
        evaluator_pairs([e for e in train if e.question in held_questions]),
    )


# Training is deterministic for one set of these versions only: kernels and initialisation change
# between releases, so a training cached under other versions would make the program depend on the
# cache rather than on the data.
_TRAINING_PACKAGES = ("torch", "transformers", "sentence-transformers")


def _cache_key(train: list, holdout: list, config: TrainingConfig, base: Path) -> str:
    digest = hashlib.sha256()
    base_weights = base / "model.safetensors"
    stat = base_weights.stat() if base_weights.is_file() else None
    blob = [
        train,
        holdout,
        config.model_dump(),
        str(base.resolve()),
        stat and stat.st_size,
        {name: installed_version(name) for name in _TRAINING_PACKAGES},
    ]
    digest.update(json.dumps(blob, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()[:20]


def trained_evaluator(
    train: list[tuple[str, str, int]],
    holdout: list[tuple[str, str, int]],
    *,
    base: Path,
    config: TrainingConfig,
    cache_dir: Path | None,
    progress: bool,
) -> tuple[RelevanceEvaluator, dict[str, Any]]:
    """Train (or reuse the cached training of) an evaluator on exactly these pairs and settings."""
    folder = cache_dir / _cache_key(train, holdout, config, base) if cache_dir else None
    meta = folder / "training.json" if folder else None
    if folder is not None and meta is not None and meta.is_file():
        try:
            info = json.loads(meta.read_text(encoding="utf-8"))
            evaluator = RelevanceEvaluator.load(folder / "weights", info.pop("files"))
            return evaluator, {**info, "cached": True}
        except (EvaluatorError, OSError, ValueError, KeyError) as exc:
            log.warning("cached evaluator in %s not usable (%s); training again", folder, exc)
    bar = tqdm(desc="train evaluator", unit="step", disable=not progress)

    def tick(step: int, total: int) -> None:
        bar.total = total
        bar.update(step - bar.n)

    try:
        evaluator, training = train_evaluator(train, holdout, base=base, config=config, progress=tick)
    finally:
        bar.close()
    info = {**training.as_dict(), "config": config.model_dump()}
    if folder is not None and meta is not None:
        files = evaluator.save(folder / "weights")
        meta.write_text(json.dumps({**info, "files": files}, indent=1), encoding="utf-8")
    return evaluator, {**info, "cached": False}


def distilled_pairs(
    crag: Any,
    questions: Sequence[str],
    labelled: set[tuple[str, str]],
    embedder: Embedder,
    *,
    progress: bool = True,
) -> tuple[list[tuple[str, str, int]], dict[str, Any]]:
    """The LLM judge's labels on each of ``questions``' top-k retrieved passages that no (question,
    passage) of ``labelled`` covers, as evaluator pairs (relevant at a grade of 0.5 or more), and what
    it took. ``crag`` grades through its LLM judge (its grade source is switched to it); a passage the
    judge failed on is left out and counted."""
    crag.grading.use("llm")
    unique = list(dict.fromkeys(questions))
    combinations = [
        dspy.Example(question=question, document=passage.text).with_inputs("question", "document")
        for question in unique
        for passage in crag.retriever.retrieve(question, crag.config.k)
        if (question, passage.text) not in labelled
    ]
    started = time.perf_counter()
    grades = program_grades(crag, combinations, embedder, progress=progress)
    pairs = [
        (e.question, e.document, int(grade >= 0.5))
        for e, grade in zip(combinations, grades, strict=True)
        if grade is not None
    ]
    return pairs, {
        "questions": len(unique),
        "combinations": len(combinations),
        "pairs": len(pairs),
        "relevant": sum(y for *_, y in pairs),
        "failed": len(combinations) - len(pairs),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _held_out_auc(training: dict[str, Any]) -> float:
    """The held-out ROC AUC of the epoch a training kept."""
    return next(e["holdout_auc"] for e in training["epochs"] if e["epoch"] == training["best_epoch"])


def retrieval_similarities(embedder: Embedder, examples: Sequence[dspy.Example]) -> list[float]:
    """Cosine similarity of question and passage, as the retriever measures it (normalised MiniLM)."""
    vectors = embedder.encode([e.question for e in examples] + [e.document for e in examples])
    n = len(examples)
    return [float(sum(a * b for a, b in zip(vectors[i], vectors[n + i]))) for i in range(n)]


def choose_grade_source(
    crag: Any,
    train: list[dspy.Example],
    val: list[dspy.Example],
    llm: JudgeScores,
    *,
    choice: str = "auto",
    base: Path,
    config: TrainingConfig | None = None,
    embedder: Embedder,
    cache_dir: Path | None = None,
    distill: Sequence[str] = (),
    progress: bool = True,
) -> GradeSourceChoice:
    """Measure the grade sources on ``val``, switch ``crag.grading`` to the chosen one, report why.

    ``distill``: train questions (none with labels outside train) whose unlabelled top-k passages the
    LLM judge labels (:func:`distilled_pairs`; the held-out questions are never distilled, they choose
    the epoch). An evaluator is then trained with those labels too, and replaces the one trained on
    labelled pairs alone only when it ranks the held-out pairs better."""
    config = config or TrainingConfig()
    if choice not in GRADER_CHOICES:
        raise ValueError(f"unknown grader {choice!r}; choose from {GRADER_CHOICES}")
    gold = [int(bool(e.relevant)) for e in val]
    questions = [e.question for e in val]
    candidates: dict[str, dict[str, Any]] = {
        "llm (uncompiled)": measured(llm.uncompiled_val, gold, questions),
        "llm": measured(llm.val, gold, questions),
    }
    report: dict[str, Any] = {"candidates": candidates}
    fit_pairs, holdout = evaluator_split(train, {e.question for e in llm.held_out})
    labels = [y for *_, y in fit_pairs]
    reason = None
    if choice == "llm":
        reason = "--grader llm"
    elif len(fit_pairs) < MIN_TRAIN_PAIRS or len(set(labels)) < 2:
        reason = (
            f"too few labelled train pairs to train an evaluator: {len(fit_pairs)} "
            f"({sum(labels)} relevant) outside the held-out questions; needs {MIN_TRAIN_PAIRS} with both labels"
        )
    elif len({y for *_, y in holdout}) < 2:
        reason = "the held-out train questions have one label only: no epoch or calibration can be chosen"
    if reason is not None:
        if choice in ("evaluator", "fused"):
            raise ValueError(f"--grader {choice}: {reason}")
        crag.grading.use("llm")
        return GradeSourceChoice({**report, "shipped": "llm", "why": f"LLM judge: {reason}"})

    evaluator, training = trained_evaluator(
        fit_pairs, holdout, base=base, config=config, cache_dir=cache_dir, progress=progress
    )
    if distill:
        held_questions = {q for q, _, _ in holdout}
        teacher_pairs, report["distillation"] = distilled_pairs(
            crag,
            [q for q in distill if q not in held_questions],
            {(e.question, e.document) for e in train},
            embedder,
            progress=progress,
        )
        taught, taught_training = trained_evaluator(
            fit_pairs + teacher_pairs,
            holdout,
            base=base,
            config=config,
            cache_dir=cache_dir,
            progress=progress,
        )
        # The teacher's labels can teach its errors too (a weak LLM judge): held-out labels decide.
        before, after = _held_out_auc(training), _held_out_auc(taught_training)
        kept = after > before
        report["distillation"].update(held_out_auc_without=before, held_out_auc_with=after, kept=kept)
        if kept:
            evaluator, training = taught, taught_training
    report["training"] = training
    held_logits = evaluator.logits([(q, p) for q, p, _ in holdout])
    try:
        evaluator_score = fit_linear_score([{"evaluator": x} for x in held_logits], [y for *_, y in holdout])
    except ValueError as exc:  # e.g. a single held-out positive: no map, so no evaluator to ship
        if choice in ("evaluator", "fused"):
            raise ValueError(f"--grader {choice}: the evaluator's score map cannot be fitted: {exc}") from exc
        crag.grading.use("llm")
        return GradeSourceChoice(
            {
                **report,
                "shipped": "llm",
                "why": f"LLM judge: the evaluator's score map cannot be fitted ({exc})",
            }
        )
    val_logits = evaluator.logits([(e.question, e.document) for e in val])
    candidates["evaluator"] = measured(
        [evaluator_score({"evaluator": x}) for x in val_logits], gold, questions
    )

    # The fused map is fitted on the held-out pairs the LLM judge scored (its calibration pairs).
    logit_of = {(q, p): x for (q, p, _), x in zip(holdout, held_logits)}
    fit_rows, fit_labels, fused_score = [], [], None
    for example, llm_score, sim in zip(
        llm.held_out, llm.held_out_scores, retrieval_similarities(embedder, llm.held_out)
    ):
        if llm_score is not None:
            fit_rows.append(fused_signals(llm_score, logit_of[(example.question, example.document)], sim))
            fit_labels.append(int(bool(example.relevant)))
    try:
        fused_score = fit_linear_score(fit_rows, fit_labels)
    except ValueError as exc:
        report["fused_not_fitted"] = str(exc)
    if fused_score is not None:
        fused = [
            None if llm_score is None else fused_score(fused_signals(llm_score, logit, sim))
            for llm_score, logit, sim in zip(llm.val, val_logits, retrieval_similarities(embedder, val))
        ]
        candidates["fused"] = measured(fused, gold, questions)
    report["maps"] = {
        "evaluator": evaluator_score.as_dict(),
        "fused": fused_score.as_dict() if fused_score else None,
        "fused_fit_pairs": len(fit_rows),
    }
    shipped, why = _pick(candidates, choice)
    crag.grading.use(
        shipped,
        evaluator if shipped != "llm" else None,
        evaluator_score if shipped != "llm" else None,
        fused_score if shipped == "fused" else None,
    )
    return GradeSourceChoice({**report, "shipped": shipped, "why": why}, evaluator)


def program_grades(
    crag: Any,
    val: list[dspy.Example],
    embedder: Embedder,
    *,
    grader: Judge | None = None,
    progress: bool = True,
) -> list[float | None]:
    """What ``crag`` grades each (question, document) example, through its grade source, as
    the :class:`~crag_dspy.stages.Grade` stage would with the pair's
    retrieval similarity; the LLM judge (``crag.grader`` unless ``grader`` stands in for it, e.g. one
    that shares judgements) is asked only when the grade source uses it."""
    from .measure import judge_outcomes

    grading = crag.grading
    outcomes = (
        judge_outcomes(grader or crag.grader, val, desc="grader", progress=progress)
        if grading.uses_llm
        else [None] * len(val)
    )
    logits = grading.evaluator_logits_for([(e.question, e.document) for e in val])
    similarities = retrieval_similarities(embedder, val) if grading.mode == "fused" else [0.0] * len(val)
    return [
        grading.combine(
            j.score if j else None,
            j.score_source if j else "evaluator",
            None if logits is None else logits[i],
            sim,
        ).score
        for i, (j, sim) in enumerate(zip(outcomes, similarities))
    ]


def evaluator_on_strips(evaluator: PairScorer, val: list[dspy.Example]) -> dict[str, Any]:
    """How well the grader's evaluator ranks the strip filter's val pairs (could one model serve both?)."""
    gold = [int(bool(e.keep)) for e in val]
    logits = evaluator.logits([(e.question, e.strip) for e in val])
    report = measured(logits, gold, [e.question for e in val])
    # Its logits are not probabilities: only the ranking (ROC AUC) is comparable with the strip filter.
    return {"n": report["n"], "roc_auc": report["roc_auc"], "roc_auc_ci": report["roc_auc_ci"]}


def _pick(candidates: dict[str, dict[str, Any]], choice: str) -> tuple[str, str]:
    floor = candidates["llm (uncompiled)"]["accuracy"]
    if choice != "auto":
        if choice not in candidates:
            raise ValueError(f"--grader {choice}: that candidate could not be built (see the report)")
        worse = candidates[choice]["accuracy"] < floor
        return choice, f"--grader {choice}" + (" (below the uncompiled LLM judge on val)" if worse else "")
    eligible = [name for name in _COST_ORDER if name in candidates and candidates[name]["accuracy"] >= floor]
    best = max(
        eligible,
        key=lambda name: (candidates[name]["accuracy"], -_COST_ORDER.index(name)),
    )
    acc = candidates[best]["accuracy"]
    others = ", ".join(
        f"{name} {candidates[name]['accuracy']:.1%}"
        for name in _COST_ORDER
        if name in candidates and name != best
    )
    return best, f"highest val accuracy ({acc:.1%}; {others}); ties go to fewer LM calls"
