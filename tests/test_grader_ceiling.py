"""benchmarks/grader_ceiling.py: every kind of calibration refitted on one set of the grader's LM answers."""

import importlib.util
import random
from pathlib import Path

import dspy
import numpy as np
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from test_focus import CountingEmbedder

from crag_dspy import CRAG
from crag_dspy.calibration import fit_calibration
from crag_dspy.evidence import FITTED_FEATURES, evidence_features
from crag_dspy.focus import SentenceFocus

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the hotel cap of Travel Policy v4?"
PASSAGE = "Travel Policy v4\nHotel rooms are booked by the travel desk. The hotel cap is 180 velds."


@pytest.fixture
def ceiling(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports grader_views, its neighbour
    spec = importlib.util.spec_from_file_location("grader_ceiling", ROOT / "benchmarks" / "grader_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example(question=QUESTION, document=PASSAGE, relevant=True):
    return dspy.Example(question=question, document=document, relevant=relevant).with_inputs(
        "question", "document"
    )


def grader(script):
    lm = ScriptedLM(script)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    crag.grader.view = SentenceFocus(1, CountingEmbedder())
    return crag.grader, lm


def test_the_null_signal_is_one_call_per_question_and_the_title_one_per_passage(ceiling):
    def script(system, user):
        document = field(user, "document")
        return 0.7 if document == "N/A" else 0.2 if document == "Travel Policy v4" else 0.9

    judge, lm = grader(script)
    other = "Who approves travel?"
    examples = [example(), example(relevant=False), example(question=other)]
    with dspy.context(lm=lm):
        scores, failed = ceiling.signal_scores(judge, examples, ["null", "title"])
    assert failed == 0
    assert [{k: round(v, 3) for k, v in s.items()} for s in scores] == [{"null": 0.7, "title": 0.2}] * 3
    shown = [field(user, "document") for _, user in lm.calls]
    # Two questions -> two null calls; three passages -> three title calls; never the view's excerpt.
    assert shown.count("N/A") == 2 and shown.count("Travel Policy v4") == 3 and len(shown) == 5


def test_a_failed_signal_is_unknown_and_counted(ceiling):
    def script(system, user):
        return RuntimeError("the model server went away") if field(user, "document") == "N/A" else 0.4

    judge, lm = grader(script)
    judge.retries = 0
    with dspy.context(lm=lm):
        scores, failed = ceiling.signal_scores(judge, [example()], ["null"])
    assert failed == 1 and scores == [{"null": None}]


def test_unknown_signals_are_refused_before_any_lm_call(ceiling):
    judge, lm = grader(lambda system, user: 0.5)
    with pytest.raises(ValueError, match=r"unknown signals \['whole'\]"):
        ceiling.signal_scores(judge, [example()], ["null", "whole"])
    assert lm.calls == []


def test_feature_rows_hold_the_logits_and_evidence_and_none_for_unknown_scores(ceiling):
    examples = [example(), example(), example()]
    rows = ceiling.feature_rows(
        examples, [0.5, None, 0.5], [{"null": 0.5}, {"null": 0.5}, {"null": None}], ["null"]
    )
    evidence = evidence_features(QUESTION, PASSAGE)
    assert rows[0] == pytest.approx([0.0, *(evidence[f] for f in FITTED_FEATURES), 0.0])
    assert rows[1] is None and rows[2] is None
    assert ceiling.feature_rows(examples[:1], [0.9], [{}], [])[0][0] == pytest.approx(np.log(9))


def synthetic(n, seed, noise=0.0):
    """Rows whose first column (a logit) separates the labels, up to ``noise`` of them flipped."""
    rng = random.Random(seed)
    rows, labels = [], []
    for i in range(n):
        y = i % 2
        rows.append([(4.0 if y else -4.0) + rng.uniform(-1, 1), rng.random(), rng.random(), rng.random()])
        labels.append(1 - y if rng.random() < noise else y)
    return rows, labels


def test_the_shipped_calibrator_is_the_compiles_fit(ceiling):
    rows, labels = synthetic(40, seed=1, noise=0.2)
    model = ceiling.CALIBRATORS["linear C=1"]().fit(np.array(rows), labels)
    names = list(FITTED_FEATURES)
    calibration = fit_calibration(
        [1 / (1 + np.exp(-r[0])) for r in rows], labels, [dict(zip(names, r[1:], strict=True)) for r in rows]
    )
    ours = [calibration(1 / (1 + np.exp(-r[0])), dict(zip(names, r[1:], strict=True))) for r in rows]
    assert model.predict_proba(np.array(rows))[:, 1] == pytest.approx(ours, abs=1e-4)


def test_measure_fits_random_samples_and_the_whole_train_split(ceiling):
    train_rows, train_labels = synthetic(40, seed=2)
    val_rows, val_labels = synthetic(10, seed=3)
    results = ceiling.measure(
        train_rows, train_labels, val_rows, val_labels, sizes=[8, 0, 100], fits=3, seed=0
    )
    assert set(results) == set(ceiling.CALIBRATORS)
    linear = results["linear C=1"]
    # 0 and a size beyond the split both mean one fit on every train example.
    assert list(linear) == ["8", "all"] and linear["8"]["n"] == 3 and linear["all"]["n"] == 1
    assert linear["all"]["mean"] == 1.0 and linear["8"]["min"] <= linear["8"]["mean"] <= linear["8"]["max"]


def test_unknown_rows_are_left_out_of_fits_and_wrong_in_val(ceiling):
    train_rows, train_labels = synthetic(20, seed=4)
    val_rows, val_labels = synthetic(10, seed=5)
    train_rows[0] = None
    val_rows[0] = None
    calibrators = {"linear C=1": ceiling.CALIBRATORS["linear C=1"]}
    results = ceiling.measure(
        train_rows, train_labels, val_rows, val_labels, sizes=[0], fits=1, seed=0, calibrators=calibrators
    )
    assert results["linear C=1"]["all"]["mean"] == 0.9
    assert results["linear C=1"]["all"]["best_cut_mean"] == 0.9
