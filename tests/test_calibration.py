"""Judge calibration: a monotone, fitted, saved map from the model's P(yes) to the reported score."""

import math
import random

import dspy
import pytest
from fakes import ScriptedLM

from crag_dspy.judges.calibration import Calibration, fit_calibration
from crag_dspy.judges.llm import BinaryJudge
from signatures import GradeDocument

GRID = [0.0, 1e-9, 0.01, 0.2, 0.5, 0.7, 0.99, 1.0]


def test_default_is_identity():
    c = Calibration()
    assert c.is_identity
    assert [c(p) for p in GRID] == GRID
    assert c.cut() == pytest.approx(0.5)


@pytest.mark.parametrize(("slope", "intercept"), [(0.5, -1.0), (1.0, 2.0), (3.0, 0.3), (20.0, -15.0)])
def test_map_is_monotone_bounded_and_cuts_where_it_says(slope, intercept):
    c = Calibration(slope, intercept)
    values = [c(p) for p in GRID]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert values == sorted(values)
    assert c(c.cut()) == pytest.approx(0.5, abs=1e-9)


@pytest.mark.parametrize(("slope", "intercept"), [(0.0, 0.0), (-1.0, 0.0), (math.nan, 0.0), (1.0, math.inf)])
def test_invalid_calibrations_are_refused(slope, intercept):
    with pytest.raises(ValueError):
        Calibration(slope, intercept)
    with pytest.raises(ValueError):
        Calibration().load_state({"slope": slope, "intercept": intercept})


def test_state_round_trip_and_reset_keeps_it():
    c = Calibration(2.5, -1.25)
    restored = Calibration().load_state(c.dump_state())
    restored.reset()
    assert restored.dump_state() == {"slope": 2.5, "intercept": -1.25, "weights": {}}


def test_fit_moves_the_cut_to_where_the_labels_change():
    # An over-confident yes-sayer: positives at P(yes) ~0.95, negatives at ~0.75; the raw 0.5 cut says
    # "yes" to everything, the fitted cut sits between the two groups.
    rng = random.Random(0)
    scores = [min(0.999, max(0.5, rng.gauss(0.95, 0.02))) for _ in range(40)]
    scores += [min(0.9, max(0.5, rng.gauss(0.75, 0.05))) for _ in range(40)]
    labels = [1] * 40 + [0] * 40
    c = fit_calibration(scores, labels)
    assert 0.75 < c.cut() < 0.95
    calibrated_accuracy = sum((c(s) >= 0.5) == bool(y) for s, y in zip(scores, labels)) / 80
    raw_accuracy = sum((s >= 0.5) == bool(y) for s, y in zip(scores, labels)) / 80
    assert raw_accuracy == 0.5 and calibrated_accuracy > 0.9


