"""Threshold tuning: the exact search over breakpoints (against brute force), its tie rule, the noise
rule that decides what ships, per-type thresholds, the Optuna journal (what optuna-dashboard reads)
and the compile report's account of them."""

import itertools
import random

import numpy as np
import optuna
import pytest
from fakes import compile_report

from crag_dspy.routing import QUESTION_TYPES, decide_action, question_type
from crag_dspy.thresholds import Thresholds
from optimize.report import write_report
from optimize.threshold_search import ACTIONS as TABLE_ACTIONS
from optimize.threshold_search import Objective, RouteTable, accuracy_grid, cell_midpoints, choose_thresholds
from optimize.thresholds import (
    BreakpointGridSampler,
    QuestionRoutes,
    _grid_study,
    grid_cells,
    route_accuracy,
    route_requests,
    route_table,
    tune_thresholds,
)

ACTIONS = ("CORRECT", "AMBIGUOUS", "INCORRECT")


def _routes(spec, requests=None, types=None):
    """``spec``: (grades, set of actions that answer right) per question."""
    return [
        QuestionRoutes(
            str(i),
            list(grades),
            dict.fromkeys(ACTIONS, ""),
            {a: a in right for a in ACTIONS},
            dict(requests or {}),
            types[i] if types else "other",
        )
        for i, (grades, right) in enumerate(spec)
    ]


def _brute_force(routes):
    """Max accuracy over every pair of candidate thresholds: each grade, just above and below it, 0, 1."""
    grades = {s for r in routes for s in r.scores if s is not None}
    candidates = sorted({0.0, 1.0} | {min(1.0, max(0.0, g + d)) for g in grades for d in (-1e-7, 0.0, 1e-7)})
    return max(
        route_accuracy(routes, lo, up) for lo, up in itertools.combinations_with_replacement(candidates, 2)
    )


def _random_routes(rng, n):
    values = [0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.7, 0.9, 1.0, None]
    spec = []
    for _ in range(n):
        grades = [rng.choice(values) for _ in range(rng.randint(0, 3))]
        spec.append((grades, {a for a in ACTIONS if rng.random() < 0.5}))
    return _routes(spec, {"CORRECT": 3, "AMBIGUOUS": 8, "INCORRECT": 6})


@pytest.mark.parametrize("seed", range(40))
def test_exact_search_equals_brute_force_on_random_sets(seed):
    rng = random.Random(seed)
    routes = _random_routes(rng, rng.randint(1, 9))
    choice = choose_thresholds(route_table(routes), defaults=(0.3, 0.7))
    assert choice.accuracy == pytest.approx(_brute_force(routes))
    # The chosen point really scores the optimum under the routing rule the product uses.
    assert route_accuracy(routes, choice.lower, choice.upper) == pytest.approx(choice.accuracy)
    assert 0.0 <= choice.lower <= choice.upper <= 1.0


@pytest.mark.parametrize("seed", range(20))
def test_the_route_table_routes_every_question_as_decide_action_does(seed):
    """The vectorised route table is the one twin of the product's routing rule: equal on random grades
    (unknown ones included) and random threshold pairs, the edges among them."""
    rng = random.Random(seed)
    routes = _random_routes(rng, 25)
    table = route_table(routes)
    edges = [0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1.0]
    for _ in range(50):
        lower, upper = sorted(rng.choice([*edges, rng.random()]) for _ in range(2))
        routed = [TABLE_ACTIONS[i] for i in table.actions(lower, upper)]
        assert routed == [decide_action(r.scores, lower, upper) for r in routes], (lower, upper)


def test_the_grid_scores_every_point_as_the_routing_rule_does():
    routes = _random_routes(random.Random(7), 30)
    table = route_table(routes)
    points = cell_midpoints(table.breakpoints())
    grid = accuracy_grid(table, points)
    for i, lo in enumerate(points):
        for j, up in enumerate(points):
            expected = route_accuracy(routes, lo, up) if lo <= up else None
            assert (np.isnan(grid[i, j]) and expected is None) or grid[i, j] == pytest.approx(expected)
    assert table.requests_at(0.3, 0.7) == pytest.approx(route_requests(routes, 0.3, 0.7))


