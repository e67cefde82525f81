"""OpenTelemetry spans through DSPy's callbacks: one span tree per question, stages and LM calls nested."""

import dspy
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.protocols import WebResult
from crag_dspy.tracing import OpenTelemetryCallback

GOOD = "The AquaProbe 220 has a range of 0 to 25 mg/L."
BAD = "The canteen opens at 08:00."
WEB = WebResult("WQ-17", "https://ihsc.example/wq17", "The AquaProbe 220 measures 0 to 25 mg/L.")
QUESTION = "What is the range of the AquaProbe 220?"


def script(system, user):
    if "You judge search results" in system:
        return 0.5 if "0 to 25" in field(user, "document") else 0.05  # AMBIGUOUS: both knowledge sources
    if "You judge short knowledge strips" in system:
        return 0.9 if "0 to 25" in field(user, "strip") else 0.05
    if "web search query" in system:
        return {"query": "AquaProbe 220 range"}
    return {"answer": "0 to 25 mg/L"}


def spans_of_one_question():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    crag = CRAG(ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2))
    with dspy.context(lm=ScriptedLM(script), callbacks=[OpenTelemetryCallback(provider, record_text=True)]):
        pred = crag(question=QUESTION)
    return pred, exporter.get_finished_spans()


def test_one_span_tree_per_question_with_every_stage_under_the_crag_span():
    pred, spans = spans_of_one_question()
    by_id = {s.context.span_id: s for s in spans}
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "CRAG" and root.attributes["crag.question"] == QUESTION
    assert root.attributes["crag.action"] == pred.action == "AMBIGUOUS"
    assert root.attributes["crag.answer"] == "0 to 25 mg/L"
    assert root.attributes["crag.lm_calls"] == pred.trace.total_usage.calls
    assert all(s.context.trace_id == root.context.trace_id for s in spans)
    stages = [s.name for s in sorted(spans, key=lambda s: s.start_time) if s.parent == root.context]
    assert stages == [
        "retrieve",
        "grade",
        "rewrite",
        "search_web",
        "refine_external",
        "refine_internal",
        "answer",
        "search_witnesses",
    ]
    assert next(s for s in spans if s.name == "retrieve").attributes["crag.passage_ids"] == ("c0", "c1")
    # One span per graded passage, under the grade stage, with its score; LM calls under the judge.
    (grade,) = [s for s in spans if s.name == "grade"]
    passages = [s for s in spans if s.name == "grade_passage"]
    assert {s.parent.span_id for s in passages} == {grade.context.span_id}
    assert (
        sorted(s.attributes["crag.score"] for s in passages) == [d.score for d in pred.trace.documents][::-1]
    )
    lm_spans = [s for s in spans if s.name == "lm"]
    assert len(lm_spans) == pred.trace.total_usage.calls
    for lm in lm_spans:  # every LM call sits inside a stage, below the question's span
        ancestor = by_id[lm.parent.span_id]
        while ancestor.parent is not None and ancestor.parent != root.context:
            ancestor = by_id[ancestor.parent.span_id]
        assert ancestor.name in {"grade", "rewrite", "refine_external", "refine_internal", "answer"}
    (web,) = [s for s in spans if s.name == "search_web"]
    assert web.attributes["crag.query"] == "AquaProbe 220 range" and web.attributes["crag.results"] == 1


def test_a_failing_stage_ends_its_span_with_the_error():
    class BrokenStore:
        name = "broken"

        def retrieve(self, query, k):
            raise ConnectionError("store down")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    crag = CRAG(BrokenStore(), ListWebSearch([WEB]))
    with dspy.context(lm=ScriptedLM(script), callbacks=[OpenTelemetryCallback(provider)]):
        try:
            crag(question=QUESTION)
        except Exception as exc:  # noqa: BLE001 - the RetrievalError is expected; the spans are the test
            assert type(exc).__name__ == "RetrievalError"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"CRAG", "retrieve"}
    assert (
        spans["retrieve"].status.status_code.name == "ERROR"
        and "store down" in spans["retrieve"].status.description
    )
    assert spans["CRAG"].status.status_code.name == "ERROR"


def spans_of(crag, callback):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with dspy.context(lm=ScriptedLM(script), callbacks=[callback(provider)]):
        try:
            pred = crag(question=QUESTION)
        except Exception:  # noqa: BLE001 - the failing runs' spans are what is tested
            pred = None
    return pred, exporter.get_finished_spans()


def test_a_failed_call_s_error_reaches_spans_redacted():
    # A provider 401 that echoes the key: the span's status and exception event must not hold it.
    class LeakyStore:
        name = "leaky"

        def retrieve(self, query, k):
            raise ConnectionError("401 Incorrect API key provided: Bearer sk-proj-abcdefghijklmnop1234")

    _, spans = spans_of(CRAG(LeakyStore(), ListWebSearch([WEB])), OpenTelemetryCallback)
    retrieve = next(s for s in spans if s.name == "retrieve")
    assert (
        retrieve.status.status_code.name == "ERROR" and "401 Incorrect API key" in retrieve.status.description
    )
    (event,) = [e for e in retrieve.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "crag_dspy.faults.RetrievalError"
    assert "401 Incorrect API key" in event.attributes["exception.message"]
    for span in spans:
        exported = repr(span.to_json())
        assert "sk-proj-abcdefghijklmnop1234" not in exported and "***" in exported


def test_question_and_answer_stay_out_of_spans_unless_asked_for():
    crag = CRAG(ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2))
    pred, spans = spans_of(crag, OpenTelemetryCallback)
    (root,) = [s for s in spans if s.parent is None]
    # The access log's hash of the question, so that a span and an access line can be matched.
    from crag_dspy.serve.access_log import question_hash

    assert root.attributes["crag.question_hash"] == question_hash(QUESTION)
    exported = " ".join(span.to_json() for span in spans)
    assert (
        QUESTION not in exported and "0 to 25 mg/L" not in exported and "AquaProbe 220 range" not in exported
    )
    assert root.attributes["crag.action"] == pred.action  # what the run did is still there

    def with_text(provider):
        return OpenTelemetryCallback(provider, record_text=True)

    _, spans = spans_of(crag, with_text)
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes["crag.question"] == QUESTION and root.attributes["crag.answer"] == "0 to 25 mg/L"
