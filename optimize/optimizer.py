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
from crag_dspy.judges.evaluator import RelevanceEvaluator
from crag_dspy.judges.llm import BinaryJudge, Judgement
from crag_dspy.module import CRAG
from crag_dspy.trace import usage_from_tracker

from .cost import Cost
from .datasets import interleave_balanced, round_robin, spread, strip_examples_from
from .frontier import collapse, frontier_summary
from .grade_source import GradeSourceChoice, JudgeScores, choose_grade_source, evaluator_on_strips
from .measure import judge_outcomes
from .metrics import answer_matches, beats_beyond_noise, binary_report, wilson_interval
from .options import GENERATORS, CompileOptions
from .parallel import map_questions
from .report import plot_frontier, plot_landscape
from .shared_work import SharedWork
from .teleprompters import compile_stage, judge_metric
from .thresholds import (
    QuestionRoutes,
    TuningResult,
    accuracy_landscape,
    defaults_on_scale,
    precompute_routes,
    route_table,
    routes_fingerprint,
    tune_thresholds,
)
from .variants import INTERNAL_RETRY_ROUNDS, Programs, Variant, baseline_outcomes, run_variant

__all__ = [
    "CRAGOptimizer",
    "CompiledJudge",
    "StageClock",
    "ValQuestion",
    "answer_metric",
    "compile_judge",
    "gold_answers",
]

log = logging.getLogger(__name__)
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


@dataclass(frozen=True)
class CompileData:
    """What the steps compile on, checked by :meth:`CRAGOptimizer._check`: the LM they ask and the
    examples, in the order the compile takes them (evenly across kinds)."""

    lm: dspy.BaseLM
    train: list[dspy.Example]
    questions: list[ValQuestion]
    """QA val (``val_limit`` questions of it) as the threshold and retry steps replay it."""
    relevance_train: list[dspy.Example]
    relevance_val: list[dspy.Example]
    relevance: list[dspy.Example]
    """Every relevance pair and every QA example given (``qa``): the strip labels' gold aliases."""
    qa: list[dspy.Example]


@dataclass(frozen=True)
class GraderStep:
    """The grader compiled on its train and val pairs, which the grade-source step measures on too."""

    judge: CompiledJudge
    train: list[dspy.Example]
    val: list[dspy.Example]


@dataclass(frozen=True)
class Generation:
    """The rewriter/answerer bootstrap's report, and the program as it was before the bootstrap when
    it gave demos: the threshold step keeps them only if they score higher on val."""

    report: dict[str, Any]
    before: CRAG | None


@dataclass(frozen=True)
class TunedThresholds:
    """The threshold step's report, and what it found about the generation demos when it weighed them."""

    report: dict[str, Any]
    generation: dict[str, Any] | None = None


