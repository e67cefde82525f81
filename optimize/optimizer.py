"""``CRAGOptimizer``: compile a CRAG program from lists of ``dspy.Example``, as DSPy's teleprompters do.

    >>> compiled = CRAGOptimizer(stages=("grader", "strips")).compile(
    ...     crag, trainset=qa_train, valset=qa_val, relevance=pairs)  # doctest: +SKIP

It runs the stages of ``python -m optimize.compile`` (docs/compile.md), which is a CLI over it:

1. ``grader``: the grader compiled and calibrated on the labelled relevance pairs, then the grade
   source chosen on val (LLM judge, trained evaluator or both fused);
2. ``strips``: the strip filter, on strips derived from the same pairs;
3. ``rewriter`` / ``answerer``: demos bootstrapped from ``trainset`` runs the metric accepts, kept only
   if they raise val accuracy;
4. ``thresholds`` (unless ``thresholds=False``): the exact (lower, upper) optimum on ``valset``,
   shipped only when it beats the defaults beyond noise; the val routes are replayed with the
   program's own retriever and web search;
5. ``retry``: rewrite-and-retry rounds on the internal store, shipped only with a gain beyond noise.

Example fields
--------------
QA examples (``trainset``, ``valset``): ``question`` (the input), ``answers`` (a list of gold aliases;
a single ``answer`` string is taken as one), and optionally ``id`` (names the question in the report)
and ``kind`` (``kb``, ``web``, ``both`` or ``none``: ``val_limit`` takes questions evenly across kinds,
and ``none`` questions lend no aliases to strip labels).

Relevance examples (``relevance``): ``question``, ``document`` (the passage as the grader reads it,
title on its first line), ``relevant`` (bool), ``split`` (``train`` or ``val``) and optionally
``answers``, the question's gold aliases, which label the passage's strips for the strip filter
(without them the aliases of a QA example with the same question are used).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt import Teleprompter

from crag_dspy.embeddings import Embedder, bundled_model_path
from crag_dspy.faults import CRAGRunError, describe_error, raise_if_lm_down, watch_lm
from crag_dspy.judges.calibration import Calibration, fit_calibration
from crag_dspy.judges.evaluator import TrainingConfig
from crag_dspy.judges.llm import BinaryJudge, Judgement
from crag_dspy.module import CRAG
from crag_dspy.trace import usage_from_tracker

from .datasets import interleave_balanced, round_robin, spread, strip_examples_from
from .grade_source import GRADER_CHOICES, JudgeScores, choose_grade_source, evaluator_on_strips
from .measure import judge_outcomes
from .metrics import answer_matches, beats_beyond_noise, binary_report, wilson_interval
from .parallel import map_questions
from .report import plot_landscape
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

__all__ = [
    "GENERATORS",
    "STAGES",
    "CRAGOptimizer",
    "StageClock",
    "ValQuestion",
    "answer_metric",
    "compile_judge",
    "gold_answers",
]

log = logging.getLogger(__name__)
STAGES = ("grader", "strips", "rewriter", "answerer", "retry")
GENERATORS = ("rewriter", "answerer")
Metric = Callable[..., Any]


def gold_answers(example: dspy.Example) -> list[str]:
    """A QA example's gold aliases: its ``answers``, or its ``answer`` as the only one."""
    answers = example.get("answers")
    if answers is None and example.get("answer") is not None:
        answers = [example.answer]
    if isinstance(answers, str):
        answers = [answers]
    if not answers:
        raise ValueError(
            f"QA example {example.get('question')!r} has no 'answers' (gold aliases) or 'answer'"
        )
    return list(answers)


def answer_metric(example: dspy.Example, prediction: Any, trace: Any = None) -> bool:
    """The default metric: the predicted answer matches one of the example's gold aliases
    (:func:`~optimize.metrics.answer_matches`)."""
    return answer_matches(prediction.answer, gold_answers(example))


class StageClock:
    """Wall seconds of each compile stage since the previous one, for the report: where the time goes."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = round(now - self._last, 1)
        self._last = now

    def extend(self, seconds: dict[str, float]) -> None:
        """Add laps timed by another clock that ran since this one's last lap, and go on from now."""
        self.seconds.update(seconds)
        self._last = time.perf_counter()


@dataclass(frozen=True)
class ValQuestion:
    """A QA-val question as the threshold and retry stages replay it (the fields of a
    :class:`~crag_dspy.domain.QAPair` they read), with the example the metric judges answers against."""

    id: str
    question: str
    answers: list[str]
    example: dspy.Example


