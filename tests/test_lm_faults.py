"""LM faults at the HTTP boundary: a real dspy.LM against a loopback OpenAI-compatible server.

DSPy retries transient faults (429, 5xx, timeouts, connection errors) with exponential backoff,
honouring Retry-After; CRAG then takes each stage's fallback and records it, and stops with
LMUnavailableError when the LM is down. The fault-handling rules are in docs/reliability.md.
"""

import asyncio
import time
import tracemalloc
from types import SimpleNamespace

import dspy
import pytest
from dspy.clients import execution
from fake_servers import GZIP_BOMB_MB, FakeOpenAI, gzip_bomb
from fakes import ListRetriever, ListWebSearch

from crag_dspy import CRAG, lm_transport
from crag_dspy.adapters import finish_reason
from crag_dspy.faults import CONSECUTIVE_LM_FAILURES, LMUnavailableError, classify_lm_error
from crag_dspy.protocols import WebResult

GOOD = "The AquaProbe 220 measures dissolved oxygen from 0 to 25 mg/L."
LONG = (
    "The AquaProbe 220 measures dissolved oxygen from 0 to 25 mg/L. It ships with a 5 m cable. "
    "The housing is titanium. The canteen serves soup on Fridays. Parking is free. Taxis need approval."
)
WEB = WebResult("WQ-17", "https://ihsc.example/wq17", "IHSC WQ-17 requires recalibration every 90 days.")
QUESTION = "What is the range of the AquaProbe 220?"


def stage_of(system: str) -> str:
    if "You judge search results" in system:
        return "grade"
    if "You judge short knowledge strips" in system:
        return "strip"
    if "web search query" in system:
        return "rewrite"
    return "answer"


def script(system, user):
    stage = stage_of(system)
    if stage == "grade":
        return 0.9 if "0 to 25" in user else 0.5
    if stage == "strip":
        return 0.9 if "0 to 25" in user or "90 days" in user else 0.1
    if stage == "rewrite":
        return {"query": "AquaProbe 220; range"}
    return {"answer": "0 to 25 mg/L"}


def body_stage(body: dict) -> str:
    return stage_of(next((m["content"] for m in body["messages"] if m["role"] == "system"), ""))


def fault_on(stage: str, kind: str, times: int | None = None):
    """Inject ``kind`` into the first ``times`` requests of ``stage`` (every one when None)."""
    seen = []

    def fault(n, body):
        if body_stage(body) != stage:
            return None
        seen.append(n)
        return kind if times is None or len(seen) <= times else None

    return fault


def make_lm(
    server: FakeOpenAI, *, timeout: float = 5.0, api_key: str = "sk-test-not-a-real-key-000"
) -> dspy.LM:
    return dspy.LM(
        "openai/fake-model",
        api_base=server.api_base,
        api_key=api_key,
        num_retries=2,
        timeout=timeout,
        cache=False,
        temperature=0.0,
        max_tokens=64,
    )


def ask(server, texts=(("kb-1", GOOD),), web=None, question=QUESTION, **lm_kwargs):
    crag = CRAG(ListRetriever(list(texts)), web or ListWebSearch([WEB]), lm=make_lm(server, **lm_kwargs))
    return crag(question=question)


def by_stage(server) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in server.requests:
        counts[body_stage(r["body"])] = counts.get(body_stage(r["body"]), 0) + 1
    return counts


@pytest.mark.parametrize("kind", ["429", "500", "503", "reset"])
def test_transient_faults_are_retried_by_the_client_and_leave_no_trace_of_failure(kind):
    with FakeOpenAI(script, fault_on("grade", kind, times=2)) as server:
        pred = ask(server)
    assert pred.answer == "0 to 25 mg/L" and pred.action == "CORRECT"
    assert by_stage(server)["grade"] == 3  # two faults, then the retry that worked
    assert pred.trace.errors == [] and pred.trace.documents[0].score == pytest.approx(0.9)


def test_retries_back_off_exponentially():
    with FakeOpenAI(script, fault_on("grade", "500-slow", times=2)) as server:
        ask(server)
    times = [r["time"] for r in server.requests if body_stage(r["body"]) == "grade"]
    # DSPy sleeps 2**attempt seconds between attempts when the server gives no Retry-After.
    assert times[1] - times[0] >= 0.9 and times[2] - times[1] >= 1.9