class CRAGOptimizer(Teleprompter):
    """Compile a :class:`~crag_dspy.module.CRAG` program: judges, grade source, generation demos,
    thresholds and internal retries, each shipped only when it measures better on val.

    Args:
        metric: ``metric(example, prediction, trace=None)``, truthy when ``prediction.answer`` is right
            for the QA ``example``; judges bootstrapped demos, threshold routes and retries
            (default :func:`answer_metric`).
        options: what to compile and how (:class:`~optimize.options.CompileOptions`), or its fields as
            keywords: ``CRAGOptimizer(stages=("grader", "strips"), grader="llm")``.
        embedder: sentence embeddings for the retrieval similarity a fused grade weighs (default: the
            program's, else the bundled MiniLM).
        cache_dir: where trained evaluators are cached.
        name: names the Optuna study (and titles the landscape plot).

    After :meth:`compile`, ``report`` holds what each stage measured and shipped, and why
    (``stages``, ``thresholds``, ``internal_retry``, ``stage_seconds``), as the compile report shows it.
    """

    def __init__(
        self,
        metric: Metric | None = None,
        options: CompileOptions | None = None,
        *,
        embedder: Embedder | None = None,
        cache_dir: Path | None = None,
        name: str = "crag",
        **keywords: Any,
    ):
        super().__init__()
        if options is not None and keywords:
            raise TypeError(f"pass options or its fields as keywords, not both (got {sorted(keywords)} too)")
        self.options = options if options is not None else CompileOptions(**keywords)
        self.metric = metric or answer_metric
        self.embedder, self.cache_dir, self.name = embedder, cache_dir, name
        self.report: dict[str, Any] = {}

    @property
    def progress(self) -> bool:
        """Whether the steps that map over questions show progress bars (``options.progress``)."""
        return self.options.progress

    @property
    def num_threads(self) -> int:
        """Val questions the replaying steps route at a time (``options.num_threads``)."""
        return self.options.num_threads

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
        web search. Raises ValueError when a stage's data are missing, before any LM call.

        The steps: :meth:`_check`, then those of the stages asked for, in this order, each timed:
        :meth:`_compile_grader`, :meth:`_choose_grade_source`, :meth:`_compile_strip_filter`,
        :meth:`_bootstrap_generation`, :meth:`_tune_thresholds`, :meth:`_internal_retry`."""
        data = self._check(student, teacher, trainset, valset, relevance)
        stages = set(self.options.stages)
        program = student.deepcopy()
        clock = StageClock()
        self.report = report = {"stages": {}}
        with dspy.context(lm=data.lm), watch_lm():
            evaluator = None
            if "grader" in stages:
                grader = self._compile_grader(program, data)
                report["stages"]["grader"] = grader.judge.report
                clock.lap("grader")
                source = self._choose_grade_source(program, data, grader)
                report["stages"]["grade_source"], evaluator = source.report, source.evaluator
                clock.lap("grade source")
            if "strips" in stages:
                report["stages"]["strip_filter"] = self._compile_strip_filter(program, data, evaluator)
                clock.lap("strip filter")
            before_generation = None
            if stages & set(GENERATORS):
                generation = self._bootstrap_generation(program, data.train)
                report["stages"]["generation"], before_generation = generation.report, generation.before
                clock.lap("rewriter/answerer bootstrap")
            # The QA-val pieces (grades, knowledge, answers) the threshold and retry stages both use.
            work = SharedWork()
            if self.options.thresholds:  # off keeps the current thresholds and skips the route precomputation
                tuned = self._tune_thresholds(program, data.lm, data.questions, work, before_generation)
                report["thresholds"] = tuned.report
                if tuned.generation is not None:
                    report["stages"]["generation"].update(tuned.generation)
                clock.lap("thresholds")
            elif before_generation is not None:
                log.warning("--no-thresholds: the rewriter/answerer demos ship without a check on QA val")
            if "retry" in stages:
                report["internal_retry"] = self._internal_retry(program, data.questions, work)
                clock.lap("internal retry")
        report["stage_seconds"] = clock.seconds
        return program

    # -- data -----------------------------------------------------------------------------------------
    def _check(
        self,
        student: CRAG,
        teacher: Any,
        trainset: Sequence[dspy.Example] | None,
        valset: Sequence[dspy.Example] | None,
        relevance: Sequence[dspy.Example] | None,
    ) -> CompileData:
        """The LM and the examples, checked before any LM call: a compile that fails on its data must
        fail before the LM work of the stages before the one that needs them."""
        if teacher is not None:
            raise ValueError("CRAGOptimizer takes no teacher: every stage measures the student itself")
        lm = student.lm or dspy.settings.lm
        if lm is None:
            raise ValueError("no LM: pass lm= to CRAG or configure one with dspy.configure(lm=...)")
        stages = set(self.options.stages)
        # In the order the compile always took them: evenly across kinds.
        train = round_robin(list(trainset or []), _kind)
        val = round_robin(list(valset or []), _kind, self.options.val_limit)
        relevance_train, relevance_val = _relevance_splits(relevance or [])
        needs = []
        if stages & {"grader", "strips"} and not (relevance_train and relevance_val):
            needs.append(
                f"relevance pairs of both splits (train: {len(relevance_train)}, val: {len(relevance_val)})"
            )
        if stages & set(GENERATORS) and not train:
            needs.append("a QA trainset")
        if (self.options.thresholds or "retry" in stages) and not val:
            needs.append("a QA valset (thresholds=False and no retry stage need none)")
        if needs:
            raise ValueError(f"stages {sorted(stages)} need {', '.join(needs)}")
        for example in [*train, *val]:
            gold_answers(example)  # every QA example has its gold answers, checked before any LM call
        return CompileData(
            lm=lm,
            train=train,
            questions=[self._val_question(e, i) for i, e in enumerate(val)],
            relevance_train=relevance_train,
            relevance_val=relevance_val,
            relevance=list(relevance or []),
            qa=[*(trainset or []), *(valset or [])],
        )

    def _distill_questions(self, data: CompileData) -> list[str]:
        """With ``distill``, the train questions whose passages the LLM judge may label: the QA and
        relevance train questions, none that val labels (their pairs must stay unseen)."""
        if not self.options.distill:
            return []
        in_val = {e.question for e in data.relevance_val}
        questions = [e.question for e in [*data.train, *data.relevance_train]]
        return [q for q in dict.fromkeys(questions) if q not in in_val]

    def _val_question(self, example: dspy.Example, index: int) -> ValQuestion:
        return ValQuestion(
            str(example.get("id") or f"val-{index}"), example.question, gold_answers(example), example
        )

    def _right(self, question: ValQuestion, answer: str) -> bool:
        return bool(self.metric(question.example, dspy.Prediction(answer=answer)))

    # -- steps ----------------------------------------------------------------------------------------
    def _compile_grader(self, program: CRAG, data: CompileData) -> GraderStep:
        """The grader compiled and calibrated on the relevance pairs: train balanced by label, val whole
        questions spread over the split."""
        train = interleave_balanced([_graded(e) for e in data.relevance_train], "relevant", self.options.seed)
        val = spread([_graded(e) for e in data.relevance_val], _question, self.options.judge_val_limit)
        return GraderStep(self._judge(program, "grader", train, val, "relevant"), train, val)

    def _choose_grade_source(self, program: CRAG, data: CompileData, grader: GraderStep) -> GradeSourceChoice:
        """The LLM judge, a trained evaluator or both fused, chosen on the grader's val pairs
        (:func:`~optimize.grade_source.choose_grade_source`)."""
        options = self.options
        return choose_grade_source(
            program,
            grader.train,
            grader.val,
            grader.judge.scores,
            choice=options.grader,
            base=options.evaluator_base or bundled_model_path(),
            config=options.evaluator_training.model_copy(update={"seed": options.seed}),
            embedder=self.embedder or program.embedder or Embedder(),
            cache_dir=self.cache_dir,
            distill=self._distill_questions(data),
            progress=options.progress,
        )

    def _compile_strip_filter(
        self, program: CRAG, data: CompileData, evaluator: RelevanceEvaluator | None
    ) -> dict[str, Any]:
        """The strip filter compiled on strips of the same pairs, labelled by the gold aliases they hold;
        with the grader's trained ``evaluator``, how that one ranks them too (could one serve both?)."""
        aliases = _aliases(data.relevance, data.qa)
        spp = program.config.sentences_per_strip
        strips_train = strip_examples_from(_pairs(data.relevance_train), aliases, spp)
        strips_val = strip_examples_from(_pairs(data.relevance_val), aliases, spp)
        train = interleave_balanced(strips_train, "keep", self.options.seed)
        val = spread(strips_val, _question, self.options.judge_val_limit)
        report = self._judge(program, "strip_filter", train, val, "keep").report
        if evaluator is not None:
            report["grader_evaluator"] = evaluator_on_strips(evaluator, val)
        return report

    def _judge(
        self, program: CRAG, name: str, train: list[dspy.Example], val: list[dspy.Example], label: str
    ) -> CompiledJudge:
        options = self.options
        return compile_judge(
            program,
            name,
            train,
            val,
            label,
            optimizer=options.optimizer,
            demos=options.demos,
            calibration_pairs=options.calibration_pairs,
            seed=options.seed,
            progress=options.progress,
        )

    def _bootstrap_generation(self, program: CRAG, train: list[dspy.Example]) -> Generation:
        """Demos for the rewriter and/or answerer bootstrapped from train runs the metric accepts."""
        before = program.deepcopy()
        teleprompter = dspy.teleprompt.BootstrapFewShot(
            metric=self.metric,
            max_bootstrapped_demos=self.options.demos,
            max_labeled_demos=0,
            max_errors=len(train),
        )
        compiled = teleprompter.compile(program.deepcopy(), trainset=train)
        demos = {}
        for name in GENERATORS:
            if name in self.options.stages:
                getattr(program, name).load_state(getattr(compiled, name).dump_state())
                demos[name] = len(getattr(program, name).demos)
        raise_if_lm_down()  # the bootstrap counts failed examples as errors and goes on
        if not any(demos.values()):
            return Generation({"demos": demos, "kept": "no demos bootstrapped"}, None)
        return Generation(
            {"demos": demos, "kept": "with demos (not checked on val: --no-thresholds)"}, before
        )

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
                default=defaults_on_scale(program.grader)[0],
                seed=self.options.seed,
                storage=self.options.out.with_suffix(".optuna.log") if self.options.out else None,
                # Keyed by the routes: a study tuned on other grades or answers (changed data, prompts or
                # calibration) must not be resumed as if its trials still scored the same.
                study_name=f"{self.name}-thresholds-seed{self.options.seed}-{routes_fingerprint(routes)}"
                + ("" if self.options.objective == "accuracy" else f"-{self.options.objective}"),
                objective=self.options.threshold_objective,
            )
        # Two independent counts of LM requests made while trials ran: the LM's history and DSPy's tracker.
        trial_calls = len(lm.history) - calls_before + usage_from_tracker(trial_tracker).calls
        return routes, tuned, trial_calls, precompute_usage.calls

    def _tune_thresholds(
        self,
        program: CRAG,
        lm: dspy.BaseLM,
        questions: list[ValQuestion],
        work: SharedWork,
        without_generation: CRAG | None,
    ) -> TunedThresholds:
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
        defaults, defaults_note = defaults_on_scale(program.grader)
        with work.consumer("frontier baselines"):
            # Plain RAG and RAG + web always on val: one answer each per question, the frontier's ends.
            baselines = baseline_outcomes(  # type: ignore[arg-type] - a ValQuestion has the QAPair fields
                program, questions, work, num_threads=self.num_threads, progress=self.progress
            )
        frontier = frontier_summary(
            route_table(routes), baselines, (tuned.lower, tuned.upper), defaults=defaults
        )
        axis, grid = accuracy_landscape(routes)
        plot = None
        if self.options.out is not None:
            plot = plot_landscape(
                axis,
                grid,
                (tuned.lower, tuned.upper),
                defaults,
                self.options.out.with_suffix(".landscape.png"),
                f"{self.name}: val accuracy over thresholds",
            )
            frontier["plot"] = str(
                plot_frontier(frontier, self.options.out.with_suffix(".frontier.png"), f"{self.name} / val")
            )
        report = {
            **tuned.as_dict(),
            "questions": len(routes),
            "failed": [{"id": r.question_id, "error": r.error} for r in routes if r.error],
            "plot": None if plot is None else str(plot),
            "lm_calls_during_trials": trial_calls,
            "precompute_lm_calls": precompute_calls,
            # Plain RAG's and RAG + web always's answers on val: the frontier's two reference points.
            "baseline_lm_calls": (work.owned().get("frontier baselines") or Cost()).usage.calls,
            "landscape": {"axis": axis, "grid": grid},
            "frontier": frontier,
            "collapse": collapse(frontier["at"]["actions"]),
            "defaults_note": defaults_note,
        }
        return TunedThresholds(report, generation)

    def _internal_retry(
        self, program: CRAG, questions: list[ValQuestion], work: SharedWork
    ) -> dict[str, Any]:
        """Answer the val questions with and without rewrite-and-retry rounds on the internal store
        (:mod:`crag_dspy.retry`) and ship the rounds only when they beat none beyond noise (exact McNemar,
        p < 0.05, more questions right). Both share every piece (grades, web query, web knowledge), and
        the threshold stage's pieces too."""
        programs = Programs(program, program, work)

        def right(q: ValQuestion) -> tuple[bool, bool, list[dict[str, Any]]]:
            results, failed = [], []
            for rounds in (0, INTERNAL_RETRY_ROUNDS):
                raise_if_lm_down()
                try:
                    outcome = run_variant(
                        Variant("CRAG", internal_retries=rounds), q.question, programs, None
                    )
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
@dataclass(frozen=True)
class CompiledJudge:
    """What :func:`compile_judge` measured (``report``: val metrics before and after, every candidate),
    and the shipped judge's scores, which the grade-source step weighs the other grade sources against."""

    report: dict[str, Any]
    scores: JudgeScores


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
) -> CompiledJudge:
    """Compile one yes/no judge in place and return its val metrics before and after.

    Candidates: the zero-shot prompt and (unless ``optimizer`` is "none") the teleprompter's few-shot
    prompt, each with a calibration of its P(yes) fitted on held-out train examples, and with one that
    also weighs the lexical evidence of the judged text (``+ evidence``). Each prompt's LM answers are
    computed once; the calibrations rescore them. The best on val is shipped, and only if it is at least
    as good as the uncompiled judge: small models can get worse with demos (the embedded one turns into a
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
    report = {
        "train": len(train),
        "val": len(val),
        "demos": len(judge.predict.demos),
        "calibration": candidates[kept]["calibration"] if kept != "uncompiled" else None,
        "before": before.as_dict(),
        "after": candidates[kept]["val"] if kept != "uncompiled" else before.as_dict(),
        "kept": kept,
        "candidates": candidates,
    }
    scores = JudgeScores(
        kept_scores["val"], kept_scores["held_out"], kept_scores["held_out_scores"], uncompiled_scores["val"]
    )
    return CompiledJudge(report, scores)


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
