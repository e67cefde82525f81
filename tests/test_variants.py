"""The paper's ablations as pure re-routing: every score configuration, every removed action."""

import itertools

import pytest

from crag_dspy.routing import Action, ablated_action, decide_action
from optimize.variants import table_variants

C, A, I = Action.CORRECT, Action.AMBIGUOUS, Action.INCORRECT

# (scores, action with lower=0.3 / upper=0.7, w/o Correct, w/o Incorrect, w/o Ambiguous)
CASES = [
    ([0.9, 0.1], C, A, C, C),
    ([0.7], C, A, C, C),  # upper is inclusive
    ([0.69, 0.2], A, A, A, C),  # best grade 0.69 >= midpoint 0.5: nearer upper
    ([0.5], A, A, A, C),  # exactly the midpoint goes to CORRECT
    ([0.49, 0.1], A, A, A, I),  # nearer lower
    ([0.3], A, A, A, I),  # lower is inclusive for AMBIGUOUS
    ([0.29, 0.0], I, I, A, I),
    ([], I, I, A, I),  # nothing retrieved
    ([None, None], A, A, A, I),  # no known grade: no evidence the retrieval is right
    ([None, 0.1], A, A, A, I),  # an unknown grade prevents INCORRECT, but not in w/o Ambiguous
    ([None, 0.6], A, A, A, C),
    ([None, 0.8], C, A, C, C),
]


@pytest.mark.parametrize(("scores", "base", "no_correct", "no_incorrect", "no_ambiguous"), CASES)
def test_ablated_action(scores, base, no_correct, no_incorrect, no_ambiguous):
    assert ablated_action(scores, 0.3, 0.7) is base is decide_action(scores, 0.3, 0.7)
    assert ablated_action(scores, 0.3, 0.7, C) is no_correct
    assert ablated_action(scores, 0.3, 0.7, I) is no_incorrect
    assert ablated_action(scores, 0.3, 0.7, A) is no_ambiguous


GRID = [None, 0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]


@pytest.mark.parametrize("remove", [C, A, I])
def test_a_removed_action_is_never_taken_and_others_are_kept(remove):
    for n in range(4):
        for scores in itertools.product(GRID, repeat=n):
            for lower, upper in [(0.3, 0.7), (0.0, 1.0), (0.5, 0.5), (0.2, 0.9)]:
                base = decide_action(scores, lower, upper)
                ablated = ablated_action(scores, lower, upper, remove)
                assert ablated is not remove
                if base is not remove:
                    assert ablated is base


def test_ablated_action_validates_thresholds():
    with pytest.raises(ValueError):
        ablated_action([0.5], 0.8, 0.2, A)


def test_table_rows():
    with_program = [v.name for v in table_variants(True)]
    without = [v.name for v in table_variants(False)]
    assert with_program[:5] == [
        "no retrieval",
        "plain RAG",
        "RAG + web always",
        "CRAG (default thresholds)",
        "CRAG (program)",
    ]
    assert with_program[5] == "CRAG + internal retry"
    assert without == [n for n in with_program if n != "CRAG (program)"]
    (retry,) = [v for v in table_variants(True) if v.internal_retries is not None]
    assert (retry.program, retry.group, retry.internal_retries) == ("main", "crag", 2)
    crag_only = [v.name for v in table_variants(True, "crag")]
    assert crag_only == ["CRAG (default thresholds)", "CRAG (program)"]
    assert [v.name for v in table_variants(False, "crag")] == ["CRAG (default thresholds)"]
    ablations = [v for v in table_variants(True) if v.group == "ablation"]
    assert len(ablations) == 6 and all(v.program == "main" for v in ablations)
    assert sum(v.ablation.remove is not None for v in ablations) == 3
    assert [
        (v.ablation.refine, v.ablation.rewrite, v.ablation.select) for v in ablations if not v.ablation.remove
    ] == [
        (False, True, True),
        (True, False, True),
        (True, True, False),
    ]
