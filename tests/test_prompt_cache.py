"""The KV-cache bookkeeping of the ik_llama engine, without a model."""

import random

import pytest

from crag_dspy.lm.prompt_cache import PromptCache, common_prefix

GRADER = list(range(1000, 1150))  # one family's instructions: 150 tokens
STRIPS = list(range(2000, 2150))  # another family's


def serve(cache: PromptCache, prompt: list[int], generated: int = 0):
    plan = cache.plan(prompt, reserve=generated)
    cache.commit(plan, prompt + list(range(9000, 9000 + generated)))
    return plan


def test_common_prefix():
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3


def test_a_prompt_of_the_same_family_continues_the_shared_prefix_in_place():
    cache = PromptCache(slots=4, capacity=10_000)
    first = serve(cache, GRADER + [1, 2, 3] + [50, 51])
    assert (first.slot, first.start) == (0, 0)
    second = cache.plan(GRADER + [1, 2, 3] + [60, 61, 62])
    assert (second.slot, second.start) == (0, 153)  # instructions + question come from the cache


def test_the_same_prompt_again_evaluates_only_its_last_token():
    cache = PromptCache(slots=2, capacity=1000)
    prompt = GRADER + [7, 8]
    serve(cache, prompt)
    plan = cache.plan(prompt)
    assert (plan.slot, plan.start) == (0, len(prompt) - 1)  # its logits are the answer's first token


def test_another_family_takes_a_free_sequence_and_keeps_the_first_familys_prefix():
    cache = PromptCache(slots=4, capacity=10_000)
    serve(cache, GRADER + [1, 50])
    other = serve(cache, STRIPS + [1, 70])
    assert other.slot == 1 and other.start == 0
    back = cache.plan(GRADER + [1, 51])
    assert (back.slot, back.start) == (0, 151)


def test_a_short_shared_prefix_is_not_worth_cutting_another_familys_prompt():
    cache = PromptCache(slots=2, capacity=10_000, min_shared=16)
    serve(cache, [1, 2, 3] + GRADER)
    plan = cache.plan([1, 2, 3] + STRIPS)  # shares only the template's first tokens
    assert plan.slot == 1 and plan.start == 0


def test_the_least_recently_used_sequence_is_reused_when_all_are_taken():
    cache = PromptCache(slots=2, capacity=10_000)
    serve(cache, GRADER + [1])
    serve(cache, STRIPS + [1])
    serve(cache, GRADER + [2])  # slot 0 used again: slot 1 is now the older
    plan = cache.plan(list(range(3000, 3100)))
    assert plan.slot == 1 and plan.start == 0


def test_among_equal_prefixes_the_most_recent_sequence_is_continued():
    cache = PromptCache(slots=3, capacity=10_000)
    serve(cache, GRADER + [1, 2])
    serve(cache, STRIPS)
    serve(cache, GRADER + [1, 3])  # same prefix, continues slot 0 in place
    assert cache.tokens(0) == GRADER + [1, 3]
    assert cache.plan(GRADER + [1, 4]).slot == 0


def test_generated_tokens_count_as_held():
    cache = PromptCache(slots=1, capacity=10_000)
    serve(cache, GRADER + [1], generated=3)
    assert cache.tokens(0) == GRADER + [1, 9000, 9001, 9002]
    assert cache.plan(GRADER + [1, 9000, 9001, 9002, 5]).start == len(GRADER) + 4  # a multi-turn continuation


def test_least_recent_sequences_are_evicted_so_that_the_new_prompt_fits():
    cache = PromptCache(slots=4, capacity=500)
    serve(cache, GRADER + [1])  # 151 held, slot 0
    serve(cache, STRIPS + [1])  # 151 held, slot 1
    plan = cache.plan(list(range(3000, 3300)))  # 300 new tokens: 602 > 500
    assert plan.slot == 2
    assert plan.evict == (0,)  # the oldest goes first, and only as many as needed
    cache.commit(plan, list(range(3000, 3300)))
    assert cache.tokens(0) == [] and cache.tokens(1) == STRIPS + [1]
    assert cache.used_cells() <= cache.capacity


def test_the_sequence_being_continued_is_never_evicted():
    cache = PromptCache(slots=2, capacity=400)
    serve(cache, GRADER + [1])
    serve(cache, STRIPS + [1])
    plan = cache.plan(GRADER + [1] + list(range(100)), reserve=10)
    assert plan.slot == 0 and 0 not in plan.evict and plan.evict == (1,)


def test_a_prompt_longer_than_the_context_is_refused():
    cache = PromptCache(slots=2, capacity=100)
    with pytest.raises(ValueError, match="exceeds the context of 100 tokens"):
        cache.plan(list(range(95)), reserve=10)
    with pytest.raises(ValueError, match="empty prompt"):
        cache.plan([])


def test_a_cleared_sequence_shares_nothing():
    cache = PromptCache(slots=1, capacity=1000)
    serve(cache, GRADER + [1])
    cache.clear(0)
    assert cache.plan(GRADER + [2]).start == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_traffic_keeps_the_invariants(seed):
    """Whatever the traffic, a plan reuses exactly the prefix its sequence holds, evaluates at least
    one token, and the sequences stay within capacity."""
    rng = random.Random(seed)
    families = [list(range(f * 1000, f * 1000 + rng.randint(20, 200))) for f in range(1, 6)]
    cache = PromptCache(slots=3, capacity=1500)
    for _ in range(300):
        prompt = rng.choice(families) + [rng.randint(0, 5) for _ in range(rng.randint(1, 3))]
        prompt += [rng.randint(100, 999) for _ in range(rng.randint(1, 300))]
        before = {i: cache.tokens(i) for i in range(cache.slots)}
        plan = cache.plan(prompt, reserve=rng.randint(1, 20))
        assert plan.slot not in plan.evict
        assert plan.start == min(common_prefix(before[plan.slot], prompt), len(prompt) - 1)
        assert plan.start == max(min(common_prefix(t, prompt), len(prompt) - 1) for t in before.values()) or (
            plan.start < cache.min_shared
        )
        cache.commit(plan, prompt)
        assert cache.used_cells() <= cache.capacity
