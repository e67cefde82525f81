import itertools

import pytest

from crag_dspy.routing import Action, decide_action, validate_thresholds


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([0.7], Action.CORRECT),  # exactly upper -> CORRECT
        ([0.6999], Action.AMBIGUOUS),
        ([0.3], Action.AMBIGUOUS),  # exactly lower is not below lower
        ([0.2999], Action.INCORRECT),
        ([0.0, 0.1, 0.29], Action.INCORRECT),
        ([0.0, 0.9], Action.CORRECT),  # any document >= upper wins
        ([0.1, 0.5], Action.AMBIGUOUS),
        ([], Action.INCORRECT),  # nothing retrieved: nothing internal to use
        ([None], Action.AMBIGUOUS),  # unknown grade: no claim either way
        ([None, 0.1], Action.AMBIGUOUS),  # one unknown blocks INCORRECT
        ([None, 0.95], Action.CORRECT),  # a known high grade still counts
        ([1.0, None, 0.0], Action.CORRECT),
    ],
)
def test_decide_action_boundaries(scores, expected):
    assert decide_action(scores, lower=0.3, upper=0.7) is expected


def test_equal_thresholds_leave_no_ambiguous_band():
    assert decide_action([0.5], 0.5, 0.5) is Action.CORRECT
    assert decide_action([0.4999], 0.5, 0.5) is Action.INCORRECT


def test_exhaustive_grid_matches_definition():
    grid = [i / 10 for i in range(11)]
    for lower, upper in itertools.product(grid, grid):
        if lower > upper:
            continue
        for scores in itertools.product(grid, repeat=2):
            action = decide_action(list(scores), lower, upper)
            if max(scores) >= upper:
                assert action is Action.CORRECT
            elif max(scores) < lower:
                assert action is Action.INCORRECT
            else:
                assert action is Action.AMBIGUOUS


@pytest.mark.parametrize(("lower", "upper"), [(0.8, 0.2), (-0.1, 0.5), (0.2, 1.1)])
def test_invalid_thresholds_rejected(lower, upper):
    with pytest.raises(ValueError, match="lower <= upper"):
        validate_thresholds(lower, upper)
    with pytest.raises(ValueError):
        decide_action([0.5], lower, upper)


def test_action_sources():
    assert Action.CORRECT.uses_internal and not Action.CORRECT.uses_web
    assert not Action.INCORRECT.uses_internal and Action.INCORRECT.uses_web
    assert Action.AMBIGUOUS.uses_internal and Action.AMBIGUOUS.uses_web
