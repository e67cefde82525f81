"""``python -m optimize.compile``: learn a domain's CRAG prompts and thresholds into one program JSON.

Steps: load and (re)ingest the domain; compile the grader and the strip filter with a DSPy
teleprompter on the labelled relevance data (val accuracy before and after); optionally compile the
rewriter and answerer end to end; tune (lower, upper) jointly with Optuna on cached QA-val routes;
evaluate on the QA test split next to the uncompiled program and plain RAG; write the program JSON,
a markdown + JSON report and a PNG of the accuracy landscape.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dspy

from crag_dspy.app import assemble
from crag_dspy.baselines import PlainRAG
from crag_dspy.cli import add_lm_arguments, add_storage_arguments, settings_from_args, user_error_types
from crag_dspy.domain import Domain, DomainDataError, QAPair, load_domain
from crag_dspy.embeddings import bundled_model_path
from crag_dspy.faults import CRAGRunError, LMDownError, describe_error, raise_if_lm_down, watch_lm
from crag_dspy.judges.calibration import Calibration, fit_calibration
from crag_dspy.judges.evaluator import TrainingConfig, check_encoder_folder
from crag_dspy.judges.llm import BinaryJudge, Judgement
from crag_dspy.lm import build_lm, describe_engine, lm_identity
from crag_dspy.module import CRAG
from crag_dspy.program import save_program
from crag_dspy.redaction import configure_logging, redact
from crag_dspy.settings import Settings
from crag_dspy.store import ingest_domain
from crag_dspy.trace import usage_from_tracker

from .data_needs import guidance, shortfalls
from .datasets import (
    interleave_balanced,
    qa_examples,
    qa_split,
    relevance_examples,
    spread,
    strip_examples,
)
from .grade_source import GRADER_CHOICES, JudgeScores, choose_grade_source, evaluator_on_strips
from .measure import evaluate_program, judge_outcomes
from .metrics import answer_matches, beats_beyond_noise, binary_report, wilson_interval
from .parallel import check_num_threads, map_questions
from .report import plot_landscape, write_report
from .shared_work import CRAGPieces, SharedWork
from .teleprompters import OPTIMIZERS, compile_stage, judge_metric
from .thresholds import (
    QuestionRoutes,
    TuningResult,
    accuracy_landscape,
    precompute_routes,
    routes_fingerprint,
    tune_thresholds,
)
from .variants import INTERNAL_RETRY_ROUNDS, Variant, run_variant

__all__ = ["compile_program", "main"]

log = logging.getLogger(__name__)
STAGES = ("grader", "strips", "rewriter", "answerer", "retry")
GENERATORS = ("rewriter", "answerer")


class _StageClock:
    """Wall seconds of each compile stage since the previous one, for the report: where the time goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._last, 1)
        self._last = now