def test_a_persistently_failing_grade_is_unknown_and_the_question_goes_on():
    seen = []

    def fault(n, body):  # every attempt at grading the first document fails; the rest work
        if body_stage(body) == "grade" and "0 to 25" in body["messages"][-1]["content"]:
            seen.append(n)
            return "500"
        return None

    texts = [("kb-1", GOOD), ("kb-2", "The canteen opens at 08:00.")]
    with FakeOpenAI(script, fault) as server:
        pred = ask(server, texts)
    first, second = pred.trace.documents
    assert first.score is None and first.score_source == "error" and "LMServerError" in first.error
    assert first.attempts == 1  # the client already retried 3 times; CRAG does not multiply that
    assert len(seen) == 3 and second.score == pytest.approx(0.5)
    assert pred.action == "AMBIGUOUS"  # unknown is never CORRECT (and blocks INCORRECT)
    assert any("grader failed on kb-1 (treated as unknown)" in e for e in pred.trace.errors)
    assert pred.trace.lm_answer == "0 to 25 mg/L" and pred.answer == "I don't know"  # in no kept strip


@pytest.mark.parametrize("kind", ["garbage", "html"])
def test_one_reply_that_is_no_completion_is_a_failed_call_not_an_outage(kind):
    """An HTTP 200 that is no chat completion (a proxy's page) is a failed call, like a 400: no new
    rollout (it would get the same page); one alone is not an outage and the question goes on."""
    with FakeOpenAI(script, fault_on("grade", kind, times=1)) as server:
        pred = ask(server, [("kb-1", GOOD), ("kb-2", GOOD)])
    assert by_stage(server)["grade"] == 2  # one call per document: the failed one was not asked again
    assert pred.trace.documents[0].score is None and pred.trace.documents[1].score == pytest.approx(0.9)
    assert "is not JSON" in pred.trace.documents[0].error and pred.answer == "0 to 25 mg/L"


@pytest.mark.parametrize("kind", ["garbage", "html", "json-list"])
def test_an_lm_that_answers_every_call_with_a_proxy_page_is_down_not_a_model_that_knows_nothing(kind):
    with FakeOpenAI(script, lambda n, body: kind) as server, pytest.raises(LMUnavailableError) as info:
        ask(server, [("kb-1", GOOD), ("kb-2", GOOD), ("kb-3", GOOD)])
    assert "answered 2 calls in a row with a reply that is no chat completion" in str(info.value)
    assert info.value.stage == "grade" and len(server.requests) == CONSECUTIVE_LM_FAILURES


def test_a_watched_batch_stops_when_every_reply_is_a_proxy_page():
    """What ``optimize.evaluate`` exits 1 on: two questions' calls answered with a page in a row."""
    from crag_dspy.domain import QAPair
    from crag_dspy.faults import LMDownError, watch_lm
    from optimize.thresholds import precompute_routes

    questions = [
        QAPair(id=f"q{i}", question=f"What is the range of the AquaProbe 22{i}?", answers=["x"], split="val")
        for i in range(3)
    ]
    with FakeOpenAI(script, lambda n, body: "html") as server, watch_lm():
        crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
        with pytest.raises(LMDownError, match="no chat completion.*the run stopped"):
            precompute_routes(crag, questions, progress=False)
    assert len(server.requests) < 3 * 4  # stopped at the second question, not after every question


def test_unparseable_grades_become_unknown_after_new_rollouts():
    def babbling(system, user):
        return "perhaps" if stage_of(system) == "grade" else script(system, user)

    with FakeOpenAI(babbling) as server:
        pred = ask(server)
    doc = pred.trace.documents[0]
    assert doc.score is None and doc.attempts == 3 and "AdapterParseError" in doc.error
    assert by_stage(server)["grade"] == 3 and pred.action == "AMBIGUOUS"


def test_failed_strip_filter_drops_the_strip_and_says_so():
    seen = []

    def fault(n, body):  # the filter fails once on the first strip (after the client's own retries)
        if body_stage(body) == "strip" and "0 to 25" in body["messages"][-1]["content"] and len(seen) < 3:
            seen.append(n)
            return "500"
        return None

    with FakeOpenAI(script, fault) as server:
        pred = ask(server, [("kb-1", LONG)], web=ListWebSearch([WEB]))
    first = pred.trace.internal_strips[0]
    assert first.score is None and first.score_source == "error" and not first.kept
    assert any("strip filter failed" in e and "(dropped)" in e for e in pred.trace.errors)


