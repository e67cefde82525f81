"""benchmarks/grader_quality.py: a grader's quality on every labelled pair of a split, next to the
uncompiled grader's, the cosine baseline and the excerpt it reads. Scripted LMs: control flow only."""

import importlib
import json
import sys
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from test_compile import make_domain
from test_focus import CountingEmbedder

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.domain import load_domain
from crag_dspy.judges.calibration import Calibration
from crag_dspy.judges.view import SentenceFocus
from crag_dspy.program import read_program, save_program
from optimize.datasets import relevance_examples, strip_examples
from optimize.grade_source import program_grades

ROOT = Path(__file__).resolve().parents[1]
LONG = "Alpha sheet\nThe alpha office is open daily. The alpha code is A1. It was issued in 2024."


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their harness as a neighbour
    try:
        yield importlib.import_module("grader_quality")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


WHOLE = CRAGConfig().replace(grader_view={"sentences": 0})  # the grader reads whole passages


def tiny_program(tmp_path, lm, config=None):
    """The tiny domain with one passage of several sentences, and a program whose calibration weighs the
    question's words (the model cannot tell the tiny domain's passages apart: P(yes) 0.5 for all)."""
    root = make_domain(tmp_path / "tiny")
    pair = {"question": "What is the alpha code?", "passage": LONG, "label": 1, "split": "val"}
    with (root / "relevance.jsonl").open("a") as f:
        f.write(json.dumps(pair) + "\n")
    crag = CRAG(ListRetriever([]), ListWebSearch(), config, lm=lm)
    crag.grader.calibration = Calibration(1.0, -3.0, {"term_coverage": 4.0})
    return load_domain(root), save_program(crag, tmp_path / "program.json", {"domain": "tiny"})


def test_compiled_and_uncompiled_graders_are_measured_on_every_pair(bench, tmp_path, embedder):
    lm = ScriptedLM(lambda system, user: 0.5)
    domain, path = tiny_program(tmp_path, lm, WHOLE)  # a non-default view, which both sides must share
    examples = relevance_examples(domain.relevance, "val")
    strips = strip_examples(domain, "val", 3)
    sides = bench.graders(lm, None, read_program(path), path.parent)

    results = bench.measure(sides, examples, lm, strips=strips, embedder=embedder, progress=False)

    grader = results["grader"]
    assert grader["uncompiled"]["n"] == grader["compiled"]["n"] == 5  # every val pair of the domain
    assert grader["uncompiled"]["accuracy"] == 0.6 and grader["uncompiled"]["recall"] == 1.0  # all "yes"
    assert grader["compiled"]["accuracy"] == 1.0
    assert grader["compiled"]["accuracy_ci"][0] < 1.0  # five pairs: a wide interval
    assert 0 <= grader["compiled"]["mcnemar_p"] <= 1 and "mcnemar_p" not in grader["uncompiled"]
    # Seconds per pair and per question: one timing per distinct question, for both sides.
    questions = len({e.question for e in examples})
    assert grader["compiled"]["seconds_per_question"]["n"] == questions
    assert (
        grader["compiled"]["seconds_per_pair"] >= 0
        and "evaluator_seconds_per_question" not in grader["compiled"]
    )
    # The strip filter was not compiled: both sides read the model's own P(yes).
    assert (
        results["strip_filter"]["compiled"]["accuracy"] == results["strip_filter"]["uncompiled"]["accuracy"]
    )
    # One judgement per example and side, nothing else (no retrieval, web search or answer).
    assert len(lm.calls) == 2 * (5 + len(strips))
    # Both sides graded with the program's configuration (whole passages), not the default excerpt.
    shown_long = [u for _, u in lm.calls if "document:" in u and "The alpha office is open daily." in u]
    assert len(shown_long) == 2 and all("It was issued in 2024." in user for user in shown_long)


def test_without_a_program_only_the_uncompiled_grader_is_measured(bench, tmp_path, embedder):
    lm = ScriptedLM(lambda system, user: 0.9 if "code is" in field(user, "document") else 0.1)
    examples = relevance_examples(load_domain(make_domain(tmp_path / "tiny")).relevance, "val")
    results = bench.measure(bench.graders(lm), examples, lm, embedder=embedder, progress=False)
    assert set(results) == {"grader"} and set(results["grader"]) == {"uncompiled"}
    assert results["grader"]["uncompiled"]["n"] == len(examples) == len(lm.calls)


