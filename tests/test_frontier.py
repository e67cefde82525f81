"""The frontier, routing lift and oracle headroom: pure NumPy over a hand-built route table (no LM)."""

import itertools

import numpy as np
import pytest

from optimize.frontier import (
    Baselines,
    frontier_points,
    frontier_summary,
    oracle_headroom,
    pareto,
    routing_lift,
)
from optimize.threshold_search import Objective, RouteTable, choose_thresholds

A = ("CORRECT", "AMBIGUOUS", "INCORRECT")
WEB = {"CORRECT": 0, "AMBIGUOUS": 1, "INCORRECT": 1}
REQUESTS = {"CORRECT": 4, "AMBIGUOUS": 7, "INCORRECT": 5}


def table(spec):
    """``spec``: (best grade, actions answering right, actions answering "I don't know") per question."""
    return RouteTable.build(
        [[g] for g, _, _ in spec],
        [{a: a in right for a in A} for _, right, _ in spec],
        [REQUESTS] * len(spec),
        abstained=[{a: a in idk for a in A} for _, _, idk in spec],
        web=[WEB] * len(spec),
    )


SPEC = [
    (0.9, {"CORRECT", "AMBIGUOUS"}, set()),  # the knowledge base answers it
    (0.6, {"AMBIGUOUS", "INCORRECT"}, set()),  # the web answers it
    (0.2, {"INCORRECT"}, {"CORRECT"}),  # only the web; the KB alone abstains
    (0.1, set(), {"CORRECT", "AMBIGUOUS", "INCORRECT"}),  # nothing answers: every route abstains
]


def test_frontier_points_cover_every_outcome_and_match_routing():
    t = table(SPEC)
    points = frontier_points(t)
    for p in points:  # each point is what routing with its thresholds gives
        assert p.accuracy == pytest.approx(t.accuracy(p.lower, p.upper))
        assert p.web == pytest.approx(t.at(t.web, p.lower, p.upper).mean())
        assert p.correct + p.ambiguous + p.incorrect == pytest.approx(1.0)
    # Everything CORRECT searches nothing and answers one question; the best point searches 3 of 4.
    assert min(p.web for p in points) == 0.0
    assert max(p.accuracy for p in points) == pytest.approx(0.75)
    front = pareto(points)
    assert [round(p.web, 2) for p in front] == sorted(round(p.web, 2) for p in front)
    assert all(a.accuracy < b.accuracy for a, b in itertools.pairwise(front))
    assert front[-1].accuracy == pytest.approx(0.75)


def test_routing_lift_is_accuracy_above_the_uninformed_line():
    t = table(SPEC)
    rag = Baselines.build([(True, False), (False, False), (False, True), (False, True)], None)
    both = Baselines.build(
        [(True, False), (False, False), (False, True), (False, True)],
        [(True, False), (True, False), (True, False), (False, True)],
    )
    # (0.3, 0.7): q1 CORRECT, q2 AMBIGUOUS, q3 and q4 INCORRECT: 3 right, web share 3/4.
    lift = routing_lift(t, both, 0.3, 0.7)
    line = 0.25 * 0.25 + 0.75 * 0.75  # plain RAG 1/4, always 3/4
    assert lift.value == pytest.approx(0.75 - line)
    assert lift.low <= lift.value <= lift.high
    # Without web search the line is plain RAG.
    assert routing_lift(t, rag, 0.3, 0.7).value == pytest.approx(0.75 - 0.25)
    truth = routing_lift(t, both, 0.3, 0.7, metric="truthfulness")
    # Truthfulness: CRAG +1 +1 +1 0; plain RAG +1 -1 0 0 = 0; always +1 +1 +1 0 = 0.75.
    assert truth.value == pytest.approx(0.75 - (0.25 * 0.0 + 0.75 * 0.75))


def test_oracle_headroom_is_the_best_action_per_question_minus_the_routed_one():
    t = table(SPEC)
    oracle, headroom = oracle_headroom(t, 0.95, 0.95)  # every graded question INCORRECT: q2, q3 right
    assert oracle.value == pytest.approx(0.75)
    assert headroom.value == pytest.approx(0.25)
    assert headroom.low <= headroom.value <= headroom.high


def test_objectives_truthfulness_and_web_budget_choose_other_points():
    t = table(SPEC)
    best = choose_thresholds(t, (0.3, 0.7))
    assert best.accuracy == pytest.approx(0.75) and best.rule == "defaults"
    budget = Objective.parse("web<=0.5")
    chosen = choose_thresholds(t, (0.3, 0.7), budget)
    assert t.at(t.web, chosen.lower, chosen.upper).mean() <= 0.5
    assert chosen.accuracy == pytest.approx(t.accuracy(chosen.lower, chosen.upper)) == pytest.approx(0.5)
    truth = choose_thresholds(t, (0.3, 0.7), Objective.parse("truthfulness"))
    assert truth.accuracy == pytest.approx(0.75)  # 3 right, 1 abstention: +0.75
    with pytest.raises(ValueError, match="fewest web searches per question"):
        choose_thresholds(
            RouteTable.build([[]], [dict.fromkeys(A, True)], web=[WEB]),
            (0.3, 0.7),
            Objective.parse("web<=0.5"),
        )


