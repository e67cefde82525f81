"""``python -m optimize.compile``: learn a domain's CRAG prompts and thresholds into one program JSON.

Steps: load and (re)ingest the domain; compile the grader and the strip filter with a DSPy
teleprompter on the labelled relevance data (val accuracy before and after); optionally compile the
rewriter and answerer end to end; tune (lower, upper) jointly with Optuna on cached QA-val routes;
evaluate on the QA test split next to the uncompiled program and plain RAG; write the program JSON,
a markdown + JSON report and a PNG of the accuracy landscape.

The stages are :class:`optimize.optimizer.CRAGOptimizer`'s; this CLI loads the domain, checks its data
(:mod:`optimize.data_needs`), turns its records into examples (:func:`domain_examples`), and adds the
test comparison and the report files.
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
from crag_dspy.cli import (
    add_lm_arguments,
    add_storage_arguments,
    add_web_search_argument,
    command_prog,
    error_line,
    interruptible,
    settings_from_args,
    user_error_types,
)
from crag_dspy.domain import Domain, DomainDataError, load_domain
from crag_dspy.embeddings import bundled_model_path
from crag_dspy.faults import CRAGRunError, LMDownError, watch_lm
from crag_dspy.judges.evaluator import TrainingConfig, check_encoder_folder
from crag_dspy.lm import build_lm, describe_engine, lm_identity
from crag_dspy.program import save_program
from crag_dspy.redaction import configure_logging
from crag_dspy.settings import Settings
from crag_dspy.store import ingest_domain
from crag_dspy.trace import usage_from_tracker

from .data_needs import guidance, shortfalls, synthetic_grader_warning
from .datasets import answers_by_question, qa_examples
from .grade_source import GRADER_CHOICES
from .measure import evaluate_program
from .optimizer import CRAGOptimizer, StageClock
from .options import CompileOptions
from .report import check_writable, write_report
from .teleprompters import OPTIMIZERS

__all__ = ["compile_program", "domain_examples", "main", "options_from_args"]

log = logging.getLogger(__name__)
REPORTED_OPTIONS = {"optimizer", "seed"}
"""The options the report's first line and the program's metadata state besides the stages."""


def compile_program(
    settings: Settings, options: CompileOptions, *, lm: dspy.BaseLM | None = None
) -> dict[str, Any]:
    """Compile the domain of ``settings`` as ``options`` say and write the program JSON and report;
    returns the report. ``lm`` stands in for the one ``settings`` names."""
    started = time.perf_counter()
    clock = StageClock()
    stages, progress = options.stages, options.progress
    # The engine's build is recorded only when this compile runs the embedded model itself.
    if "grader" in stages and options.grader != "llm":
        check_encoder_folder(options.evaluator_base or bundled_model_path())  # before the LM starts
    runs_embedded = lm is None and settings.lm == "embedded"
    domain = load_domain(settings.resolved_domain_dir)  # a bad domain fails before the LM starts
    spp = domain.config.crag_config(settings.config).sentences_per_strip
    missing = shortfalls(
        domain, stages, thresholds=options.thresholds, test=options.evaluate_test, sentences_per_strip=spp
    )
    if missing:  # before any LM call: a compile on nothing would start the model to fail late
        raise DomainDataError(guidance(domain.root, missing))
    if warning := synthetic_grader_warning(domain, stages):
        log.warning(warning)
    out = options.out or Path("runs") / domain.name / "program.json"
    check_writable(out, "the program")  # an hour of LM work must not end where it cannot be saved
    out.parent.mkdir(parents=True, exist_ok=True)  # the threshold study's journal goes beside it
    lm = lm or build_lm(settings)
    crag, backends = assemble(settings, lm, progress, domain=domain)
    ingest_domain(backends.client, domain, backends.embedder, progress=progress)  # refresh if data changed
    report: dict[str, Any] = {
        "domain": domain.name,
        "lm": getattr(lm, "model", lm_identity(settings)),
        **options.model_dump(include=REPORTED_OPTIONS),
        "stages": {},
    }
    if runs_embedded:
        engine = describe_engine(engine=settings.embedded_engine)
        if engine is not None:
            report["engine"] = engine.as_dict()
            if engine.hint:
                log.warning("%s", engine.hint)
    clock.lap("setup")  # the LM, the store, ingestion

    trainset, valset, relevance = domain_examples(domain)
    compiler = CRAGOptimizer(
        options=options.model_copy(update={"out": out}),
        embedder=backends.embedder,
        cache_dir=settings.cache_dir / "evaluators",
        name=domain.name,
    )
    # watch_lm: a question that fails is counted wrong, but an LM that is down stops the compile.
    with dspy.track_usage() as tracker, dspy.context(lm=lm), watch_lm():
        compiled = compiler.compile(crag, trainset=trainset, valset=valset, relevance=relevance)
        for key in ("stages", "thresholds", "internal_retry"):
            if key in compiler.report:
                report[key] = compiler.report[key]
        clock.extend(compiler.report["stage_seconds"])
        if options.evaluate_test:
            test = qa_examples(domain, "test", options.test_limit)
            results = [
                evaluate_program("CRAG (compiled)", compiled, test, progress=progress),
                evaluate_program("CRAG (uncompiled)", crag, test, progress=progress),
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
    report["thresholds_used"] = compiled.thresholds.dump_state()
    report["seconds"] = time.perf_counter() - started
    report["stage_seconds"] = clock.seconds
    metadata = {
        # The domain's name and data, not its folder: the app that loads the program names the folder.
        "domain": domain.name,
        "dataset_hashes": domain.file_hashes(),
        "lm": report["lm"],
        **options.model_dump(include=REPORTED_OPTIONS),
        "stages": list(stages),
        "scores": {
            # val metrics of the judge states actually saved
            "grader": report["stages"].get("grader", {}).get("after"),
            "strip_filter": report["stages"].get("strip_filter", {}).get("after"),
            "val_accuracy": report.get("thresholds", {}).get("accuracy"),
            "test": {r["name"]: r["accuracy"] for r in report.get("test", [])},
        },
    }
    save_program(compiled, out, metadata)
    report["program"] = str(out)
    write_report(report, out)
    return report


def domain_examples(domain: Domain) -> tuple[list[dspy.Example], list[dspy.Example], list[dspy.Example]]:
    """A domain's labelled data as :class:`~optimize.optimizer.CRAGOptimizer` takes them: the QA train
    and val examples (question, answers, id, kind) and the relevance pairs (question, document,
    relevant, split, and the question's gold aliases as answers when the domain knows them)."""

    def qa(split: str) -> list[dspy.Example]:
        return [
            dspy.Example(question=q.question, answers=q.answers, id=q.id, kind=q.kind).with_inputs("question")
            for q in domain.qa
            if q.split == split
        ]

    aliases = answers_by_question(domain)
    relevance = [
        dspy.Example(
            question=p.question,
            document=p.passage,
            relevant=bool(p.label),
            split=p.split,
            **({"answers": aliases[p.question]} if p.question in aliases else {}),
        ).with_inputs("question", "document")
        for p in domain.relevance
    ]
    return qa("train"), qa("val"), relevance


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


def _option(parser: argparse.ArgumentParser, flag: str, name: str, **kwargs: Any) -> None:
    """``flag`` for the option ``name``: the option's description is its help and, unless ``kwargs``
    give another, the option's default is its default (a default of none or off goes unsaid: the
    description says what it means)."""
    field = CompileOptions.model_fields[name]
    kwargs.setdefault("default", field.default)
    said = "" if kwargs["default"] is None or kwargs["default"] is False else " (default: %(default)s)"
    parser.add_argument(flag, help=f"{field.description}{said}", **kwargs)


def _limit(parser: argparse.ArgumentParser, flag: str, name: str) -> None:
    """``flag`` for the optional limit ``name``: N, or 0 for no limit (the option's None)."""
    field = CompileOptions.model_fields[name]
    said = " (default 0: all)" if field.default is None else f" (default {field.default}; 0: all)"
    parser.add_argument(flag, type=at_least(0), default=field.default or 0, help=f"{field.description}{said}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_prog("compile", "optimize.compile"), description=__doc__.split("\n\n")[0]
    )
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    add_web_search_argument(parser)
    _option(parser, "--optimizer", "optimizer", choices=OPTIMIZERS)
    _option(parser, "--demos", "demos", type=at_least(0))
    _option(parser, "--calibration-pairs", "calibration_pairs", type=at_least(0))
    _option(parser, "--stages", "stages", default=",".join(CompileOptions.model_fields["stages"].default))
    parser.add_argument(
        "--no-thresholds",
        action="store_true",
        help="keep the current thresholds: skip the QA-val route precomputation and the exact search",
    )
    _option(parser, "--grader", "grader", choices=GRADER_CHOICES)
    _option(parser, "--evaluator-base", "evaluator_base", type=Path)
    parser.add_argument(
        "--evaluator-epochs",
        type=at_least(1),
        default=TrainingConfig().max_epochs,
        help="most evaluator epochs; held-out train pairs choose how many (default: %(default)s)",
    )
    parser.add_argument(
        "--evaluator-frozen-layers",
        type=at_least(0),
        default=TrainingConfig().frozen_layers,
        help="lowest encoder layers the evaluator keeps as loaded, their outputs computed once so an "
        "epoch trains only the layers above; 0 trains every layer (default: %(default)s)",
    )
    _option(parser, "--evaluator-distill", "distill", action="store_true")
    _option(parser, "--seed", "seed", type=at_least(0))
    _option(parser, "--objective", "objective", metavar="accuracy|truthfulness|web<=X")
    _option(parser, "--out", "out", type=Path)
    _limit(parser, "--val-limit", "val_limit")
    _limit(parser, "--judge-val-limit", "judge_val_limit")
    _limit(parser, "--test-limit", "test_limit")
    parser.add_argument("--no-test-eval", action="store_true", help="skip the test-split comparison")
    _option(parser, "--num-threads", "num_threads", type=at_least(1), metavar="N")
    return parser


def options_from_args(args: argparse.Namespace) -> CompileOptions:
    """The options the flags ask for. Flags and options differ in form only: a limit of 0 is none,
    ``--stages`` is comma-separated, ``--no-*`` turns an option off, the evaluator's flags are two of
    its training's fields, and the command line shows progress."""
    return CompileOptions(
        stages=tuple(s.strip() for s in args.stages.split(",") if s.strip()),
        thresholds=not args.no_thresholds,
        optimizer=args.optimizer,
        demos=args.demos,
        calibration_pairs=args.calibration_pairs,
        grader=args.grader,
        evaluator_base=args.evaluator_base,
        evaluator_training=TrainingConfig(
            max_epochs=args.evaluator_epochs, frozen_layers=args.evaluator_frozen_layers
        ),
        distill=args.evaluator_distill,
        seed=args.seed,
        out=args.out,
        val_limit=args.val_limit or None,
        judge_val_limit=args.judge_val_limit or None,
        test_limit=args.test_limit or None,
        evaluate_test=not args.no_test_eval,
        num_threads=args.num_threads,
        objective=args.objective,
        progress=True,
    )


@interruptible
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)  # every handler redacts API keys
    if args.evaluator_distill and args.grader == "llm":
        print("error: --evaluator-distill trains the evaluator; --grader llm ships none", file=sys.stderr)
        return 2
    try:
        options = options_from_args(args)  # an unknown stage is refused before the settings are read
        report = compile_program(settings_from_args(args), options)
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)  # e.g. a --chroma-host with user:password@
        return 2
    except (CRAGRunError, LMDownError) as exc:  # the LM went down mid-compile: one redacted line
        print(error_line(exc), file=sys.stderr)
        return 1
    md = Path(report["program"]).with_suffix(".report.md")
    print(md.read_text(encoding="utf-8"))
    print(f"\nprogram: {report['program']}\nreport:  {md}")
    if "thresholds" in report:
        print(f"study:   optuna-dashboard {report['thresholds']['storage']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
