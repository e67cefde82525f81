"""The compile's options: one model that the compile's flags, compile_program and CRAGOptimizer share,
and the one place their values are checked."""

import json
import sys
from pathlib import Path

import dspy
import pytest
from pydantic import ValidationError

from crag_dspy.config import describe_validation_error
from crag_dspy.judges.evaluator import TrainingConfig
from optimize import CRAGOptimizer
from optimize.compile import build_parser, options_from_args
from optimize.grade_source import GRADER_CHOICES
from optimize.options import STAGES, CompileOptions
from optimize.teleprompters import OPTIMIZERS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
import dspy_user


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"stages": ("grader", "thresholds")},
            f"stages: unknown stage(s) ['thresholds']; choose from {STAGES} (got ('grader', 'thresholds'))",
        ),
        (
            {"optimizer": "gepa"},
            f"optimizer: unknown optimizer 'gepa'; choose from {OPTIMIZERS} (got 'gepa')",
        ),
        (
            {"grader": "bm25"},
            f"grader: unknown grader 'bm25'; choose from {GRADER_CHOICES} (got 'bm25')",
        ),
        ({"seed": -1}, "seed: Input should be greater than or equal to 0 (got -1)"),
        ({"demos": -1}, "demos: Input should be greater than or equal to 0 (got -1)"),
        ({"calibration_pairs": -3}, "calibration_pairs: Input should be greater than or equal to 0 (got -3)"),
        ({"val_limit": 0}, "val_limit: Input should be greater than or equal to 1 (got 0)"),
        ({"judge_val_limit": 0}, "judge_val_limit: Input should be greater than or equal to 1 (got 0)"),
        ({"test_limit": 0}, "test_limit: Input should be greater than or equal to 1 (got 0)"),
        ({"num_threads": 0}, "num_threads: Input should be greater than or equal to 1 (got 0)"),
        ({"stages": "grader"}, "stages: Input should be a valid tuple (got 'grader')"),
        ({"trials": 5}, "trials: Extra inputs are not permitted (got 5)"),  # the grid search counts none
    ],
)
def test_a_bad_option_is_refused_in_one_line_naming_it(fields, message):
    with pytest.raises(ValidationError) as error:
        CompileOptions(**fields)
    assert describe_validation_error(error.value) == message


def test_options_are_frozen():
    options = CompileOptions()
    with pytest.raises(ValidationError, match="Instance is frozen"):
        options.seed = 3  # type: ignore[misc]


def test_the_flags_defaults_are_the_options_defaults():
    # The command line differs in showing progress only.
    assert options_from_args(build_parser().parse_args([])) == CompileOptions(progress=True)


def test_every_flag_reaches_its_option(tmp_path):
    argv = [
        "--stages", " grader, retry ",
        "--no-thresholds",
        "--optimizer", "labeled",
        "--demos", "2",
        "--calibration-pairs", "0",
        "--grader", "evaluator",
        "--evaluator-base", str(tmp_path / "encoder"),
        "--evaluator-epochs", "5",
        "--evaluator-frozen-layers", "0",
        "--evaluator-distill",
        "--seed", "7",
        "--out", str(tmp_path / "p.json"),
        "--val-limit", "10",
        "--judge-val-limit", "0",
        "--test-limit", "5",
        "--no-test-eval",
        "--num-threads", "2",
        "--objective", "web<=0.5",
    ]  # fmt: skip
    expected = CompileOptions(
        stages=("grader", "retry"),
        thresholds=False,
        optimizer="labeled",
        demos=2,
        calibration_pairs=0,
        grader="evaluator",
        evaluator_base=tmp_path / "encoder",
        evaluator_training=TrainingConfig(max_epochs=5, frozen_layers=0),
        distill=True,
        seed=7,
        out=tmp_path / "p.json",
        val_limit=10,
        judge_val_limit=None,  # 0: all
        test_limit=5,
        evaluate_test=False,
        num_threads=2,
        objective="web<=0.5",
        progress=True,
    )
    options = options_from_args(build_parser().parse_args(argv))
    assert options == expected
    # Every option moved off its default: no option is left without a flag that sets it.
    defaults = CompileOptions()
    assert [
        name for name in CompileOptions.model_fields if getattr(options, name) == getattr(defaults, name)
    ] == []


def test_an_unknown_stage_on_the_command_line_is_one_line_and_exit_2(capsys):
    from optimize.compile import main

    assert main(["--stages", "grader,bogus"]) == 2
    assert capsys.readouterr().err == (
        f"error: invalid CompileOptions: stages: unknown stage(s) ['bogus']; choose from {STAGES} "
        "(got ('grader', 'bogus'))\n"
    )


def test_keywords_are_the_options_fields():
    keywords = {"stages": ("grader",), "grader": "llm", "seed": 2, "val_limit": 5, "out": Path("p.json")}
    by_keywords, by_options = CRAGOptimizer(**keywords), CRAGOptimizer(options=CompileOptions(**keywords))
    assert by_keywords.options == by_options.options == CompileOptions(**keywords)
    assert CRAGOptimizer().options == CompileOptions()
    with pytest.raises(TypeError, match="not both"):
        CRAGOptimizer(options=CompileOptions(), seed=1)
    with pytest.raises(ValidationError, match="trials\n  Extra inputs are not permitted"):
        CRAGOptimizer(trials=5)


def test_the_keyword_and_the_options_form_compile_the_same_program(tmp_path):
    def compiled(optimizer: CRAGOptimizer) -> tuple[str, str]:
        with dspy.context(lm=dspy_user.RuleLM()):
            program = optimizer.compile(
                dspy_user.build(),
                trainset=dspy_user.qa(0),
                valset=dspy_user.qa(1),
                relevance=dspy_user.relevance(),
            )
        report = {k: v for k, v in optimizer.report.items() if k != "stage_seconds"}
        for timed_or_placed in ("seconds", "trials_per_second", "persist_seconds", "storage", "plot"):
            report["thresholds"].pop(timed_or_placed)
        report["thresholds"]["frontier"].pop("plot")  # placed beside the program
        # As text: the landscape's NaN cells (lower > upper) equal nothing, themselves included.
        return json.dumps(program.dump_state(), default=str), json.dumps(report, default=str)

    keywords = {"stages": ("grader", "strips"), "grader": "llm", "seed": 1}
    by_keywords = compiled(CRAGOptimizer(**keywords, out=tmp_path / "a" / "p.json"))
    by_options = compiled(CRAGOptimizer(options=CompileOptions(**keywords, out=tmp_path / "b" / "p.json")))
    assert by_keywords == by_options
