"""benchmarks/judges_val.py: a compiled program's judges next to the uncompiled program's on a whole split."""

import importlib.util
from pathlib import Path

from fakes import ListRetriever, ListWebSearch, ScriptedLM
from test_compile import make_domain

from crag_dspy import CRAG
from crag_dspy.calibration import Calibration
from crag_dspy.domain import load_domain
from crag_dspy.program import read_program, save_program

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("judges_val", ROOT / "benchmarks" / "judges_val.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiled_judges_are_scored_next_to_the_uncompiled_ones_on_every_example(tmp_path):
    domain = load_domain(make_domain(tmp_path / "tiny"))
    # The model cannot tell the tiny domain's passages apart (P(yes) 0.5 for all); only a calibration
    # that weighs the question's words can.
    lm = ScriptedLM(lambda system, user: 0.5)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    crag.grader.calibration = Calibration(1.0, -3.0, {"term_coverage": 4.0})
    path = save_program(crag, tmp_path / "program.json", {"domain": "tiny"})

    results = load_benchmark().judges_on_split(read_program(path), domain, lm, "val", progress=False)

    grader = results["grader"]
    assert grader["uncompiled"].n == grader["compiled"].n == 4  # every val pair of the tiny domain
    assert grader["uncompiled"].accuracy == 0.5 and grader["uncompiled"].recall == 1.0  # all "yes"
    assert grader["compiled"].accuracy == 1.0
    # The strip filter was not compiled: both sides read the model's own P(yes).
    strips = results["strip_filter"]
    assert strips["compiled"].n == strips["uncompiled"].n > 0
    assert strips["compiled"].accuracy == strips["uncompiled"].accuracy
    # One judgement per example and side, nothing else (no retrieval, web search or answer).
    assert len(lm.calls) == 2 * (4 + strips["compiled"].n)