def test_cells_cover_the_edges():
    assert list(cell_midpoints(np.array([]))) == [0.5]
    assert list(cell_midpoints(np.array([0.0, 1.0]))) == [0.0, 0.5]  # (1, 1] is empty
    assert list(cell_midpoints(np.array([0.4]))) == [0.2, 0.7]
    # Unknown grades: no breakpoint, never CORRECT or INCORRECT; no documents at all: INCORRECT.
    table = RouteTable.build([[None], []], [dict.fromkeys(ACTIONS, True)] * 2)
    assert list(table.actions(0.3, 0.7)) == [1, 2]


# Q1 needs lower > 0.2 (INCORRECT), Q2 lower <= 0.6 < upper (AMBIGUOUS), Q3 upper <= 0.9 (CORRECT):
# the optimal region is the rectangle lower in (0.2, 0.6], upper in (0.6, 0.9].
RECTANGLE = [([0.2], {"INCORRECT"}), ([0.6], {"AMBIGUOUS"}), ([0.9], {"CORRECT"})]


def test_ties_go_to_the_defaults_when_they_are_optimal():
    choice = choose_thresholds(route_table(_routes(RECTANGLE)), defaults=(0.3, 0.7))
    assert (choice.lower, choice.upper, choice.rule) == (0.3, 0.7, "defaults")


def test_otherwise_ties_go_to_the_point_deepest_inside_the_optimal_region():
    choice = choose_thresholds(route_table(_routes(RECTANGLE)), defaults=(0.1, 0.95))
    assert choice.rule == "deepest" and choice.accuracy == 1.0
    assert choice.depth == pytest.approx(0.15)  # the upper range (0.6, 0.9] is the narrow side
    # Among the deepest points the wider AMBIGUOUS band wins: the smallest lower, the largest upper.
    assert choice.lower == pytest.approx(0.35) and choice.upper == pytest.approx(0.7525)
    assert choice.tied_fraction < 1.0


def test_depth_comes_before_cost():
    # One question, right when CORRECT (upper <= 0.4, cheap) or INCORRECT (lower > 0.4, costly).
    # The INCORRECT region is deeper, so it wins although every question there costs more.
    routes = _routes([([0.4], {"CORRECT", "INCORRECT"})], {"CORRECT": 2, "INCORRECT": 9, "AMBIGUOUS": 11})
    choice = choose_thresholds(route_table(routes), defaults=(0.3, 0.7))
    assert choice.lower > 0.4 and choice.depth == pytest.approx(0.6)  # to (0.4, 1), not INCORRECT
    # Equal depth: the cheaper routing wins.
    routes = _routes([([0.5], {"CORRECT", "INCORRECT"})], {"CORRECT": 2, "INCORRECT": 9, "AMBIGUOUS": 11})
    choice = choose_thresholds(route_table(routes), defaults=(0.3, 0.7))
    assert choice.upper <= 0.5 and route_requests(routes, choice.lower, choice.upper) == 2


def _split_at(points, cut, types=None):
    # Right only when routed CORRECT above the cut and INCORRECT below it: thresholds at the cut win.
    spec = [([p], {"CORRECT"} if p >= cut[i] else {"INCORRECT"}) for i, p in enumerate(points)]
    return _routes(spec, types=types)


def test_tuned_thresholds_ship_only_when_they_beat_the_defaults_out_of_fold():
    points = [round(i / 60, 4) for i in range(60)]
    signal = tune_thresholds(_split_at(points, [0.5] * 60), by_type=False)
    assert signal.shipped == "tuned" and signal.tuned_accuracy == 1.0 and signal.accuracy == 1.0
    assert signal.cross_validation["p"] < 0.05 and (signal.lower, signal.upper) != (0.3, 0.7)
    assert 0.4 < signal.lower <= signal.upper <= 0.6
    # Right/wrong drawn at random: the optimum beats the defaults on val by luck. Tuned thresholds may
    # ship only about as often as the test's alpha allows (1 of these 20 sets), never as a rule.
    shipped = []
    for seed in range(20):
        rng = random.Random(seed)
        noise = _routes([([rng.random()], {a for a in ACTIONS if rng.random() < 0.45}) for _ in range(60)])
        result = tune_thresholds(noise)
        assert result.tuned_accuracy > result.default_accuracy
        shipped.append(result.shipped)
        if result.shipped == "defaults":
            assert (result.lower, result.upper) == (0.3, 0.7) and result.accuracy == result.default_accuracy
            assert "no measured gain" in result.reason
    assert shipped.count("defaults") >= 18
    # Too few questions to cross-validate: the defaults ship, and the reason says so.
    few = tune_thresholds(_split_at([0.1, 0.35, 0.45, 0.8], [0.5] * 4), by_type=False)
    assert few.shipped == "defaults" and "too few" in few.reason


