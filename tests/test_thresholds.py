"""Threshold tuning's samplers and its journal file (what optuna-dashboard reads)."""

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend, JournalStorage

from optimize.thresholds import QuestionRoutes, SobolSampler, route_requests, tune_thresholds

ROUTES = [
    QuestionRoutes(
        str(i),
        [s, s / 2],
        dict.fromkeys(("CORRECT", "AMBIGUOUS", "INCORRECT"), ""),
        {"CORRECT": s > 0.6, "AMBIGUOUS": 0.3 <= s <= 0.6, "INCORRECT": s < 0.3},
    )
    for i, s in enumerate([0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95])
]


def test_sobol_tuning_is_deterministic_and_a_resumed_study_continues_the_sequence(tmp_path):
    once = tune_thresholds(ROUTES, trials=256, seed=4)
    assert once.accuracy == 1.0 and once.sampler == "sobol"
    assert tune_thresholds(ROUTES, trials=256, seed=4).history == once.history
    journal = tmp_path / "study.log"
    tune_thresholds(ROUTES, trials=200, seed=4, storage=journal)
    resumed = tune_thresholds(ROUTES, trials=256, seed=4, storage=journal)
    assert resumed.trials == 256 and resumed.history == once.history
    assert (resumed.lower, resumed.upper) == (once.lower, once.upper)


def test_the_journal_is_an_optuna_study_with_every_trial(tmp_path):
    journal = tmp_path / "runs" / "study.log"
    result = tune_thresholds(ROUTES, trials=120, seed=0, storage=journal, study_name="s")
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert len(study.trials) == 120 and result.storage == str(journal)
    assert study.best_value == result.accuracy
    assert all("upper" in t.user_attrs for t in study.trials)
    written = journal.read_bytes()
    assert tune_thresholds(ROUTES, trials=120, seed=0, storage=journal, study_name="s").trials == 120
    assert journal.read_bytes() == written  # nothing left to run: nothing written


def test_tpe_is_available_and_bad_arguments_are_errors():
    assert tune_thresholds(ROUTES, trials=40, seed=0, sampler="tpe").sampler == "tpe"
    with pytest.raises(ValueError, match="unknown sampler"):
        tune_thresholds(ROUTES, trials=10, sampler="grid")
    with pytest.raises(ValueError, match="no validation questions"):
        tune_thresholds([], trials=10)


def test_sobol_sampler_covers_the_square_and_refuses_to_run_past_its_points():
    sampler = SobolSampler(("lower", "gap"), n=64, seed=1)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: t.suggest_float("lower", 0, 1) + t.suggest_float("gap", 0, 1), n_trials=64)
    lowers = sorted(t.params["lower"] for t in study.trials)
    assert all(int(64 * x) == i for i, x in enumerate(lowers))  # one point in each 1/64 stripe
    with pytest.raises(ValueError, match="built for 64 trials"):
        study.optimize(lambda t: t.suggest_float("lower", 0, 1), n_trials=1, catch=())


def _plateau_routes(requests: dict[str, int] | None) -> list[QuestionRoutes]:
    # Every action answers right, so every (lower, upper) ties at 100%; only cost can choose.
    right = dict.fromkeys(("CORRECT", "AMBIGUOUS", "INCORRECT"), True)
    return [
        QuestionRoutes(str(i), [s], dict.fromkeys(right, ""), right, dict(requests or {}))
        for i, s in enumerate([0.1, 0.5, 0.9])
    ]


def test_ties_go_to_the_cheapest_routing_then_to_the_widest_ambiguous_band():
    costly_web = _plateau_routes({"CORRECT": 6, "AMBIGUOUS": 10, "INCORRECT": 10})
    assert route_requests(costly_web, 0.3, 0.7) == (10 + 10 + 6) / 3
    assert route_requests(costly_web, 0.0, 0.05) == 6  # everything CORRECT
    cheap = tune_thresholds(costly_web, trials=256, seed=0)
    assert cheap.accuracy == 1.0 and cheap.upper <= 0.1  # all three questions CORRECT
    assert cheap.requests_per_question == 6 and cheap.default_requests_per_question == 26 / 3
    # Without costs (routes from before they were recorded) the widest band wins, as it always did.
    wide = tune_thresholds(_plateau_routes(None), trials=256, seed=0)
    assert wide.lower < 0.1 and wide.upper > 0.9 and wide.requests_per_question == 0