def test_fit_ignores_unknown_scores_and_refuses_unusable_data():
    assert fit_calibration([0.9, None, 0.8, 0.2, 0.1, None], [1, 1, 1, 0, 0, 0]).slope > 0
    with pytest.raises(ValueError, match="2 positive and 2 negative"):
        fit_calibration([0.9, 0.8, 0.1], [1, 1, 0])
    with pytest.raises(ValueError, match="2 positive and 2 negative"):
        fit_calibration([0.9, None, None, 0.1, 0.2], [1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="do not rank"):
        fit_calibration([0.1, 0.2, 0.15, 0.9, 0.8, 0.85] * 5, [1, 1, 1, 0, 0, 0] * 5)
    with pytest.raises(ValueError):
        fit_calibration([0.5], [1, 0])


def test_judge_reports_calibrated_score_and_keeps_the_raw_one():
    lm = ScriptedLM(lambda system, user: 0.8)
    judge = BinaryJudge(GradeDocument)
    judge.calibration.load_state({"slope": 1.0, "intercept": -math.log(4.0)})  # maps 0.8 to 0.5
    with dspy.context(lm=lm):
        j = judge(question="q?", document="d").judgement
    assert j.raw_score == pytest.approx(0.8, abs=1e-6)
    assert j.score == pytest.approx(0.5, abs=1e-6)
    assert j.score_source == "logprobs"


def test_calibration_is_saved_with_the_judge_state():
    judge = BinaryJudge(GradeDocument)
    judge.calibration.load_state({"slope": 2.0, "intercept": 0.5})
    names = dict(judge.named_parameters())
    assert names["calibration"].dump_state() == {"slope": 2.0, "intercept": 0.5, "weights": {}}
    fresh = BinaryJudge(GradeDocument)
    fresh.load_state(judge.dump_state())
    assert fresh.calibration.dump_state() == {"slope": 2.0, "intercept": 0.5, "weights": {}}


# --- calibrations that weigh lexical evidence -------------------------------------------------------

FULL = {"term_coverage": 1.0, "number_coverage": 1.0}
NONE = {"term_coverage": 0.0, "number_coverage": 1.0}


def test_evidence_weights_round_trip_and_format_2_state_loads_without_them():
    c = Calibration(1.5, -2.0, {"term_coverage": 3.0, "number_coverage": 1.0})
    assert c.uses_evidence and not c.is_identity
    restored = Calibration().load_state(c.dump_state())
    assert restored.dump_state() == c.dump_state()
    assert restored(0.4, FULL) == c(0.4, FULL)
    old = Calibration().load_state({"slope": 1.5, "intercept": -2.0})  # a format-2 program's state
    assert not old.uses_evidence and old.weights == {}


@pytest.mark.parametrize(
    "weights",
    [{"length": 1.0}, {"term_coverage": math.nan}, {"number_coverage": math.inf}],
)
def test_unknown_or_non_finite_evidence_weights_are_refused(weights):
    with pytest.raises(ValueError):
        Calibration(1.0, 0.0, weights)
    with pytest.raises(ValueError):
        Calibration().load_state({"slope": 1.0, "intercept": 0.0, "weights": weights})


def test_evidence_is_required_when_weighed_and_shifts_the_score():
    c = Calibration(1.0, -2.0, {"term_coverage": 3.0})
    with pytest.raises(ValueError, match="term_coverage"):
        c(0.5)
    with pytest.raises(ValueError, match="term_coverage"):
        c(0.5, {"number_coverage": 1.0})
    # Same P(yes): a text with all the question's terms scores higher than one with none.
    assert c(0.5, FULL) > c(0.5, NONE)
    assert c(0.5, FULL) == pytest.approx(1 / (1 + math.exp(-1.0)))


@pytest.mark.parametrize("evidence", [FULL, NONE, {"term_coverage": 0.5, "number_coverage": 0.0}])
def test_with_evidence_the_map_stays_monotone_in_p_and_cuts_where_it_says(evidence):
    c = Calibration(2.0, -3.0, {"term_coverage": 2.5, "number_coverage": 0.7})
    values = [c(p, evidence) for p in GRID]
    assert values == sorted(values) and all(0.0 <= v <= 1.0 for v in values)
    assert c(c.cut(evidence), evidence) == pytest.approx(0.5, abs=1e-9)


def test_fit_with_evidence_learns_what_p_yes_alone_misses():
    # P(yes) is uninformative between 0.4 and 0.6; whether the text holds the question's terms decides.
    rng = random.Random(1)
    scores, labels, evidence = [], [], []
    for i in range(120):
        label = i % 2
        scores.append(rng.uniform(0.4, 0.6) if i % 3 else (0.9 if label else 0.1))
        evidence.append(
            {
                "term_coverage": rng.uniform(0.7, 1.0) if label else rng.uniform(0.0, 0.5),
                "number_coverage": 1.0,
            }
        )
        labels.append(label)
    plain = fit_calibration(scores, labels)
    weighed = fit_calibration(scores, labels, evidence)
    assert set(weighed.weights) == {"term_coverage", "number_coverage"}
    assert weighed.weights["term_coverage"] > 0 and weighed.slope > 0
    plain_acc = sum((plain(s) >= 0.5) == bool(y) for s, y in zip(scores, labels)) / 120
    weighed_acc = sum((weighed(s, e) >= 0.5) == bool(y) for s, y, e in zip(scores, labels, evidence)) / 120
    assert weighed_acc > 0.95 > plain_acc


def test_fit_refuses_evidence_of_the_wrong_length():
    with pytest.raises(ValueError, match="evidence rows"):
        fit_calibration([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0], [FULL] * 3)


def test_judge_reads_evidence_from_the_whole_inputs_not_the_view_and_rescores_alike():
    lm = ScriptedLM(lambda system, user: 0.5)
    judge = BinaryJudge(GradeDocument, view=lambda inputs: {**inputs, "document": "an excerpt"})
    judge.calibration = Calibration(1.0, -2.0, {"term_coverage": 4.0})
    inputs = {"question": "Which flange fits the AquaProbe?", "document": "The AquaProbe flange fits: ..."}
    with dspy.context(lm=lm):
        j = judge(**inputs).judgement
    assert j.shown == {"document": "an excerpt"}
    assert j.evidence == {"term_coverage": 1.0}  # what the calibration weighs, nothing more
    assert j.score == pytest.approx(1 / (1 + math.exp(-2.0)), abs=1e-6)
    assert judge.rescore(j, inputs) == pytest.approx(j.score)
    judge.calibration = Calibration()
    assert judge.rescore(j, inputs) == pytest.approx(0.5, abs=1e-6)
    assert judge.evidence(inputs) is None  # an identity calibration weighs nothing
    assert judge.evidence(inputs, weighed_only=False)["term_coverage"] == 1.0