@pytest.mark.parametrize("text", ["web<=2", "speed", "web<0.5", "web<=-1"])
def test_unknown_objectives_are_refused_with_the_forms_that_work(text):
    with pytest.raises(ValueError, match="accuracy|web budget"):
        Objective.parse(text)


def test_objective_forms_parse():
    assert Objective.parse("accuracy") == Objective()
    assert Objective.parse(" Truthfulness ").metric == "truthfulness"
    assert Objective.parse("web<=0.6") == Objective("accuracy", 0.6)
    assert Objective.parse("web <= .5").web_budget == 0.5
    assert np.isclose(Objective.parse("web<=1").web_budget, 1.0)


def test_tokens_are_a_cost_axis_of_the_frontier_with_the_baselines_points():
    tokens = {"CORRECT": 300, "AMBIGUOUS": 900, "INCORRECT": 500}
    t = RouteTable.build(
        [[g] for g, _, _ in SPEC],
        [{a: a in right for a in A} for _, right, _ in SPEC],
        [REQUESTS] * len(SPEC),
        abstained=[{a: a in idk for a in A} for _, _, idk in SPEC],
        web=[WEB] * len(SPEC),
        tokens=[tokens] * len(SPEC),
    )
    points = frontier_points(t)
    for p in points:
        assert p.tokens == pytest.approx(t.at(t.tokens, p.lower, p.upper).mean())
    assert min(p.tokens for p in points) == 300 and max(p.tokens for p in points) == 900
    front = pareto(points, "accuracy", "tokens")
    assert all(a.tokens <= b.tokens and a.accuracy < b.accuracy for a, b in itertools.pairwise(front))
    both = Baselines.build(
        [(True, False)] * 4, [(True, False)] * 4, rag_tokens=[200, 200, 200, 400], web_tokens=[600] * 4
    )
    summary = frontier_summary(t, both, (0.3, 0.7))
    assert summary["baselines"]["plain RAG"]["tokens"] == 250
    assert summary["baselines"]["RAG + web always"]["tokens"] == 600
    assert summary["at"]["tokens"] == pytest.approx((300 + 900 + 500 + 500) / 4)
    assert summary["accuracy_tokens_frontier"] == [p.as_dict() for p in front]
    # Baselines measured without their tokens have none (a report draws no point for them).
    assert "tokens" not in Baselines.build([(True, False)] * 4).points()["plain RAG"]


@pytest.mark.parametrize("slope,intercept", [(1.0, 0.0), (2.5, -1.2), (0.4, 0.8), (1.7, 2.0)])
def test_defaults_carried_through_a_calibration_route_every_question_as_the_uncalibrated_judge(
    slope, intercept
):
    from types import SimpleNamespace

    from crag_dspy.judges.calibration import Calibration
    from crag_dspy.routing import DEFAULT_THRESHOLDS, decide_action
    from optimize.thresholds import defaults_on_scale

    calibration = Calibration(slope, intercept)
    (lower, upper), note = defaults_on_scale(SimpleNamespace(calibration=calibration))
    if calibration.is_identity:
        assert (lower, upper) == DEFAULT_THRESHOLDS and "own P(yes)" in note
    else:
        assert "carried" in note
    rng = np.random.default_rng(0)
    for _ in range(300):
        raw = rng.uniform(0, 1, size=rng.integers(1, 6)).round(3).tolist()
        calibrated = [calibration(p) for p in raw]
        assert decide_action(calibrated, lower, upper) == decide_action(raw, *DEFAULT_THRESHOLDS)


def test_defaults_stay_for_graders_with_no_map_to_p_yes():
    from types import SimpleNamespace

    from crag_dspy.judges.calibration import Calibration
    from crag_dspy.routing import DEFAULT_THRESHOLDS
    from optimize.thresholds import defaults_on_scale

    evidence = SimpleNamespace(calibration=Calibration(1.5, 0.2, {"term_coverage": 1.0}))
    assert defaults_on_scale(evidence) == (DEFAULT_THRESHOLDS, defaults_on_scale(evidence)[1])
    assert "evidence" in defaults_on_scale(evidence)[1]
    assert defaults_on_scale(object())[0] == DEFAULT_THRESHOLDS  # a trained evaluator: no calibration
