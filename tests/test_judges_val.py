"""benchmarks/judges_val.py: a compiled program's judges next to the uncompiled program's on a whole split."""

import importlib.util
import json
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


LONG = "Alpha sheet\nThe alpha office is open daily. The alpha code is A1. It was issued in 2024."


def test_compiled_judges_are_scored_next_to_the_uncompiled_ones_on_every_example(tmp_path):
    root = make_domain(tmp_path / "tiny")
    # A passage of several sentences, so that how much of it the grader is shown is visible.
    pair = {"question": "What is the alpha code?", "passage": LONG, "label": 1, "split": "val"}
    with (root / "relevance.jsonl").open("a") as f:
        f.write(json.dumps(pair) + "\n")
    domain = load_domain(root)
    # The model cannot tell the tiny domain's passages apart (P(yes) 0.5 for all); only a calibration
    # that weighs the question's words can.
    lm = ScriptedLM(lambda system, user: 0.5)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    crag.grader.calibration = Calibration(1.0, -3.0, {"term_coverage": 4.0})
    crag.grade_sentences = 0  # a non-default configuration, which both sides must share
    path = save_program(crag, tmp_path / "program.json", {"domain": "tiny"})

    results = load_benchmark().judges_on_split(read_program(path), domain, lm, "val", progress=False)

    grader = results["grader"]
    assert grader["uncompiled"]["n"] == grader["compiled"]["n"] == 5  # every val pair of the domain
    assert grader["uncompiled"]["accuracy"] == 0.6 and grader["uncompiled"]["recall"] == 1.0  # all "yes"
    assert grader["compiled"]["accuracy"] == 1.0
    # The strip filter was not compiled: both sides read the model's own P(yes).
    strips = results["strip_filter"]
    assert strips["compiled"]["n"] == strips["uncompiled"]["n"] > 0
    assert strips["compiled"]["accuracy"] == strips["uncompiled"]["accuracy"]
    # One judgement per example and side, nothing else (no retrieval, web search or answer).
    assert len(lm.calls) == 2 * (5 + strips["compiled"]["n"])
    # Both sides graded with the program's configuration (whole passages), not the default excerpt.
    shown_long = [u for _, u in lm.calls if "document:" in u and "The alpha office is open daily." in u]
    assert len(shown_long) == 2 and all("It was issued in 2024." in user for user in shown_long)


def test_compiled_and_uncompiled_are_compared_pairwise(tmp_path):
    root = make_domain(tmp_path / "tiny")
    domain = load_domain(root)
    lm = ScriptedLM(lambda system, user: 0.5)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm, grade_sentences=0)
    path = save_program(crag, tmp_path / "program.json", {"domain": "tiny"})
    results = load_benchmark().judges_on_split(
        read_program(path), domain, lm, "val", judges=("grader",), progress=False
    )
    assert set(results) == {"grader"}  # --judges grader: the strip filter is not run
    # The same uncompiled state on both sides: no pair differs, so nothing can be a difference.
    assert results["grader"]["compiled"]["mcnemar_p"] == 1.0
    assert results["grader"]["compiled"]["accuracy_ci"][0] < results["grader"]["compiled"]["accuracy"]