class CRAGOptimizer(Teleprompter):
    """Compile a :class:`~crag_dspy.module.CRAG` program: judges, grade source, generation demos,
    thresholds and internal retries, each shipped only when it measures better on val.

    Args:
        metric: ``metric(example, prediction, trace=None)``, truthy when ``prediction.answer`` is right
            for the QA ``example``; judges bootstrapped demos, threshold routes and retries
            (default :func:`answer_metric`).
        optimizer: DSPy teleprompter proposing few-shot judge prompts (``none``: zero-shot + calibration).
        demos: few-shot demos per predictor.
        calibration_pairs: held-out train examples per judge to fit its calibrations on.
        stages: a subset of :data:`STAGES`.
        thresholds: tune (lower, upper) on ``valset``; False keeps the program's.
        grader: where grades come from (``auto``, ``llm``, ``evaluator``, ``fused``; docs/evaluator.md).
        evaluator_base, evaluator_training: the encoder the evaluator is fine-tuned from and how.
        distill: the compiled LLM judge also labels the unlabelled top-k retrieved passages of the QA
            and relevance train questions (none with val labels) for the evaluator's training: LM calls
            the evaluator then saves at run time (docs/evaluator.md, "Distilling the LLM judge").
        embedder: sentence embeddings for the retrieval similarity a fused grade weighs (default: the
            program's, else the bundled MiniLM); cache_dir: where trained evaluators are cached.
        judge_val_limit: judge val examples measured (whole questions spread over the split; None: all).
        val_limit: QA val questions the thresholds and retries are decided on, evenly across kinds.
        name: names the Optuna study (and titles the landscape plot).
        out: with a path, the Optuna journal and the accuracy landscape are written beside it
            (``PATH.optuna.log``, ``PATH.landscape.png``); None keeps the study in memory.
        num_threads: val questions routed at a time.

    After :meth:`compile`, ``report`` holds what each stage measured and shipped, and why
    (``stages``, ``thresholds``, ``internal_retry``, ``stage_seconds``), as the compile report shows it.
    """

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        optimizer: str = "none",
        demos: int = 4,
        calibration_pairs: int = 64,
        stages: Sequence[str] = ("grader", "strips"),
        thresholds: bool = True,
        grader: str = "auto",
        evaluator_base: Path | None = None,
        evaluator_training: TrainingConfig | None = None,
        distill: bool = False,
        embedder: Embedder | None = None,
        cache_dir: Path | None = None,
        judge_val_limit: int | None = 80,
        val_limit: int | None = None,
        seed: int = 0,
        name: str = "crag",
        out: Path | None = None,
        num_threads: int = 1,
        progress: bool = False,
    ):
        super().__init__()
        unknown = sorted(set(stages) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; choose from {STAGES}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose from {OPTIMIZERS}")
        if grader not in GRADER_CHOICES:
            raise ValueError(f"unknown grader {grader!r}; choose from {GRADER_CHOICES}")
        if seed < 0:  # numpy's generators refuse it, and only after the LM work of the threshold search
            raise ValueError(f"seed must be a whole number of at least 0, got {seed}")
        self.metric = metric or answer_metric
        self.optimizer, self.demos, self.calibration_pairs = optimizer, demos, calibration_pairs
        self.stages, self.thresholds, self.grader = tuple(stages), thresholds, grader
        self.evaluator_base, self.evaluator_training = evaluator_base, evaluator_training
        self.distill = distill
        self.embedder, self.cache_dir = embedder, cache_dir
        self.judge_val_limit, self.val_limit, self.seed = judge_val_limit, val_limit, seed
        self.name, self.out = name, None if out is None else Path(out)
        self.num_threads, self.progress = num_threads, progress
        self.report: dict[str, Any] = {}

    def compile(
        self,
        student: CRAG,
        *,
        trainset: Sequence[dspy.Example] | None = None,
        valset: Sequence[dspy.Example] | None = None,
        relevance: Sequence[dspy.Example] | None = None,
        teacher: Any = None,
    ) -> CRAG:
        """A compiled copy of ``student`` (left as it is): QA ``trainset`` and ``valset``, labelled
        ``relevance`` pairs (fields: the module docstring). The LM is the student's, else
        ``dspy.settings.lm``; the threshold and retry stages search with the student's retriever and
        web search. Raises ValueError when a stage's data are missing, before any LM call."""
        if teacher is not None:
            raise ValueError("CRAGOptimizer takes no teacher: every stage measures the student itself")
        lm = student.lm or dspy.settings.lm
        if lm is None:
            raise ValueError("no LM: pass lm= to CRAG or configure one with dspy.configure(lm=...)")
        stages = set(self.stages)
        # In the order the compile always took them: evenly across kinds.
        train = round_robin(list(trainset or []), _kind)
        val = round_robin(list(valset or []), _kind, self.val_limit)
        relevance_train, relevance_val = _relevance_splits(relevance or [])
        self._check_data(stages, train, val, relevance_train, relevance_val)
        program = student.deepcopy()
        clock = StageClock()
        report: dict[str, Any] = {"stages": {}}
        self.report = report
        with dspy.context(lm=lm), watch_lm():
            evaluator = None
            if "grader" in stages:
                judge_train = interleave_balanced(
                    [_graded(e) for e in relevance_train], "relevant", self.seed
                )
                judge_val = spread([_graded(e) for e in relevance_val], _question, self.judge_val_limit)
                report["stages"]["grader"] = self._judge(
                    program, "grader", judge_train, judge_val, "relevant"
                )
                clock.lap("grader")
                report["stages"]["grade_source"] = choose_grade_source(
                    program,
                    judge_train,
                    judge_val,
                    report["stages"]["grader"].pop("_scores"),
                    choice=self.grader,
                    base=self.evaluator_base or bundled_model_path(),
                    config=(self.evaluator_training or TrainingConfig()).model_copy(
                        update={"seed": self.seed}
                    ),
                    embedder=self.embedder or program.embedder or Embedder(),
                    cache_dir=self.cache_dir,
                    distill=self._distill_questions(train, relevance_train, relevance_val),
                    progress=self.progress,
                )
                evaluator = report["stages"]["grade_source"].pop("_evaluator", None)
                clock.lap("grade source")
            if "strips" in stages:
                aliases = _aliases(relevance or [], [*(trainset or []), *(valset or [])])
                spp = program.config.sentences_per_strip
                strips_train = strip_examples_from(_pairs(relevance_train), aliases, spp)
                strips_val = strip_examples_from(_pairs(relevance_val), aliases, spp)
                judge_train = interleave_balanced(strips_train, "keep", self.seed)
                judge_val = spread(strips_val, _question, self.judge_val_limit)
                report["stages"]["strip_filter"] = self._judge(
                    program, "strip_filter", judge_train, judge_val, "keep"
                )
                report["stages"]["strip_filter"].pop("_scores")
                if evaluator is not None:
                    report["stages"]["strip_filter"]["grader_evaluator"] = evaluator_on_strips(
                        evaluator, judge_val
                    )
                clock.lap("strip filter")
            without_generation = None
            # The QA-val pieces (grades, knowledge, answers) the threshold and retry stages both use.
            work = SharedWork()
            if set(GENERATORS) & stages:
                before_generation = program.deepcopy()
                bootstrapped = self._generation(program, train, stages)
                raise_if_lm_down()  # the bootstrap counts failed examples as errors and goes on
                report["stages"]["generation"] = {"demos": bootstrapped, "kept": "no demos bootstrapped"}
                if any(bootstrapped.values()):
                    without_generation = before_generation
                    report["stages"]["generation"]["kept"] = (
                        "with demos (not checked on val: --no-thresholds)"
                    )
                clock.lap("rewriter/answerer bootstrap")
            questions = [self._val_question(e, i) for i, e in enumerate(val)]
            if self.thresholds:  # False keeps the current thresholds and skips the route precomputation
                report["thresholds"] = self._tune(program, lm, questions, work, without_generation)
                if "generation" in report["thresholds"]:
                    report["stages"]["generation"].update(report["thresholds"].pop("generation"))
                clock.lap("thresholds")
            elif without_generation is not None:
                log.warning("--no-thresholds: the rewriter/answerer demos ship without a check on QA val")
            if "retry" in stages:
                report["internal_retry"] = self._internal_retry(program, questions, work)
                clock.lap("internal retry")
        report["stage_seconds"] = clock.seconds
        return program

    # -- data -----------------------------------------------------------------------------------------
    def _check_data(
        self,
        stages: set[str],
        train: list[dspy.Example],
        val: list[dspy.Example],
        relevance_train: list[dspy.Example],
        relevance_val: list[dspy.Example],
    ) -> None:
        needs = []
        if stages & {"grader", "strips"} and not (relevance_train and relevance_val):
            needs.append(
                f"relevance pairs of both splits (train: {len(relevance_train)}, val: {len(relevance_val)})"
            )
        if stages & set(GENERATORS) and not train:
            needs.append("a QA trainset")
        if (self.thresholds or "retry" in stages) and not val:
            needs.append("a QA valset (thresholds=False and no retry stage need none)")
        if needs:
            raise ValueError(f"stages {sorted(stages)} need {', '.join(needs)}")
        for example in [*train, *val]:
            gold_answers(example)  # every QA example has its gold answers, checked before any LM call

    def _distill_questions(
        self,
        train: list[dspy.Example],
        relevance_train: list[dspy.Example],
        relevance_val: list[dspy.Example],
    ) -> list[str]:
        """With ``distill``, the train questions whose passages the LLM judge may label: the QA and
        relevance train questions, none that val labels (their pairs must stay unseen)."""
        if not self.distill:
            return []
        in_val = {e.question for e in relevance_val}
        questions = [e.question for e in [*train, *relevance_train]]
        return [q for q in dict.fromkeys(questions) if q not in in_val]

    def _val_question(self, example: dspy.Example, index: int) -> ValQuestion:
        return ValQuestion(
            str(example.get("id") or f"val-{index}"), example.question, gold_answers(example), example
        )

    def _right(self, question: ValQuestion, answer: str) -> bool:
        return bool(self.metric(question.example, dspy.Prediction(answer=answer)))

    # -- stages ---------------------------------------------------------------------------------------
    def _judge(
        self, program: CRAG, name: str, train: list[dspy.Example], val: list[dspy.Example], label: str
    ) -> dict[str, Any]:
        return compile_judge(
            program,
            name,
            train,
            val,
            label,
            optimizer=self.optimizer,
            demos=self.demos,
            calibration_pairs=self.calibration_pairs,
            seed=self.seed,
            progress=self.progress,
        )

    def _generation(self, program: CRAG, train: list[dspy.Example], stages: set[str]) -> dict[str, int]:
        """Bootstrap demos for the rewriter and/or answerer from train runs the metric accepts."""
        teleprompter = dspy.teleprompt.BootstrapFewShot(
            metric=self.metric,
            max_bootstrapped_demos=self.demos,
            max_labeled_demos=0,
            max_errors=len(train),
        )
        compiled = teleprompter.compile(program.deepcopy(), trainset=train)
        copied = {}
        for name in GENERATORS:
            if name in stages:
                getattr(program, name).load_state(getattr(compiled, name).dump_state())
                copied[name] = len(getattr(program, name).demos)
        return copied

    def _tuned_on_routes(
        self, program: CRAG, lm: dspy.BaseLM, questions: list[ValQuestion], work: SharedWork
    ) -> tuple[list[QuestionRoutes], TuningResult, int, int]:
        """``program``'s routes for the val questions and the thresholds tuned on them (not applied),
        with the LM calls made by the trials (0 expected) and by the precomputation."""
        routes, precompute_usage = precompute_routes(
            program,
            questions,  # type: ignore[arg-type] - a ValQuestion has the QAPair fields the routes read
            progress=self.progress,
            num_threads=self.num_threads,
            work=work,
            correct=self._right,
        )
        calls_before = len(lm.history)
        with dspy.track_usage() as trial_tracker:
            tuned = tune_thresholds(
                routes,
                seed=self.seed,
                storage=self.out.with_suffix(".optuna.log") if self.out else None,
                # Keyed by the routes: a study tuned on other grades or answers (changed data, prompts or
                # calibration) must not be resumed as if its trials still scored the same.
                study_name=f"{self.name}-thresholds-seed{self.seed}-{routes_fingerprint(routes)}",
            )
        # Two independent counts of LM requests made while trials ran: the LM's history and DSPy's tracker.
        trial_calls = len(lm.history) - calls_before + usage_from_tracker(trial_tracker).calls
        return routes, tuned, trial_calls, precompute_usage.calls

    def _tune(
        self,
        program: CRAG,
        lm: dspy.BaseLM,
        questions: list[ValQuestion],
        work: SharedWork,
        without_generation: CRAG | None,
    ) -> dict[str, Any]:
        """Precompute every val question's routes once, tune the thresholds on them, plot the landscape.

        With ``without_generation`` (the program before its rewriter/answerer demos were bootstrapped),
        both programs are tuned on the same val questions and ``program`` keeps its demos only if they
        score higher: they are chosen for answering some train questions right, not for answering val
        better, and they lengthen every rewrite and answer prompt. The judges' calls are shared.
        """
        if not questions:
            raise ValueError("the thresholds stage needs a QA valset (or thresholds=False)")
        routes, tuned, trial_calls, precompute_calls = self._tuned_on_routes(program, lm, questions, work)
        generation = None
        if without_generation is not None:
            base_routes, base, base_trial_calls, base_precompute_calls = self._tuned_on_routes(
                without_generation, lm, questions, work
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
                    getattr(program, name).load_state(getattr(without_generation, name).dump_state())
                routes, tuned = base_routes, base
        program.thresholds.load_state(
            {
                "lower": tuned.lower,
                "upper": tuned.upper,
                "by_type": {k: list(v) for k, v in tuned.by_type.items()},
            }
        )
        axis, grid = accuracy_landscape(routes)
        plot = None
        if self.out is not None:
            plot = plot_landscape(
                axis,
                grid,
                (tuned.lower, tuned.upper),
                (0.3, 0.7),
                self.out.with_suffix(".landscape.png"),
                f"{self.name}: val accuracy over thresholds",
            )
        result = {
            **tuned.as_dict(),
            "questions": len(routes),
            "failed": [{"id": r.question_id, "error": r.error} for r in routes if r.error],
            "plot": None if plot is None else str(plot),
            "lm_calls_during_trials": trial_calls,
            "precompute_lm_calls": precompute_calls,
            "landscape": {"axis": axis, "grid": grid},
        }
        if generation is not None:
            result["generation"] = generation
        return result

    def _internal_retry(
        self, program: CRAG, questions: list[ValQuestion], work: SharedWork
    ) -> dict[str, Any]:
        """Answer the val questions with and without rewrite-and-retry rounds on the internal store
        (:mod:`crag_dspy.retry`) and ship the rounds only when they beat none beyond noise (exact McNemar,
        p < 0.05, more questions right). Both share every piece (grades, web query, web knowledge), and
        the threshold stage's pieces too."""
        pieces = {"main": CRAGPieces(program, work)}

        def right(q: ValQuestion) -> tuple[bool, bool, list[dict[str, Any]]]:
            results, failed = [], []
            for rounds in (0, INTERNAL_RETRY_ROUNDS):
                raise_if_lm_down()
                try:
                    outcome = run_variant(Variant("CRAG", internal_retries=rounds), q.question, pieces, None)
                    results.append(self._right(q, outcome.answer))
                except CRAGRunError as exc:  # wrong either way, like a failed question in the evaluation
                    raise_if_lm_down()  # unless the LM is down: then the run stops
                    log.warning(
                        "question %s failed with %d retry rounds: %s", q.id, rounds, describe_error(exc)
                    )
                    results.append(False)
                    failed.append({"id": q.id, "rounds": rounds, "error": describe_error(exc)})
            return results[0], results[1], failed

        outcomes = map_questions(
            right,
            questions,
            num_threads=self.num_threads,
            desc="internal retry (val)",
            progress=self.progress,
        )
        without, with_retry = [a for a, _, _ in outcomes], [b for _, b, _ in outcomes]
        ship, p = beats_beyond_noise(with_retry, without)
        if ship:
            program.config = program.config.replace(internal_retries=INTERNAL_RETRY_ROUNDS)
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
                f"{sum(with_retry)} vs {sum(without)} of {n} val questions right with {INTERNAL_RETRY_ROUNDS} "
                f"rounds (McNemar p={p:.3f}): "
                + ("a gain beyond noise" if ship else "no measured gain; not shipped")
            ),
        }


