"""CRAGOptimizer on lists of dspy.Example, without a domain folder (control flow, scripted LMs)."""

import sys
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM

from crag_dspy import CRAG
from optimize import CRAGOptimizer
from optimize.optimizer import _aliases

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "examples"))
import dspy_user


def test_compile_returns_a_compiled_copy_and_leaves_the_student_as_it_was(tmp_path):
    student = dspy_user.build()
    before = student.dump_state()
    optimizer = CRAGOptimizer(stages=("grader", "strips"), grader="llm", out=tmp_path / "p.json")
    with dspy.context(lm=dspy_user.RuleLM()):  # the LM the caller configured
        compiled = optimizer.compile(
            student, trainset=dspy_user.qa(0), valset=dspy_user.qa(1), relevance=dspy_user.relevance()
        )
    assert compiled is not student and student.dump_state() == before
    assert compiled.retriever is student.retriever  # stores are shared, never copied
    report = optimizer.report
    assert report["stages"]["grader"]["after"]["accuracy"] == 1.0 and report["stages"]["grader"]["val"] == 4
    assert (
        report["stages"]["strip_filter"]["train"] > 0 and report["stages"]["grade_source"]["shipped"] == "llm"
    )
    assert not compiled.grader.calibration.is_identity and student.grader.calibration.is_identity
    assert report["thresholds"]["questions"] == 3 and report["thresholds"]["lm_calls_during_trials"] == 0
    assert list(report["stage_seconds"]) == ["grader", "grade source", "strip filter", "thresholds"]
    # With out=, the study and the landscape are written beside that path, as the compile CLI does.
    assert (tmp_path / "p.optuna.log").is_file() and (tmp_path / "p.landscape.png").is_file()


def test_the_metric_decides_which_answers_are_right():
    seen = []

    def never(example, prediction, trace=None):
        seen.append((example.id, prediction.answer))
        return False

    optimizer = CRAGOptimizer(never, stages=())
    with dspy.context(lm=dspy_user.RuleLM()):
        optimizer.compile(dspy_user.build(), valset=dspy_user.qa(1))
    assert optimizer.report["thresholds"]["accuracy"] == 0.0
    assert {qid for qid, _ in seen} == {e.id for e in dspy_user.qa(1)} and ("theta", "T200") in seen


def test_missing_or_malformed_data_is_refused_before_any_lm_call():
    lm = ScriptedLM(lambda system, user: 0.9)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    qa = dspy_user.qa(1)
    cases = [
        (("grader",), {"valset": qa}, "relevance pairs of both splits \\(train: 0, val: 0\\)"),
        (("answerer",), {"valset": qa}, "a QA trainset"),
        ((), {}, "a QA valset"),
        ((), {"valset": [dspy.Example(question="q?", id="x")]}, "'q\\?' has no 'answers'"),
        (
            ("grader",),
            {"valset": qa, "relevance": [dspy.Example(question="q?", document="d", relevant=True)]},
            "has split None; each names its split",
        ),
    ]
    for stages, data, message in cases:
        with pytest.raises(ValueError, match=message):
            CRAGOptimizer(stages=stages).compile(crag, **data)
    assert lm.calls == []
    with pytest.raises(ValueError, match="no LM"):
        CRAGOptimizer(stages=()).compile(CRAG(ListRetriever([]), ListWebSearch()), valset=qa)
    with pytest.raises(ValueError, match="unknown stage"):
        CRAGOptimizer(stages=("thresholds",))
    with pytest.raises(ValueError, match=r"seed\s+Input should be greater than or equal to 0"):
        CRAGOptimizer(seed=-1)  # numpy would refuse it only at the threshold search, after the LM work


def test_strip_labels_use_a_pairs_own_answers_else_the_qa_examples():
    qa = [
        dspy.Example(question="a?", answers=["1"], kind="kb"),
        dspy.Example(question="b?", answer="2"),  # one answer string is one alias
        dspy.Example(question="c?", answers=["I don't know"], kind="none"),  # unanswerable: no aliases
    ]
    relevance = [dspy.Example(question="a?", document="d", relevant=True, split="train", answers=["one"])]
    assert _aliases(relevance, qa) == {"a?": ["one"], "b?": ["2"]}
