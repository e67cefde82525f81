"""One question's LM calls in flight at once (``LMCalls(concurrency=...)``), ``aforward`` and ``batch``.

A scripted LM that sleeps a little per call, so that calls overlap when they may; no timed assertions:
the tests count calls in flight and compare traces with the sequential run.
"""

import asyncio
import threading
import time

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig, LMCalls
from crag_dspy.faults import LMUnavailableError
from crag_dspy.protocols import WebResult

QUESTION = "What is the range of the AquaProbe 220?"
DOCS = [
    ("kb-1", "The AquaProbe 220 has a range of 0 to 25 mg/L. It is calibrated yearly."),
    ("kb-2", "The canteen opens at 08:00."),
    ("kb-3", "AquaProbe sensors are sold in packs of two. Shipping takes a week."),
    ("kb-4", "The AquaProbe 110 has a range of 0 to 10 mg/L."),
]
WEB = [
    WebResult("WQ-17", "https://ihsc.example/wq17", "The AquaProbe 220 measures 0 to 25 mg/L. Rated IP68."),
    WebResult("Shop", "https://shop.example/ap220", "Buy the AquaProbe 220 today. Free shipping."),
]


class InFlight:
    """Counts the script's calls in flight; each call sleeps ``pause`` seconds."""

    def __init__(self, pause: float = 0.05):
        self.pause, self.now, self.most = pause, 0, 0
        self._lock = threading.Lock()

    def __call__(self, system: str, user: str):
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            time.sleep(self.pause)
            if "You judge search results" in system:  # AMBIGUOUS: refine both sources
                return 0.5 if "0 to 25" in field(user, "document") else 0.1
            if "You judge short knowledge strips" in system:
                return 0.9 if "0 to 25" in field(user, "strip") else 0.1
            if "web search query" in system:
                return {"query": "AquaProbe 220 range"}
            return {"answer": "0 to 25 mg/L"}
        finally:
            with self._lock:
                self.now -= 1


def ask(concurrency: int, script=None, docs=DOCS):
    script = script or InFlight()
    lm = ScriptedLM(script)
    config = CRAGConfig(k=len(docs), lm_calls=LMCalls(concurrency=concurrency))
    crag = CRAG(ListRetriever(docs), ListWebSearch(WEB), config, lm=lm)
    return crag(question=QUESTION), lm, script


def comparable(trace):
    """A trace without its timings and usage (they differ from run to run)."""
    return trace.model_dump(exclude={"timings", "lm_usage"})


def test_gradings_and_strip_judgements_overlap_and_the_trace_is_the_sequential_one():
    sequential, lm_1, one = ask(1)
    concurrent, lm_4, four = ask(4)
    assert one.most == 1
    assert four.most >= 2  # 4 passages graded, then strips judged, several calls at once
    assert sequential.action == concurrent.action == "AMBIGUOUS"
    assert comparable(concurrent.trace) == comparable(sequential.trace)
    assert sorted(lm_4.calls) == sorted(lm_1.calls)  # the same requests, in whatever order they ended
    assert concurrent.trace.total_usage.calls == sequential.trace.total_usage.calls == len(lm_1.calls)


def test_a_text_shown_twice_is_judged_once_even_when_both_are_graded_at_once():
    twice = [("kb-1", DOCS[0][1]), ("kb-1", DOCS[0][1]), *DOCS[1:]]
    pred, lm, _ = ask(4, docs=twice)
    graded = [user for system, user in lm.calls if "You judge search results" in system]
    assert len(graded) == len(set(graded)) == len(DOCS)
    first, second = pred.trace.documents[:2]
    assert first.score == second.score and first.attempts == second.attempts == 1


def test_an_lm_that_is_down_stops_a_concurrent_question_too():
    def down(system, user):
        return ConnectionError("nothing listens")

    with pytest.raises(LMUnavailableError) as info:
        ask(4, script=down)
    assert info.value.stage == "grade"
    assert [d.score for d in info.value.trace.documents] == [None, None]  # stopped at the second failure


def test_aforward_answers_questions_concurrently_on_one_event_loop():
    script = InFlight(pause=0.05)
    lm = ScriptedLM(script)
    crag = CRAG(ListRetriever(DOCS), ListWebSearch(WEB), CRAGConfig(k=4), lm=lm)

    async def both():
        return await asyncio.gather(crag.acall(question=QUESTION), crag.acall(question=QUESTION + " Now?"))

    first, second = asyncio.run(both())
    assert first.answer == second.answer == "0 to 25 mg/L"
    assert first.trace.question == QUESTION and second.trace.question == QUESTION + " Now?"
    assert script.most >= 2  # one call at a time per question, two questions at once


def test_aforward_keeps_the_callers_dspy_context():
    crag = CRAG(ListRetriever(DOCS), ListWebSearch(WEB), CRAGConfig(k=4))  # no LM of its own
    lm = ScriptedLM(InFlight(pause=0))

    async def run():
        with dspy.context(lm=lm):
            return await crag.acall(question=QUESTION)

    assert asyncio.run(run()).answer == "0 to 25 mg/L" and lm.calls


def test_batch_answers_every_example_with_its_own_trace():
    crag = CRAG(ListRetriever(DOCS), ListWebSearch(WEB), CRAGConfig(k=4), lm=ScriptedLM(InFlight()))
    questions = [QUESTION, "Which range does the AquaProbe 220 cover?", "AquaProbe 220 range?"]
    examples = [dspy.Example(question=q).with_inputs("question") for q in questions]
    results = crag.batch(examples, num_threads=3, disable_progress_bar=True)
    assert [r.trace.question for r in results] == questions
    assert all(r.answer == "0 to 25 mg/L" for r in results)


def test_concurrency_is_validated():
    with pytest.raises(ValueError, match="concurrency"):
        LMCalls(concurrency=0)


def test_cancelling_an_aforward_task_stops_the_run_at_its_next_stage():
    entered, release = threading.Event(), threading.Event()
    script = InFlight(pause=0)

    def blocking(system, user):
        if "You judge search results" in system:
            entered.set()
            release.wait(10)
        return script(system, user)

    lm = ScriptedLM(blocking)
    crag = CRAG(ListRetriever(DOCS[:1]), ListWebSearch(WEB), CRAGConfig(k=1), lm=lm)

    async def cancel_midway():
        task = asyncio.create_task(crag.acall(question=QUESTION))
        await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        release.set()  # the grading call under way ends; the run must stop before the next stage
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_midway())  # returns once the worker thread has ended
    assert len(lm.calls) == 1 and "You judge search results" in lm.calls[0][0]