def _compile_judge(
    crag: CRAG,
    name: str,
    train: list[dspy.Example],
    val: list[dspy.Example],
    label: str,
    *,
    optimizer: str,
    demos: int,
    calibration_pairs: int,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """Compile one yes/no judge in place and return its val metrics before and after.

    Candidates: the zero-shot prompt and (unless ``optimizer`` is "none") the teleprompter's few-shot
    prompt, each with a calibration of its P(yes) fitted on held-out train examples, and with one that
    also weighs the lexical evidence of the judged text (``+ evidence``). Each prompt's LM answers are
    computed once; the calibrations rescore them. The best on val is shipped, and only if it is at least
    as good as the uncompiled judge: small models can get worse with demos (the 1.5B turns into a
    yes-sayer, docs/compile.md), and a compile must never ship a judge worse than its starting point.
    The winner's state is copied into ``crag``'s own bare predictor instead of assigning a compiled
    module, so its demos are saved with the program (DSPy skips compiled sub-modules when saving).
    """
    judge = getattr(crag, name)
    uncompiled_state = judge.dump_state()
    gold = [int(bool(e[label])) for e in val]
    before_outcomes = judge_outcomes(judge, val, desc=f"{name} val (before)", progress=progress)
    before = binary_report([j.score for j in before_outcomes], gold)
    candidates: dict[str, dict[str, Any]] = {}
    plans = ["zero-shot"] + (["few-shot"] if optimizer != "none" and demos > 0 else [])
    for plan in plans:
        judge.load_state(uncompiled_state)
        if plan == "few-shot":
            compiled = compile_stage(
                judge,
                train,
                optimizer=optimizer,
                metric=judge_metric(label),
                demos=demos,
                seed=seed,
                valset=val,
            )
            judge.predict.load_state(compiled.predict.dump_state())
        held_out = _held_out(judge, train, calibration_pairs)
        fit_on = judge_outcomes(judge, held_out, desc=f"calibrate {name} ({plan})", progress=progress)
        # The uncompiled prompt's val answers are the ones measured above: not asked for twice.
        on_val = (
            before_outcomes
            if plan == "zero-shot"
            else judge_outcomes(judge, val, desc=f"{name} val ({plan})", progress=progress)
        )
        if plan == "zero-shot":
            uncompiled_scores = {"val": [j.score for j in on_val], "held_out": held_out}
            uncompiled_scores["held_out_scores"] = [j.score for j in fit_on]
        for evidence in (False, True):
            calibration = _fit_calibration(judge, held_out, fit_on, label, evidence=evidence)
            scores = [judge.rescore(j, e.inputs()) for j, e in zip(on_val, val, strict=True)]
            candidates[plan + (" + evidence" if evidence else "")] = {
                "demos": len(judge.predict.demos),
                "calibration": calibration,
                "val": binary_report(scores, gold).as_dict(),
                "state": judge.dump_state(),
                "scores": {
                    "val": scores,
                    "held_out": held_out,
                    "held_out_scores": [judge.rescore(j, e.inputs()) for j, e in zip(fit_on, held_out)],
                },
            }
    # Ties go to the earlier (cheaper, zero-shot; then without evidence) candidate.
    best = max(candidates, key=lambda plan: candidates[plan]["val"]["accuracy"])
    kept = best if candidates[best]["val"]["accuracy"] >= before.accuracy else "uncompiled"
    judge.load_state(uncompiled_state if kept == "uncompiled" else candidates[best]["state"])
    if kept == "uncompiled":
        log.warning(
            "%s: no compiled candidate beats the uncompiled judge on val (%.3f < %.3f); keeping it",
            name,
            candidates[best]["val"]["accuracy"],
            before.accuracy,
        )
    kept_scores = uncompiled_scores if kept == "uncompiled" else candidates[kept]["scores"]
    for candidate in candidates.values():
        candidate.pop("state")
        candidate.pop("scores")
    return {
        # For the grade-source stage (popped before the report is written): the shipped judge's scores.
        "_scores": JudgeScores(
            kept_scores["val"],
            kept_scores["held_out"],
            kept_scores["held_out_scores"],
            uncompiled_scores["val"],
        ),
        "train": len(train),
        "val": len(val),
        "demos": len(judge.predict.demos),
        "calibration": candidates[kept]["calibration"] if kept != "uncompiled" else None,
        "before": before.as_dict(),
        "after": candidates[kept]["val"] if kept != "uncompiled" else before.as_dict(),
        "kept": kept,
        "candidates": candidates,
    }


def _question(example: dspy.Example) -> str:
    return example.question


def _held_out(judge: BinaryJudge, train: list[dspy.Example], pairs: int) -> list[dspy.Example]:
    """The first ``pairs`` train examples that are not among the judge's demos (those it has seen answered)."""
    fields = list(judge.predict.signature.input_fields)
    shown = {tuple(str(demo.get(f)) for f in fields) for demo in judge.predict.demos}
    return [e for e in train if tuple(str(e.get(f)) for f in fields) not in shown][: max(pairs, 0)]


def _fit_calibration(
    judge: BinaryJudge,
    held_out: list[dspy.Example],
    outcomes: list[Judgement],
    label: str,
    *,
    evidence: bool,
) -> dict[str, Any]:
    """Fit ``judge.calibration`` on the LM's P(yes) for held-out train examples (and, with ``evidence``,
    on the lexical evidence of each); returns what was fitted, or why nothing was."""
    judge.calibration = Calibration()
    if not held_out:
        return {"fitted": False, "reason": "no held-out train examples to fit on", "pairs": 0}
    raw = [j.raw_score if j.score_source == "logprobs" else None for j in outcomes]
    features = [judge.evidence(e.inputs(), weighed_only=False) for e in held_out] if evidence else None
    try:
        judge.calibration = fit_calibration(raw, [int(bool(e[label])) for e in held_out], features)
    except ValueError as exc:
        log.warning("%s calibration not fitted: %s", "evidence" if evidence else "P(yes)", exc)
        return {"fitted": False, "reason": str(exc), "pairs": len(held_out)}
    full = dict.fromkeys(judge.calibration.weights, 1.0)
    return {
        "fitted": True,
        "pairs": len(held_out),
        **judge.calibration.dump_state(),
        # Where P(yes) is cut for a text that holds all the question's terms and numbers.
        "cut": judge.calibration.cut(full),
    }


def _compile_generation(crag: CRAG, domain: Domain, *, stages: set[str], demos: int, progress: bool) -> dict:
    """Bootstrap demos for the rewriter and/or answerer from QA-train runs the gold answers accept."""
    train = qa_examples(domain, "train")
    teleprompter = dspy.teleprompt.BootstrapFewShot(
        metric=lambda ex, pred, trace=None: answer_matches(pred.answer, ex.answers),
        max_bootstrapped_demos=demos,
        max_labeled_demos=0,
        max_errors=len(train),
    )
    compiled = teleprompter.compile(crag.deepcopy(), trainset=train)
    copied = {}
    for name in GENERATORS:
        if name in stages:
            getattr(crag, name).load_state(getattr(compiled, name).dump_state())
            copied[name] = len(getattr(crag, name).demos)
    return copied


def _tuned_on_routes(
    crag: CRAG,
    lm: dspy.BaseLM,
    domain: Domain,
    val_questions: list[QAPair],
    *,
    out: Path,
    seed: int,
    progress: bool,
    num_threads: int = 1,
    work: SharedWork | None = None,
) -> tuple[list[QuestionRoutes], TuningResult, int, int]:
    """``crag``'s routes for the val questions and the thresholds tuned on them (not applied to ``crag``),
    with the LM calls made by the trials (0 expected) and by the precomputation."""
    routes, precompute_usage = precompute_routes(
        crag, val_questions, progress=progress, num_threads=num_threads, work=work
    )
    calls_before = len(lm.history)
    with dspy.track_usage() as trial_tracker:
        tuned = tune_thresholds(
            routes,
            seed=seed,
            storage=out.with_suffix(".optuna.log"),
            # Keyed by the routes: a study tuned on other grades or answers (changed data, prompts or
            # calibration) must not be resumed as if its trials still scored the same.
            study_name=f"{domain.name}-thresholds-seed{seed}-{routes_fingerprint(routes)}",
        )
    # Two independent counts of LM requests made while trials ran: the LM's history and DSPy's tracker.
    trial_calls = len(lm.history) - calls_before + usage_from_tracker(trial_tracker).calls
    return routes, tuned, trial_calls, precompute_usage.calls


def _tune(
    crag: CRAG,
    lm: dspy.BaseLM,
    domain: Domain,
    *,
    out: Path,
    seed: int,
    val_limit: int | None,
    progress: bool,
    num_threads: int = 1,
    work: SharedWork | None = None,
    without_generation: CRAG | None = None,
) -> dict[str, Any]:
    """Precompute every QA-val question's routes once, tune the thresholds on them, plot the landscape.

    With ``without_generation`` (the program before its rewriter/answerer demos were bootstrapped), both
    programs are tuned on the same val questions and ``crag`` keeps its demos only if they score higher:
    they are chosen for answering some train questions right, not for answering val better, and they
    lengthen every rewrite and answer prompt. The judges' calls are shared (same prompts, DSPy's cache).
    """
    val_questions = qa_split(domain, "val", val_limit)
    tuning = {"out": out, "seed": seed, "progress": progress, "num_threads": num_threads, "work": work}
    routes, tuned, trial_calls, precompute_calls = _tuned_on_routes(crag, lm, domain, val_questions, **tuning)
    generation = None
    if without_generation is not None:
        base_routes, base, base_trial_calls, base_precompute_calls = _tuned_on_routes(
            without_generation, lm, domain, val_questions, **tuning
        )
        trial_calls += base_trial_calls
        precompute_calls += base_precompute_calls
        keep = tuned.accuracy > base.accuracy  # a tie goes to the shorter prompts
        generation = {
            "val_accuracy": {"with demos": tuned.accuracy, "without demos": base.accuracy},
            "kept": "with demos" if keep else "without demos",
        }
        if not keep:
            log.warning(
                "rewriter/answerer demos did not raise val accuracy (%.3f vs %.3f without); not shipping them",
                tuned.accuracy,
                base.accuracy,
            )
            for name in GENERATORS:
                getattr(crag, name).load_state(getattr(without_generation, name).dump_state())
            routes, tuned = base_routes, base
    crag.thresholds.load_state(
        {
            "lower": tuned.lower,
            "upper": tuned.upper,
            "by_type": {k: list(v) for k, v in tuned.by_type.items()},
        }
    )
    axis, grid = accuracy_landscape(routes)
    plot = plot_landscape(
        axis,
        grid,
        (tuned.lower, tuned.upper),
        (0.3, 0.7),
        out.with_suffix(".landscape.png"),
        f"{domain.name}: val accuracy over thresholds",
    )
    result = {
        **tuned.as_dict(),
        "questions": len(routes),
        "failed": [{"id": r.question_id, "error": r.error} for r in routes if r.error],
        "plot": str(plot),
        "lm_calls_during_trials": trial_calls,
        "precompute_lm_calls": precompute_calls,
        "landscape": {"axis": axis, "grid": grid},
    }
    if generation is not None:
        result["generation"] = generation
    return result


def _internal_retry_stage(
    crag: CRAG,
    domain: Domain,
    val_limit: int | None,
    progress: bool,
    num_threads: int = 1,
    work: SharedWork | None = None,
) -> dict[str, Any]:
    """Answer the QA-val questions with and without rewrite-and-retry rounds on the internal store
    (:mod:`crag_dspy.retry`) and ship the rounds only when they beat none beyond noise (exact McNemar,
    p < 0.05, more questions right). Both share every piece (grades, web query, web knowledge), and
    with ``work`` the threshold stage's pieces too."""
    questions = qa_split(domain, "val", val_limit)
    pieces = {"main": CRAGPieces(crag, work if work is not None else SharedWork())}

    def right(q: QAPair) -> tuple[bool, bool, list[dict[str, Any]]]:
        results, failed = [], []
        for rounds in (0, INTERNAL_RETRY_ROUNDS):
            raise_if_lm_down()
            try:
                outcome = run_variant(Variant("CRAG", internal_retries=rounds), q.question, pieces, None)
                results.append(answer_matches(outcome.answer, q.answers))
            except CRAGRunError as exc:  # wrong either way, like a failed question in the evaluation
                raise_if_lm_down()  # unless the LM is down: then the run stops
                log.warning("question %s failed with %d retry rounds: %s", q.id, rounds, describe_error(exc))
                results.append(False)
                failed.append({"id": q.id, "rounds": rounds, "error": describe_error(exc)})
        return results[0], results[1], failed

    outcomes = map_questions(
        right, questions, num_threads=num_threads, desc="internal retry (val)", progress=progress
    )
    without, with_retry = [a for a, _, _ in outcomes], [b for _, b, _ in outcomes]
    ship, p = beats_beyond_noise(with_retry, without)
    if ship:
        crag.config = crag.config.replace(internal_retries=INTERNAL_RETRY_ROUNDS)
    n = len(questions)
    return {
        "rounds": INTERNAL_RETRY_ROUNDS,
        "questions": n,
        "right": {"without": sum(without), "with": sum(with_retry)},
        "intervals": {
            "without": wilson_interval(sum(without), n),
            "with": wilson_interval(sum(with_retry), n),
        },
        "p": p,
        "failed": [f for _, _, failed in outcomes for f in failed],
        "shipped": ship,
        "why": (
            f"{sum(with_retry)} vs {sum(without)} of {n} val questions right with {INTERNAL_RETRY_ROUNDS} rounds "
            f"(McNemar p={p:.3f}): " + ("a gain beyond noise" if ship else "no measured gain; not shipped")
        ),
    }


def compile_program(
    settings: Settings,
    *,
    lm: dspy.BaseLM | None = None,
    optimizer: str = "none",
    demos: int = 4,
    calibration_pairs: int = 64,
    thresholds: bool = True,
    seed: int = 0,
    stages: tuple[str, ...] = ("grader", "strips"),
    out: Path | None = None,
    val_limit: int | None = None,
    judge_val_limit: int | None = 80,
    test_limit: int | None = None,
    evaluate_test: bool = True,
    grader: str = "auto",
    evaluator_base: Path | None = None,
    evaluator_training: TrainingConfig | None = None,
    progress: bool = True,
    num_threads: int = 1,
) -> dict[str, Any]:
    """Compile the domain of ``settings`` and write the program JSON and report; returns the report."""
    started = time.perf_counter()
    clock = _StageClock()
    # The engine's build is recorded only when this compile runs the embedded model itself.
    if "grader" in stages and grader != "llm":
        check_encoder_folder(evaluator_base or bundled_model_path())  # before the LM starts
    runs_embedded = lm is None and settings.lm == "embedded"
    domain = load_domain(settings.resolved_domain_dir)  # a bad domain fails before the LM starts
    spp = domain.config.crag_config(settings.config).sentences_per_strip
    missing = shortfalls(domain, stages, thresholds=thresholds, test=evaluate_test, sentences_per_strip=spp)
    if missing:  # before any LM call: a compile on nothing would start the model to fail late
        raise DomainDataError(guidance(domain.root, missing))
    lm = lm or build_lm(settings)
    crag, backends = assemble(settings, lm, progress, domain=domain)
    ingest_domain(backends.client, domain, backends.embedder, progress=progress)  # refresh if data changed
    out = out or Path("runs") / domain.name / "program.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "domain": domain.name,
        "lm": getattr(lm, "model", lm_identity(settings)),
        "optimizer": optimizer,
        "seed": seed,
        "stages": {},
    }
    if runs_embedded:
        engine = describe_engine(engine=settings.embedded_engine)
        if engine is not None:
            report["engine"] = engine.as_dict()
            if engine.hint:
                log.warning("%s", engine.hint)
    uncompiled = crag.deepcopy()
    clock.lap("setup")  # the LM, the store, ingestion

    evaluator = None
    # watch_lm: a question that fails is counted wrong, but an LM that is down stops the compile.
    with dspy.track_usage() as tracker, dspy.context(lm=lm), watch_lm():
        if "grader" in stages:
            train = interleave_balanced(relevance_examples(domain.relevance, "train"), "relevant", seed)
            val = spread(relevance_examples(domain.relevance, "val"), _question, judge_val_limit)
            report["stages"]["grader"] = _compile_judge(
                crag,
                "grader",
                train,
                val,
                "relevant",
                optimizer=optimizer,
                demos=demos,
                calibration_pairs=calibration_pairs,
                seed=seed,
                progress=progress,
            )
            clock.lap("grader")
            report["stages"]["grade_source"] = choose_grade_source(
                crag,
                train,
                val,
                report["stages"]["grader"].pop("_scores"),
                choice=grader,
                base=evaluator_base or bundled_model_path(),
                config=(evaluator_training or TrainingConfig()).model_copy(update={"seed": seed}),
                embedder=backends.embedder,
                cache_dir=settings.cache_dir / "evaluators",
                progress=progress,
            )
            evaluator = report["stages"]["grade_source"].pop("_evaluator", None)
            clock.lap("grade source")
        if "strips" in stages:
            spp = crag.config.sentences_per_strip
            train = interleave_balanced(strip_examples(domain, "train", spp), "keep", seed)
            val = spread(strip_examples(domain, "val", spp), _question, judge_val_limit)
            report["stages"]["strip_filter"] = _compile_judge(
                crag,
                "strip_filter",
                train,
                val,
                "keep",
                optimizer=optimizer,
                demos=demos,
                calibration_pairs=calibration_pairs,
                seed=seed,
                progress=progress,
            )
            report["stages"]["strip_filter"].pop("_scores")
            if evaluator is not None:
                report["stages"]["strip_filter"]["grader_evaluator"] = evaluator_on_strips(evaluator, val)
            clock.lap("strip filter")
        without_generation = None
        # The QA-val pieces (grades, knowledge, answers) the threshold and retry stages both use.
        work = SharedWork()
        if set(GENERATORS) & set(stages):
            before_generation = crag.deepcopy()
            bootstrapped = _compile_generation(
                crag, domain, stages=set(stages), demos=demos, progress=progress
            )
            raise_if_lm_down()  # the bootstrap counts failed examples as errors and goes on
            report["stages"]["generation"] = {"demos": bootstrapped, "kept": "no demos bootstrapped"}
            if any(bootstrapped.values()):
                without_generation = before_generation
                report["stages"]["generation"]["kept"] = "with demos (not checked on val: --no-thresholds)"
            clock.lap("rewriter/answerer bootstrap")

        if thresholds:  # --no-thresholds keeps the current ones and skips the route precomputation
            report["thresholds"] = _tune(
                crag,
                lm,
                domain,
                out=out,
                seed=seed,
                val_limit=val_limit,
                progress=progress,
                num_threads=num_threads,
                work=work,
                without_generation=without_generation,
            )
            if "generation" in report["thresholds"]:
                report["stages"]["generation"].update(report["thresholds"].pop("generation"))
            clock.lap("thresholds")
        elif without_generation is not None:
            log.warning("--no-thresholds: the rewriter/answerer demos ship without a check on QA val")
        if "retry" in stages:
            report["internal_retry"] = _internal_retry_stage(
                crag, domain, val_limit, progress, num_threads, work
            )
            clock.lap("internal retry")
        if evaluate_test:
            test = qa_examples(domain, "test", test_limit)
            results = [
                evaluate_program("CRAG (compiled)", crag, test, progress=progress),
                evaluate_program("CRAG (uncompiled)", uncompiled, test, progress=progress),
                evaluate_program(
                    "plain RAG",
                    PlainRAG(
                        crag.retriever,
                        lm=lm,
                        k=crag.config.k,
                        answer_units=crag.config.answer_units,
                    ),
                    test,
                    progress=progress,
                ),
            ]
            report["test"] = [{**asdict(r), "usage": r.usage.model_dump()} for r in results]
            clock.lap("test")

    report["lm_usage"] = usage_from_tracker(tracker).model_dump()
    report["thresholds_used"] = crag.thresholds.dump_state()
    report["seconds"] = time.perf_counter() - started
    report["stage_seconds"] = clock.seconds
    metadata = {
        # The domain's name and data, not its folder: the app that loads the program names the folder.
        "domain": domain.name,
        "dataset_hashes": domain.file_hashes(),
        "lm": report["lm"],
        "optimizer": optimizer,
        "seed": seed,
        "stages": list(stages),
        "scores": {
            # val metrics of the judge states actually saved
            "grader": report["stages"].get("grader", {}).get("after"),
            "strip_filter": report["stages"].get("strip_filter", {}).get("after"),
            "val_accuracy": report.get("thresholds", {}).get("accuracy"),
            "test": {r["name"]: r["accuracy"] for r in report.get("test", [])},
        },
    }
    save_program(crag, out, metadata)
    report["program"] = str(out)
    write_report(report, out)
    return report


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``minimum``. A count below it means nothing
    (``--demos -1``, ``--evaluator-epochs 0``) and is refused with argparse's one-line usage error
    instead of reaching the compile, where a negative limit would silently drop examples."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m optimize.compile", description=__doc__.split("\n\n")[0])
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="none",
        help="DSPy teleprompter proposing few-shot grader/strip-filter prompts; the zero-shot prompt is "
        "always a candidate and the best on val ships (default: none = zero-shot + calibration, chosen by "
        "measurement: on the embedded 1.5B every few-shot candidate scored lower, see docs/compile.md)",
    )
    parser.add_argument("--demos", type=at_least(0), default=4, help="few-shot demos per predictor")
    parser.add_argument(
        "--calibration-pairs",
        type=at_least(0),
        default=64,
        help="held-out train examples per judge to fit its calibrations on (0: no calibration)",
    )
    parser.add_argument(
        "--stages",
        default="grader,strips",
        help=f"comma-separated subset of {','.join(STAGES)} (rewriter/answerer: demos bootstrapped from QA "
        "train, shipped only if they raise QA-val accuracy)",
    )
    parser.add_argument(
        "--no-thresholds",
        action="store_true",
        help="keep the current thresholds: skip the QA-val route precomputation and the exact search",
    )
    parser.add_argument(
        "--grader",
        choices=GRADER_CHOICES,
        default="auto",
        help="where document grades come from: the LLM judge, a cross-encoder trained on the relevance "
        "pairs (evaluator), or both fused with the retrieval similarity; auto ships the best on val, "
        "never one below the uncompiled LLM judge (default: auto; docs/evaluator.md)",
    )
    parser.add_argument(
        "--evaluator-base",
        type=Path,
        help="local BERT-style encoder folder the evaluator is fine-tuned from (default: the bundled "
        "all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--evaluator-epochs",
        type=at_least(1),
        default=TrainingConfig().max_epochs,
        help="most evaluator epochs",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="program JSON path (default: runs/<domain>/program.json)")
    # Whole splits by default: a handful of questions cannot tell a gain from noise (docs/compile.md).
    parser.add_argument(
        "--val-limit",
        type=at_least(0),
        default=0,
        help="tune thresholds on N QA val questions, taken evenly across kinds (default 0: all; quick runs)",
    )
    parser.add_argument(
        "--judge-val-limit",
        type=at_least(0),
        default=80,
        help="measure grader and strip filter on N val examples each, whole questions spread evenly over "
        "the split (default 80; 0: all)",
    )
    parser.add_argument(
        "--test-limit",
        type=at_least(0),
        default=0,
        help="evaluate on N QA test questions, taken evenly across kinds (default 0: all; quick runs)",
    )
    parser.add_argument("--no-test-eval", action="store_true", help="skip the test-split comparison")
    parser.add_argument(
        "--num-threads",
        type=at_least(1),
        default=1,
        metavar="N",
        help="precompute N val questions' routes at a time (default: 1); faster only with a hosted LM or a "
        "server with several slots, the embedded model serves one request at a time",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)  # every handler redacts API keys
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    unknown = set(stages) - set(STAGES)
    if unknown:
        print(f"error: unknown stage(s) {sorted(unknown)}; choose from {STAGES}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
        report = compile_program(
            settings,
            optimizer=args.optimizer,
            demos=args.demos,
            calibration_pairs=args.calibration_pairs,
            thresholds=not args.no_thresholds,
            seed=args.seed,
            stages=stages,
            out=args.out,
            val_limit=args.val_limit or None,
            judge_val_limit=args.judge_val_limit or None,
            test_limit=args.test_limit or None,
            evaluate_test=not args.no_test_eval,
            num_threads=check_num_threads(args.num_threads, "--num-threads"),
            grader=args.grader,
            evaluator_base=args.evaluator_base,
            evaluator_training=TrainingConfig(max_epochs=args.evaluator_epochs),
        )
    except user_error_types() as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)  # e.g. a --chroma-host with user:password@
        return 2
    except (CRAGRunError, LMDownError) as exc:  # the LM went down mid-compile: one redacted line
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 1
    md = Path(report["program"]).with_suffix(".report.md")
    print(md.read_text(encoding="utf-8"))
    print(f"\nprogram: {report['program']}\nreport:  {md}")
    if "thresholds" in report:
        print(f"study:   optuna-dashboard {report['thresholds']['storage']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