def test_grades_timed_per_question_are_the_programs_grades(bench, tmp_path, embedder):
    lm = ScriptedLM(lambda system, user: 0.8 if "alpha" in field(user, "document").lower() else 0.3)
    domain, path = tiny_program(tmp_path, lm, WHOLE)
    examples = relevance_examples(domain.relevance, "val")
    crag = bench.graders(lm, None, read_program(path), path.parent)["compiled"]
    with dspy.context(lm=lm):
        scores, timing = bench.timed_grades(crag, examples, embedder, desc="grader", progress=False)
        assert scores == pytest.approx(program_grades(crag, examples, embedder, progress=False))
    groups = bench.by_question(examples)
    assert sorted(i for g in groups for i in g) == list(range(len(examples)))
    assert timing["seconds_per_question"]["n"] == len(groups) == len({e.question for e in examples})


def test_by_question_groups_in_order_of_first_appearance(bench):
    examples = [dspy.Example(question=q) for q in ["b", "a", "b", "c", "a"]]
    assert bench.by_question(examples) == [[0, 2], [1, 4], [3]]


def test_the_excerpt_counts_only_pairs_whose_passage_holds_the_answer(bench):
    question = "What is the hotel cap of Travel Policy v4?"
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=ScriptedLM(lambda s, u: 0.5))
    crag.grader.view = SentenceFocus(1, CountingEmbedder())  # shows the title and the "hotel" sentence

    def example(document, relevant=True):
        return dspy.Example(question=question, document=document, relevant=relevant)

    examples = [
        example("Travel Policy v4\nThe hotel cap is 180 velds. Parking is free."),  # shown
        example("Travel Policy v4\nThe hotel rooms are booked by the desk. The cap is 180 velds."),  # hidden
        example("Travel Policy v4\nParking is free."),  # the passage lacks the answer: not counted
        example("Canteen\nSoup costs 180 velds.", relevant=False),  # negative: not counted
    ]
    result = bench.excerpt_recall(crag, examples, {question: ["180 velds"]})
    assert (result["k"], result["n"]) == (1, 2) and result["rate"] == 0.5
    assert result["interval"][0] < 0.5 < result["interval"][1]


def test_the_cosine_baseline_ranks_by_similarity(bench):
    class AxisEmbedder:
        def encode(self, texts):
            return [[1.0, 0.0] if "alpha" in t.lower() else [0.0, 1.0] for t in texts]

    examples = [
        dspy.Example(question="alpha?", document="Alpha\nthe alpha code", relevant=True),
        dspy.Example(question="alpha?", document="Beta\nthe beta code", relevant=False),
        dspy.Example(question="beta?", document="Beta\nthe beta code", relevant=False),
        dspy.Example(question="beta?", document="Alpha\nthe alpha code", relevant=True),
    ]
    assert bench.cosine_baseline(AxisEmbedder(), examples)["roc_auc"] == 0.5
    examples[3] = examples[3].copy(relevant=False)
    examples[2] = examples[2].copy(relevant=True)
    assert bench.cosine_baseline(AxisEmbedder(), examples)["roc_auc"] == 1.0


def test_main_writes_one_result_file_with_its_metadata(bench, tmp_path):
    lm = ScriptedLM(lambda system, user: 0.5)
    domain, path = tiny_program(tmp_path, lm, WHOLE)
    out = tmp_path / "quality.json"
    argv = ["--program", str(path), "--domain-dir", str(domain.root), "--out", str(out)]
    assert bench.main(argv, lm=lm) == 0
    written = json.loads(out.read_text())
    assert written["benchmark"] == "grader_quality"
    meta = written["metadata"]
    assert meta["command"].startswith("python benchmarks/grader_quality.py --program ")
    assert meta["lm"] == "scripted/fake" and meta["machine"]["cpus"] >= 1 and meta["date"]
    results = written["results"]
    assert results["domain"] == "tiny" and results["pairs"] == 5 and results["grade_source"] == "llm"
    assert results["grader"]["compiled"]["accuracy"] == 1.0 and "strip_filter" not in results
    assert 0 <= results["cosine"]["roc_auc"] <= 1 and results["excerpt_shows_answer"]["n"] >= 1


@pytest.mark.parametrize("judges", ["strip_filter", "grader,bogus", ""])
def test_judges_must_include_the_grader(bench, judges, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--judges", judges, "--out", "/dev/null"])
    assert exit_.value.code == 2 and "--judges takes grader" in capsys.readouterr().err