def test_a_web_budget_ships_the_best_thresholds_within_it_when_the_defaults_search_too_much():
    # Every question is right on every route, graded at random: the defaults route nearly all of them
    # AMBIGUOUS or INCORRECT (both search the web); only CORRECT (grade >= upper) searches nothing.
    rng = random.Random(0)
    routes = _routes([([rng.random()], set(ACTIONS)) for _ in range(30)])
    for r in routes:
        r.web = {"CORRECT": 0, "AMBIGUOUS": 1, "INCORRECT": 1}
    budget = Objective.parse("web<=0.2")
    result = tune_thresholds(routes, objective=budget)
    assert result.shipped == "tuned" and "over the budget 0.2" in result.reason
    assert result.web_per_question <= 0.2 < result.default_web_per_question
    assert result.accuracy == 1.0 and result.objective == "accuracy, web <= 0.2"
    # Within budget already: nothing to gain, the defaults ship.
    assert tune_thresholds(routes, objective=Objective.parse("web<=1")).shipped == "defaults"


def test_truthfulness_ships_thresholds_that_trade_wrong_answers_for_abstentions():
    # Below 0.5 the knowledge base answers wrong and the web abstains; above it both answer right. The
    # defaults (0.3, 0.7) send the grades in [0.3, 0.5) to AMBIGUOUS (wrong): thresholds that route them
    # INCORRECT (abstain) score higher in truthfulness and equal in accuracy.
    points = [round(i / 60, 4) for i in range(60)]
    routes = [
        QuestionRoutes(
            str(i),
            [p],
            {"CORRECT": "x", "AMBIGUOUS": "x", "INCORRECT": "x" if p >= 0.5 else "I don't know"},
            {"CORRECT": p >= 0.5, "AMBIGUOUS": p >= 0.5, "INCORRECT": p >= 0.5},
        )
        for i, p in enumerate(points)
    ]
    result = tune_thresholds(routes, objective=Objective.parse("truthfulness"), by_type=False)
    assert result.shipped == "tuned" and result.lower >= 0.45
    assert result.objective_value > result.default_objective_value
    assert result.cross_validation["sign_test"]["wins"] > result.cross_validation["sign_test"]["losses"]
    assert tune_thresholds(routes, by_type=False).shipped == "defaults"  # accuracy: a tie


def test_per_type_thresholds_ship_when_types_need_different_cuts():
    points = [round(i / 40, 4) for i in range(40)] * 2
    types = ["person"] * 40 + ["place"] * 40
    routes = _split_at(points, [0.25] * 40 + [0.75] * 40, types)
    result = tune_thresholds(routes)
    assert result.shipped == "per type" and result.accuracy == 1.0
    assert set(result.by_type) <= {"person", "place"} and result.by_type
    person = result.by_type.get("person", (result.lower, result.upper))
    place = result.by_type.get("place", (result.lower, result.upper))
    assert 0.2 < person[0] <= person[1] <= 0.3 and 0.7 < place[0] <= place[1] <= 0.8
    assert result.per_type["p"] < result.cross_validation["alpha"]  # Bonferroni: two tests at alpha/2


def test_per_type_thresholds_round_trip_and_route_by_question_type():
    thresholds = Thresholds(0.3, 0.7, {"person": (0.2, 0.4)})
    state = thresholds.dump_state()
    assert state == {"lower": 0.3, "upper": 0.7, "by_type": {"person": [0.2, 0.4]}}
    loaded = Thresholds().load_state(state)
    assert loaded.for_question("Who directed Alien?") == (0.2, 0.4, "person")
    assert loaded.for_question("In what city was Ada born?") == (0.3, 0.7, "place")
    assert Thresholds().for_question("Who directed Alien?") == (0.3, 0.7, None)
    assert Thresholds().dump_state() == {"lower": 0.3, "upper": 0.7}  # no key without per-type pairs
    with pytest.raises(ValueError, match="unknown question type"):
        Thresholds().load_state({**state, "by_type": {"colour": [0.1, 0.2]}})
    with pytest.raises(ValueError, match="0 <= lower <= upper <= 1"):
        Thresholds().load_state({**state, "by_type": {"person": [0.6, 0.2]}})


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("Who was the director of Alien?", "person"),
        ("In what city was Ada Lovelace born?", "place"),
        ("Where is the Dunmore site?", "place"),
        ("When was the policy last revised?", "time"),
        ("In which year did the plant open?", "time"),
        ("How many days does a refund take?", "quantity"),
        ("What is John Smith's occupation?", "other"),
    ],
)
def test_question_types_by_question_words(question, kind):
    assert question_type(question) == kind and kind in QUESTION_TYPES


