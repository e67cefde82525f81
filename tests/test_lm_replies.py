"""Untrusted LM reply content: a reply far past max_tokens, impossible logprobs, and what the trace quotes
of a reply (probe 3: H4, M9, L5)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from fake_servers import FakeOpenAI
from fakes import ListRetriever, ListWebSearch, ScriptedLM
from test_lm_faults import GOOD, QUESTION, ask, by_stage, script, stage_of

from crag_dspy import CRAG
from crag_dspy.adapters import LEAST_REPLY_LIMIT, reply_limit
from crag_dspy.citations import cite
from crag_dspy.faults import LMUnavailableError
from crag_dspy.grounding import SupportText, check_grounding, key_content
from crag_dspy.judges.scoring import UnusableLogprobs, yes_probability


def _sentences(n: int) -> str:
    """The probe's reply: ``n`` sentences, each with new numbers, dates, times and names."""
    return " ".join(
        f"Zorvex{i} costs {i} krona on 2026-0{i % 9 + 1}-1{i % 9} at 0{i % 9}:30 by Marta Q{i}uell."
        for i in range(n)
    )


def test_the_reply_limit_follows_max_tokens_with_a_floor_for_one_word_judges():
    assert reply_limit({"max_tokens": 512}) == 512 * 16
    assert reply_limit({"max_tokens": 1}) == LEAST_REPLY_LIMIT
    assert reply_limit({}, type("LM", (), {"kwargs": {"max_completion_tokens": 1000}})()) == 16_000


def test_an_answer_far_past_max_tokens_is_unusable_output_not_read_whole():
    # An LM (or gateway) that ignores max_tokens sent 1.4 MB; everything after the call read all of it.
    def rambling(system, user):
        return {"answer": _sentences(200)} if stage_of(system) == "answer" else script(system, user)

    with FakeOpenAI(rambling) as server, pytest.raises(LMUnavailableError) as info:
        ask(server)
    assert "did not stop at max_tokens" in str(info.value)
    assert by_stage(server)["answer"] == 3  # retried as new rollouts, like any unusable output
    assert all(len(e) < 1000 for e in info.value.trace.errors)


def test_a_judge_reply_far_past_max_tokens_is_an_unknown_grade():
    def rambling(system, user):
        return "yes " * 2000 if stage_of(system) == "grade" else script(system, user)

    with FakeOpenAI(rambling) as server:
        pred = ask(server)
    doc = pred.trace.documents[0]
    assert doc.score is None and "did not stop at max_tokens" in doc.error


def test_the_grounding_check_and_citations_of_a_long_answer_take_linear_time():
    # 2,000 sentences (140 KB) took about 30 s: each word was checked against every unit span before it,
    # and each number copied the rest of the answer.
    answer = _sentences(2000)
    texts = [SupportText("kb-1", GOOD, True), SupportText("kb-2", "Zorvex1 costs 1 krona.", True)]
    strip = SimpleNamespace(
        kept=True,
        text=texts[1].text,
        doc_id="kb-2",
        title="t",
        source="internal",
        page=None,
        section=None,
        url=None,
    )
    start = time.monotonic()
    assert len(key_content(answer)) > 6000
    grounding = check_grounding(answer, "How fast is the ZP-40?", texts)
    assert [c.doc_id for c in cite(answer, "How fast is the ZP-40?", [strip], texts[1].text)] == ["kb-2"]
    assert time.monotonic() - start < 5
    assert "Zorvex1" not in grounding.ungrounded and "Zorvex2" in grounding.ungrounded


@pytest.mark.parametrize("logprob", [1e308, 800.0, 0.5, float("nan"), float("inf"), "x", [1]])
def test_an_impossible_logprob_is_unusable_not_a_crash(logprob):
    position = {"token": "yes", "logprob": logprob, "top_logprobs": [{"token": "yes", "logprob": logprob}]}
    with pytest.raises(UnusableLogprobs, match="logprob"):
        yes_probability({"content": [position]})


def test_a_rounding_error_above_zero_reads_as_certainty():
    position = {"token": "yes", "logprob": 1e-9, "top_logprobs": [{"token": "yes", "logprob": 1e-9}]}
    assert yes_probability({"content": [position]}) == 1.0


class OverflowingLM(ScriptedLM):
    """Grades "yes" with a logprob of 1e308 (JSON allows it; exp() of it overflows)."""

    def forward(self, prompt=None, messages=None, **kwargs):
        response = super().forward(prompt, messages, **kwargs)
        choice = response.choices[0]
        if choice.logprobs is not None:
            top = [{"token": "yes", "logprob": 1e308}, {"token": "no", "logprob": -2.0}]
            choice.message.content = "yes"
            choice.logprobs = {"content": [{**top[0], "top_logprobs": top}]}
        return response


def test_a_grade_with_an_impossible_logprob_is_retried_then_unknown_not_a_traceback():
    # It was an OverflowError out of the grader: a traceback from ask, a 500 from serve. Now an unknown
    # grade; and as the one passage was its only knowledge, nothing the LM judged is left: the question
    # stops with the reason named (exit 1, 503), not an "I don't know" (probe 8).
    lm = OverflowingLM(lambda system, user: script(system, user) if stage_of(system) != "grade" else 0.9)
    crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([]), lm=lm)
    with pytest.raises(
        LMUnavailableError, match=r"no usable judgement of any of the 1 strips.*logprob 1e\+308"
    ) as info:
        crag(question=QUESTION)
    doc = info.value.trace.documents[0]
    assert doc.score is None and doc.attempts == 3 and "logprob 1e+308" in doc.error


def test_the_fallback_quotes_a_bounded_prefix_of_an_ungrounded_reply():
    long_answer = "Zorvex " + "x" * 3000  # within the reply limit

    def ungrounded(system, user):
        return {"answer": long_answer} if stage_of(system) == "answer" else script(system, user)

    with FakeOpenAI(ungrounded) as server:
        pred = ask(server)
    (line,) = [f for f in pred.trace.fallbacks if "abstain_ungrounded" in f]
    assert len(line) < 400 and "…" in line