def test_failed_rewrite_searches_with_the_question_itself():
    web = ListWebSearch([WEB])
    with FakeOpenAI(script, fault_on("rewrite", "503")) as server:
        pred = ask(server, [("kb-1", "The canteen opens at 08:00.")], web=web)
    assert web.queries == [QUESTION]
    assert any("query rewrite failed; searched with the question itself" in f for f in pred.trace.fallbacks)
    assert pred.action == "AMBIGUOUS" and (pred.answer, pred.trace.lm_answer) == (
        "I don't know",
        "0 to 25 mg/L",
    )


def test_failed_answer_is_a_typed_error_carrying_the_trace_not_a_made_up_answer():
    with FakeOpenAI(script, fault_on("answer", "500")) as server, pytest.raises(LMUnavailableError) as info:
        ask(server)
    error = info.value
    assert error.stage == "answer" and "gave no usable answer" in str(error)
    assert error.trace.action == "CORRECT" and error.trace.answer is None
    assert error.trace.documents[0].score == pytest.approx(0.9)  # the work before the failure is kept


def test_lm_down_stops_the_question_after_consecutive_failures_not_minutes_of_backoff():
    with FakeOpenAI(script, lambda n, body: "503") as server, pytest.raises(LMUnavailableError) as info:
        ask(server, [("kb-1", GOOD), ("kb-2", GOOD), ("kb-3", GOOD), ("kb-4", GOOD)])
    assert len(server.requests) == CONSECUTIVE_LM_FAILURES * 3  # 2 calls x (1 + num_retries)
    assert info.value.stage == "grade" and "failed 2 calls in a row" in str(info.value)
    assert len(info.value.trace.documents) == 2


def test_unreachable_lm_server_stops_the_question():
    with FakeOpenAI(script) as server:
        crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
    with pytest.raises(LMUnavailableError, match="LMTransportError"):  # the server is gone: nothing listens
        crag(question=QUESTION)


def test_timeouts_are_retried_then_count_as_failures():
    with FakeOpenAI(script, fault_on("grade", "hang", times=3), hang_s=2.0) as server:
        pred = ask(server, timeout=0.5)
    doc = pred.trace.documents[0]
    assert doc.score is None and "timed out" in doc.error
    assert pred.trace.lm_answer == "0 to 25 mg/L"  # one failed call is not an outage: the question went on


def test_a_retry_after_of_an_hour_is_not_waited_for_the_lm_is_unavailable_now():
    # DSPy sleeps for any Retry-After, uncapped: one 429 asking for an hour held the question an hour.
    start = time.monotonic()
    with FakeOpenAI(script, lambda n, body: "429-long") as server, pytest.raises(LMUnavailableError) as info:
        ask(server)
    assert time.monotonic() - start < 10
    assert len(server.requests) == CONSECUTIVE_LM_FAILURES  # not retried: each call failed at once
    assert "asked to retry after 3600 s, longer than the 60 s cap" in str(info.value)


def test_the_waits_of_one_call_add_up_to_at_most_the_60_s_cap(monkeypatch):
    # A Retry-After just under the cap was waited for on each retry of each call: 2 retries x 59 s, and two
    # failed calls stop a question, so ~4 minutes. DSPy's sleep is recorded here instead of slept.
    slept: list[float] = []
    monkeypatch.setattr(execution, "time", SimpleNamespace(sleep=slept.append))
    with (
        FakeOpenAI(script, lambda n, body: "429-minute") as server,
        pytest.raises(LMUnavailableError) as info,
    ):
        ask(server)
    assert slept == [59.0] * CONSECUTIVE_LM_FAILURES  # one wait per call: a second would pass 60 s
    assert len(server.requests) == 2 * CONSECUTIVE_LM_FAILURES
    assert "asked to retry after 59 s, past the 60 s cap on one call's waits (59 s waited already)" in str(
        info.value
    )


