import math

import pytest

from crag_dspy.judges.scoring import clamp_score, yes_probability


def lp(*tokens, top=None):
    content = [{"token": t, "logprob": -0.1, "top_logprobs": top or []} for t in tokens]
    return {"content": content}


def test_yes_probability_normalises_over_yes_and_no_variants():
    top = [
        {"token": "yes", "logprob": math.log(0.6)},
        {"token": " Yes", "logprob": math.log(0.1)},
        {"token": "No", "logprob": math.log(0.2)},
        {"token": "maybe", "logprob": math.log(0.1)},
    ]
    assert yes_probability(lp("yes", top=top)) == pytest.approx(0.7 / 0.9)


def test_yes_probability_skips_format_tokens_before_the_answer():
    top = [{"token": "no", "logprob": math.log(0.75)}, {"token": "yes", "logprob": math.log(0.25)}]
    logprobs = {
        "content": [
            {"token": "[[", "logprob": 0, "top_logprobs": []},
            {"token": "no", "logprob": math.log(0.75), "top_logprobs": top},
        ]
    }
    assert yes_probability(logprobs) == pytest.approx(0.25)


def test_yes_probability_none_when_no_decision_token():
    assert yes_probability(None) is None
    assert yes_probability({"content": []}) is None
    assert yes_probability(lp("perhaps")) is None


def test_yes_probability_accepts_objects():
    class Obj:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    alt = [Obj(token="true", logprob=math.log(0.9)), Obj(token="false", logprob=math.log(0.1))]
    assert yes_probability(Obj(content=[Obj(token="true", logprob=0, top_logprobs=alt)])) == pytest.approx(
        0.9
    )


def test_clamp_score():
    assert clamp_score(1.5) == 1.0 and clamp_score(-2) == 0.0 and clamp_score(0.25) == 0.25
    with pytest.raises(ValueError):
        clamp_score(float("nan"))