def test_the_grid_is_an_optuna_study_that_resumes_from_its_journal(tmp_path):
    routes = _random_routes(random.Random(1), 12)
    journal = tmp_path / "study.log"
    first = tune_thresholds(routes, storage=journal, study_name="s")
    points = len(cell_midpoints(route_table(routes).breakpoints()))
    valid = points * (points + 1) // 2  # the pairs with lower <= upper
    assert first.trials == first.grid_points == valid and first.storage == str(journal)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) == valid
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert all(t.params["lower"] <= t.params["upper"] for t in study.trials)
    assert max(t.value for t in study.trials) == first.tuned_accuracy
    resumed = tune_thresholds(routes, storage=journal, study_name="s")
    assert resumed.tuned_accuracy == first.tuned_accuracy
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == valid  # none re-run


def _journal_trials(journal, study_name):
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=study_name, storage=storage).trials


def test_the_grid_study_runs_each_valid_cell_once_and_a_rerun_only_what_the_journal_lacks(tmp_path):
    table = route_table(_random_routes(random.Random(3), 12))
    points = [float(p) for p in cell_midpoints(table.breakpoints())]
    cells = grid_cells(points)
    assert len(set(cells)) == len(cells) == len(points) * (len(points) + 1) // 2
    assert all(lower <= upper for lower, upper in cells)
    journal = tmp_path / "study.log"
    # A journal holding the first third of the cells, as an interrupted save would leave it.
    done = len(cells) // 3
    partial = optuna.create_study(
        study_name="s",
        storage=optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal))),
        sampler=BreakpointGridSampler(cells[:done]),
        direction="maximize",
    )
    partial.optimize(lambda t: table.accuracy(*(t.suggest_float(p, 0, 1) for p in ("lower", "upper"))), done)

    best, ran, _, _ = _grid_study(table, points, journal, "s")
    trials = _journal_trials(journal, "s")
    assert ran == len(cells) - done
    assert sorted((t.params["lower"], t.params["upper"]) for t in trials) == sorted(cells)  # each once
    assert best == max(t.value for t in trials) == choose_thresholds(table, (0.3, 0.7)).accuracy
    assert _grid_study(table, points, journal, "s")[:2] == (best, 0)  # nothing left to run
    assert len(_journal_trials(journal, "s")) == len(cells)
    assert _grid_study(table, points, None, "in memory")[:2] == (best, len(cells))


def test_the_sampler_gives_each_trial_the_next_cell_and_no_more():
    cells = [(0.1, 0.1), (0.1, 0.5), (0.5, 0.5)]
    study = optuna.create_study(sampler=BreakpointGridSampler(cells))
    study.optimize(lambda trial: trial.suggest_float("lower", 0, 1) - trial.suggest_float("upper", 0, 1), 3)
    assert [(t.params["lower"], t.params["upper"]) for t in study.trials] == cells
    with pytest.raises(ValueError, match="trial 3 is past the last cell of the grid"):
        study.optimize(lambda trial: 0.0, 1)


def test_no_routes_is_an_error():
    with pytest.raises(ValueError, match="no validation questions"):
        tune_thresholds([])


@pytest.mark.parametrize(
    ("defaults", "rule"),
    [
        ((0.3, 0.7), "deepest inside the optimal region, then to fewer LM requests."),
        ((0.1, 0.95), "deepest inside the optimal region (depth 0.150), then to fewer LM requests."),
    ],
)
def test_report_states_the_tie_rule_with_the_depth_when_there_is_one(tmp_path, defaults, rule):
    # Optimal defaults ship with no depth (NaN); otherwise the deepest point's depth is stated.
    routes = _routes(RECTANGLE)
    thresholds = tune_thresholds(routes, default=defaults, by_type=False).as_dict()
    thresholds |= {
        "questions": len(routes),
        "plot": "program.landscape.png",
        "lm_calls_during_trials": 0,
        "precompute_lm_calls": 0,
    }
    _, md = write_report(compile_report(thresholds=thresholds), tmp_path / "program.json")
    assert rule in md.read_text()