def test_a_timeout_names_the_setting_that_moves_it_not_an_internal_api():
    with FakeOpenAI(script, fault_on("grade", "hang", times=3), hang_s=2.0) as server:
        pred = ask(server, timeout=0.5)
    error = pred.trace.documents[0].error
    assert "CRAG_LM_TIMEOUT_S" in error and "lm15" not in error and "Timeouts(" not in error


def test_rejected_key_stops_at_once_and_never_shows_the_key():
    key = "sk-test-SECRET-0123456789abcdef"
    with FakeOpenAI(script, lambda n, body: "401-echo") as server, pytest.raises(LMUnavailableError) as info:
        ask(server, api_key=key)
    assert len(server.requests) == 1  # authentication failures are not retried
    assert "refuses the requests" in str(info.value)
    dumped = info.value.trace.model_dump_json()
    assert "LMAuthError" in dumped and key not in dumped and key not in str(info.value)
    assert "0123456789abcdef" not in dumped


def test_batch_evaluation_and_threshold_precompute_count_a_failed_question_as_wrong_and_go_on():
    from crag_dspy.domain import QAPair
    from optimize.measure import evaluate_program
    from optimize.thresholds import precompute_routes

    def fault(n, body):  # the LM fails only on answering the second question
        return "500" if body_stage(body) == "answer" and "speed" in body["messages"][-1]["content"] else None

    questions = [
        QAPair(id="ok", question=QUESTION, answers=["0 to 25 mg/L"], split="val"),
        QAPair(id="bad", question="What is the speed of the AquaProbe 220?", answers=["fast"], split="val"),
    ]
    with FakeOpenAI(script, fault) as server:
        crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
        evaluation = evaluate_program(
            "crag", crag, [dspy.Example(**q.model_dump()) for q in questions], progress=False
        )
        routes, _ = precompute_routes(crag, questions, progress=False)
    assert evaluation.n == 2 and evaluation.accuracy == 0.5
    assert "gave no usable answer" in evaluation.rows[1]["error"] and evaluation.rows[1]["correct"] is False
    assert routes[0].correct["CORRECT"] and not any(routes[1].correct.values())


def test_a_watched_batch_tells_one_bad_question_from_an_lm_outage():
    from crag_dspy.domain import QAPair
    from crag_dspy.faults import LMDownError, watch_lm
    from optimize.thresholds import precompute_routes

    speed = "What is the speed of the AquaProbe 220?"
    questions = [
        QAPair(id="ok", question=QUESTION, answers=["0 to 25 mg/L"], split="val"),
        QAPair(id="bad", question=speed, answers=["fast"], split="val"),
        QAPair(id="ok2", question="What does the AquaProbe 220 measure?", answers=["0 to 25"], split="val"),
    ]

    def one_bad_answer(n, body):  # one failed call (after retries), then the LM answers again
        return "500" if body_stage(body) == "answer" and "speed" in body["messages"][-1]["content"] else None

    with FakeOpenAI(script, one_bad_answer) as server, watch_lm():
        crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
        routes, _ = precompute_routes(crag, questions, progress=False)
    assert [r.error is None for r in routes] == [True, False, True]
    assert "gave no usable answer" in routes[1].error and not any(routes[1].correct.values())
    assert routes[2].correct["CORRECT"]  # the run went on

    def down_after_the_first(n, body):
        return "503" if QUESTION not in body["messages"][-1]["content"] else None

    with FakeOpenAI(script, down_after_the_first) as server, watch_lm():
        crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
        with pytest.raises(LMDownError, match="failed 2 calls of 2 questions in a row.*the run stopped"):
            precompute_routes(crag, questions, progress=False)
    failed = [r for r in server.requests if QUESTION not in r["body"]["messages"][-1]["content"]]
    # Two questions, each stopped after its one grade call x (1 + num_retries): with no passage graded and
    # no strip judged the question cannot go on; the second one's failure tells an outage from one bad
    # question, then the run stopped.
    assert len(failed) == CONSECUTIVE_LM_FAILURES * 3


@pytest.mark.parametrize("status", ["400", "404"])
def test_an_lm_that_refuses_every_call_is_down_not_a_model_that_knows_nothing(status):
    # A wrong path in --lm-api-base or a proxy refusing the model name: every request is refused.
    with FakeOpenAI(script, lambda n, body: status) as server, pytest.raises(LMUnavailableError) as info:
        ask(server, [("kb-1", GOOD), ("kb-2", GOOD), ("kb-3", GOOD)])
    assert "refused 2 calls in a row, each refused by the server" in str(info.value)
    assert info.value.stage == "grade" and len(server.requests) == CONSECUTIVE_LM_FAILURES  # no rollouts