# -- examples ---------------------------------------------------------------------------------------------
def _kind(example: dspy.Example) -> str:
    return str(example.get("kind"))


def _question(example: dspy.Example) -> str:
    return example.question


def _relevance_splits(relevance: Sequence[dspy.Example]) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """The relevance examples of the train and the val split (each example names its ``split``)."""
    splits: dict[str, list[dspy.Example]] = {"train": [], "val": []}
    for example in relevance:
        split = example.get("split")
        if split not in splits:
            raise ValueError(
                f"relevance example for {example.get('question')!r} has split {split!r}; each names its "
                "split: 'train' or 'val'"
            )
        splits[split].append(example)
    return splits["train"], splits["val"]


def _graded(example: dspy.Example) -> dspy.Example:
    """A grader example: (question, document) -> relevant, and nothing else (its fields become demos)."""
    return dspy.Example(
        question=example.question, document=example.document, relevant=bool(example.relevant)
    ).with_inputs("question", "document")


def _pairs(examples: Sequence[dspy.Example]) -> list[tuple[str, str, bool]]:
    return [(e.question, e.document, bool(e.relevant)) for e in examples]


def _aliases(relevance: Sequence[dspy.Example], qa: Sequence[dspy.Example]) -> dict[str, list[str]]:
    """Gold aliases by question text: a relevance example's own ``answers``, else those of a QA example
    with the same question (not of an unanswerable one, kind ``none``)."""
    aliases = {e.question: gold_answers(e) for e in qa if e.get("kind") != "none"}
    aliases.update({e.question: list(e.answers) for e in relevance if e.get("answers")})
    return aliases


# -- one judge --------------------------------------------------------------------------------------------
def compile_judge(
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