def test_one_refused_call_is_not_an_outage():
    with FakeOpenAI(script, fault_on("grade", "400", times=1)) as server:
        pred = ask(server, [("kb-1", GOOD), ("kb-2", GOOD)])
    assert pred.trace.documents[0].score is None and pred.answer == "0 to 25 mg/L"


def test_a_watched_batch_goes_on_past_a_question_whose_every_call_fails():
    from crag_dspy.domain import QAPair
    from crag_dspy.faults import watch_lm
    from optimize.thresholds import precompute_routes

    speed = "What is the speed of the AquaProbe 220?"
    questions = [
        QAPair(id="ok", question=QUESTION, answers=["0 to 25 mg/L"], split="val"),
        QAPair(id="bad", question=speed, answers=["fast"], split="val"),
        QAPair(id="ok2", question="What does the AquaProbe 220 measure?", answers=["0 to 25"], split="val"),
    ]

    def poisoned(n, body):  # every call for one question fails with a 5xx, after retries
        return "500" if "speed" in body["messages"][-1]["content"] else None

    with FakeOpenAI(script, poisoned) as server, watch_lm():
        crag = CRAG(ListRetriever([("kb-1", GOOD), ("kb-2", GOOD)]), ListWebSearch([WEB]), lm=make_lm(server))
        routes, _ = precompute_routes(crag, questions, progress=False)
    assert [r.error is None for r in routes] == [True, False, True]
    assert "failed 2 calls in a row" in routes[1].error
    assert routes[2].correct["CORRECT"]  # the run went on


def test_a_reply_body_that_never_ends_fails_at_the_size_cap_not_when_memory_runs_out():
    # DSPy's transport read such a body forever: 13 GB of memory in 45 s.
    start = time.monotonic()
    with FakeOpenAI(script, lambda n, body: "endless") as server, pytest.raises(LMUnavailableError) as info:
        ask(server, timeout=30)
    assert time.monotonic() - start < 10  # the size cap fired, not the 30 s deadline
    assert len(server.requests) == CONSECUTIVE_LM_FAILURES * 3  # a transport fault: retried, then failed
    assert "the LM's reply exceeded 16 MB" in str(info.value)


def test_a_reply_dripped_byte_by_byte_fails_at_the_lm_timeout_counted_from_the_request():
    # Each byte reset DSPy's read timeout, so a server sending one every 0.2 s held the call forever.
    with FakeOpenAI(script, lambda n, body: "drip") as server:
        lm = dspy.LM(
            "openai/fake-model", api_base=server.api_base, api_key="sk-test", num_retries=0, timeout=1
        )
        start = time.monotonic()
        with pytest.raises(Exception, match=r"did not finish within 1 s \(CRAG_LM_TIMEOUT_S\)"):
            lm("hello", cache=False)
        assert time.monotonic() - start < 3
        start = time.monotonic()
        with pytest.raises(Exception, match=r"did not finish within 1 s \(CRAG_LM_TIMEOUT_S\)"):
            asyncio.run(lm.acall("hello", cache=False))  # the async transport (streamed answers) too
        assert time.monotonic() - start < 3


def test_a_dripped_reply_is_one_failed_call_and_the_question_goes_on():
    with FakeOpenAI(script, fault_on("grade", "drip", times=3)) as server:
        pred = ask(server, timeout=1)
    error = pred.trace.documents[0].error
    assert "did not finish within 1 s (CRAG_LM_TIMEOUT_S)" in error and "lm15" not in error
    assert pred.trace.lm_answer == "0 to 25 mg/L"


def quick_lm(server, timeout: float = 1) -> dspy.LM:
    """An LM that fails on the first failed attempt, so the test sees the transport's own error."""
    return dspy.LM(
        "openai/fake-model", api_base=server.api_base, api_key="sk-test", num_retries=0, timeout=timeout
    )


def both_transports(lm: dspy.LM):
    """The error of one call through the sync transport, then through the async one (streamed answers)."""
    for call in (lambda: lm("hello", cache=False), lambda: asyncio.run(lm.acall("hello", cache=False))):
        with pytest.raises(Exception) as info:
            call()
        yield info.value


@pytest.mark.parametrize("fault", ["drip-head", "trailers"])
def test_a_dripped_head_or_endless_trailers_fail_at_the_lm_timeout_counted_from_the_request(fault):
    # The deadline only checked decoded body bytes: a head dripped a byte at a time, or chunked trailers
    # that never end after a complete body, held the call (and a serve worker) for ever.
    with FakeOpenAI(script, lambda n, body: fault, hang_s=10) as server:
        start = time.monotonic()
        for error in both_transports(quick_lm(server)):
            assert "did not finish within 1 s (CRAG_LM_TIMEOUT_S)" in str(error)
        assert time.monotonic() - start < 5


def test_a_gzip_bomb_fails_at_the_size_cap_without_being_inflated(monkeypatch):
    # A reply of a few KB gzipped twice was inflated whole before the size check: 2.4 GB of memory.
    monkeypatch.setattr(lm_transport, "MAX_LM_REPLY_BYTES", 4 * 2**20)
    gzip_bomb()  # built before memory is traced
    with FakeOpenAI(script, lambda n, body: "gzip-bomb") as server:
        tracemalloc.start()
        try:
            errors = list(both_transports(quick_lm(server, timeout=30)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert all("the LM's reply exceeded 4 MB once decompressed" in str(error) for error in errors)
    assert peak < GZIP_BOMB_MB * 2**20 / 4  # the bomb inflates to 64 MB; the cap bounds each layer


@pytest.mark.parametrize("fault", ["301", "302-completion", "102"])
def test_a_redirect_or_an_informational_status_is_a_failed_call_not_an_answer(fault):
    # A 301 page, or a 1xx, gave "I don't know" with exit 0; a 302 carrying a completion was the answer.
    with FakeOpenAI(script, lambda n, body: fault, hang_s=0.5) as server:
        for error in both_transports(quick_lm(server)):
            assert classify_lm_error(error) == "unreadable" and f"HTTP {fault[:3]}" in str(error)
        assert len(server.requests) == 2  # not followed
        with pytest.raises(LMUnavailableError, match="no chat completion") as info:
            ask(server)
    assert len(server.requests) == 2 + CONSECUTIVE_LM_FAILURES  # a failed call, not retried
    if fault == "301":
        assert "not followed (to https://127.0.0.1/v1/chat/completions: set the LM's base URL" in str(
            info.value
        )


NO_TEXT = ["no-choices", "null-content", "blank-content", "number-content", "object-content", "image-content"]


@pytest.mark.parametrize("fault", NO_TEXT)
def test_an_lm_whose_every_reply_is_empty_is_down_not_a_model_that_knows_nothing(fault):
    # Probe 4: 200 {"choices": []} (or a null content) on every call gave "answered", "I don't know",
    # exit 0, three AdapterParseErrors in the trace; the same LM answering 500 gave exit 1.
    with FakeOpenAI(script, lambda n, body: fault) as server:
        for error in both_transports(quick_lm(server)):
            assert classify_lm_error(error) == "unreadable" and "chat completion" in str(error)
        with pytest.raises(LMUnavailableError, match="no chat completion or an empty one") as info:
            ask(server)
    assert len(server.requests) == 2 + CONSECUTIVE_LM_FAILURES  # a failed call, not asked again
    expected = {
        "no-choices": "without any choice",
        "null-content": "(null)",
        "blank-content": "(only whitespace)",
        # Probe 6: content of another type or non-text parts gave "I don't know", answered, exit 0.
        "number-content": "content is no text (a int)",
        "object-content": "content is no text (a dict)",
        "image-content": "holds parts that are not text",
    }
    assert expected[fault] in str(info.value)


@pytest.mark.parametrize("fault", NO_TEXT)
def test_one_empty_reply_is_a_failed_call_and_the_question_goes_on(fault):
    with FakeOpenAI(script, fault_on("grade", fault, times=1)) as server:
        pred = ask(server, [("kb-1", GOOD), ("kb-2", GOOD)])
    assert by_stage(server)["grade"] == 2 and pred.trace.documents[0].score is None
    assert "chat completion" in pred.trace.documents[0].error and pred.answer == "0 to 25 mg/L"


@pytest.mark.parametrize(
    "fault, why", [("cut", "cut at max_tokens (64)"), ("filtered", "the provider's content filter")]
)
def test_an_answer_cut_at_max_tokens_or_by_a_filter_is_not_shown_as_answered(fault, why):
    # Probe 6: a reply with finish_reason "length" ("The AquaProbe 220 measures") was the answer, status
    # answered, not degraded; DSPy only logged a warning. It is unusable output now: new rollouts, and
    # when none finishes, no answer, as for any unusable answer (no made-up "I don't know").
    refused = pytest.raises(LMUnavailableError, match="gave no usable answer after 3 attempts")
    with FakeOpenAI(script, fault_on("answer", fault)) as server, refused as info:
        ask(server)
    assert by_stage(server)["answer"] == 3  # a new rollout may finish; three did not
    assert why in str(info.value) and info.value.trace.answer != "The AquaProbe 220 measures"
    with FakeOpenAI(script, fault_on("answer", fault, times=1)) as server:
        assert ask(server).answer == "0 to 25 mg/L"  # the next rollout finished


def test_a_label_cut_at_its_one_token_is_read_as_usual():
    # A judge asks for one to three tokens, so its reply always stops at max_tokens: that is its answer.
    from crag_dspy.adapters import FINISH_REASON, LabelAdapter, UnfinishedText
    from signatures.grading import GradeDocument

    text = UnfinishedText("Yes")
    text.finish_reason = "length"
    outputs = [{"text": "Yes", FINISH_REASON: "length"}, text]
    parsed = LabelAdapter()._call_postprocess(GradeDocument, GradeDocument, outputs, None, {"max_tokens": 1})
    assert [p[next(iter(GradeDocument.output_fields))] for p in parsed] == [True, True]


def test_a_cut_reply_is_still_text_to_a_caller_of_the_lm():
    # Importing crag_dspy must not change what dspy.LM returns to a library user's own calls.
    with FakeOpenAI(script, lambda n, body: "cut") as server:
        (reply,) = make_lm(server)("hello")
    assert isinstance(reply, str) and reply == "The AquaProbe 220 measures"
    assert finish_reason(reply) == "length"


@pytest.mark.parametrize("fault", ["refusal", "refusal-part"])
def test_a_refusal_is_named_in_the_trace_and_the_lm_is_not_down(fault):
    # Probe 6: a refusal reached DSPy as an empty answer ("The LM returned an empty or null response"),
    # the refusal's words lost. The LM answered: that stage's output is unusable, and the run goes on.
    with FakeOpenAI(script, fault_on("grade", fault)) as server:
        pred = ask(server, [("kb-1", GOOD), ("kb-2", GOOD)])
    for doc in pred.trace.documents:  # every grade unknown, with why; the question still answered
        assert doc.score is None and "the LM refused: I can't help with that request." in doc.error
    assert pred.answer and pred.trace.lm_model
    refused = pytest.raises(LMUnavailableError, match="no usable answer.*the LM refused: I can't help")
    with FakeOpenAI(script, fault_on("answer", fault)) as server, refused:
        ask(server)


def test_a_reply_whose_token_counts_are_nonsense_is_still_an_answer():
    # Probe 6 L2: "prompt_tokens": -1e11 failed every call (lm15: input_tokens must be >= 0), blamed on
    # "a reply that is no chat completion"; the counts are bookkeeping, the answer is there.
    with FakeOpenAI(script, fault_on("answer", "bad-usage")) as server:
        pred = ask(server)
    assert pred.answer == "0 to 25 mg/L" and not pred.trace.errors


def test_an_lm_that_judges_no_strip_usably_stops_the_question_not_an_answered_i_dont_know():
    # Probe 8: a reasoning model's first tokens ("<think>\nOkay") for every judgement: every grade and strip
    # unusable, then "I don't know", exit 0 (HTTP 200 "answered"). The knowledge was there; the LM failed it.
    def thinking(system, user):
        return "<think>\nOkay" if stage_of(system) in ("grade", "strip") else script(system, user)

    refused = pytest.raises(LMUnavailableError, match=r"gave no usable judgement of any of the \d+ strips")
    with FakeOpenAI(thinking) as server, refused as info:
        ask(server)
    assert "AdapterParseError" in str(info.value) and "answer" not in by_stage(server)
