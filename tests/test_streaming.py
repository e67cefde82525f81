"""Stage events (crag_dspy.events): emitted once, by the run, as each stage's value is recorded; they
reach ``on_event`` and ``dspy.streamify``'s stream. Control flow only: DummyLM's scripted replies decide
every judgement."""

import itertools

import anyio
import dspy
import pytest
from dspy.streaming import StreamResponse
from dspy.utils.dummies import DummyLM
from fakes import ListRetriever, ListWebSearch
from litellm.types.utils import Delta, ModelResponseStream, StreamingChoices
from test_dummy_lm import BAKERY, FERRY, QUESTION, script

from crag_dspy import CRAG, WebResult
from crag_dspy.adapters import wrapped_value
from crag_dspy.events import (
    StageEvent,
    StageMessages,
    StageStatus,
    answer_listener,
    describe,
    make_event,
    run_with_tokens,
)
from crag_dspy.web import NoWebSearch


def crag_over_store(lm=None) -> CRAG:
    return CRAG(
        ListRetriever([("ferry", FERRY), ("bakery", BAKERY)]), NoWebSearch(), lm=lm or DummyLM(script())
    )


def test_a_run_emits_its_stages_in_order_with_what_the_trace_holds():
    events: list[StageEvent] = []
    prediction = crag_over_store()(question=QUESTION, on_event=events.append)
    assert [e.kind for e in events] == [
        "retrieved",
        "graded",
        "action",
        "strips_kept",
        "answer",
        "citations",
    ]
    by_kind = {e.kind: e.data for e in events}
    assert by_kind["retrieved"]["titles"] == ["ferry", "bakery"]
    assert by_kind["graded"]["scores"] == [1.0, 0.0]
    assert by_kind["action"]["action"] == "CORRECT" == prediction.action
    assert (by_kind["strips_kept"]["source"], by_kind["strips_kept"]["kept"]) == ("internal", 1)
    assert by_kind["answer"]["answer"] == prediction.answer == "23:40 from pier four"
    assert [c["label"] for c in by_kind["citations"]["citations"]] == [c.label for c in prediction.citations]
    assert all(a.seconds <= b.seconds for a, b in itertools.pairwise(events))  # time since the run began


def test_the_web_route_emits_its_query_and_the_web_strips_kept():
    web = ListWebSearch([WebResult("Timetable", "https://ferries.example/night", FERRY)])
    crag = CRAG(
        ListRetriever([("last-year", "The ferry company was founded in 1952.")]), web, lm=DummyLM(script())
    )
    events: list[StageEvent] = []
    crag(question=QUESTION, on_event=events.append)
    kinds = [e.kind for e in events]
    assert kinds == ["retrieved", "graded", "action", "web_query", "strips_kept", "answer", "citations"]
    query = next(e for e in events if e.kind == "web_query")
    assert query.data == {"query": "Velm Island night ferry", "results": 1, "failed": False}
    assert describe(query) == "searched the web for 'Velm Island night ferry': 1 results"
    assert next(e for e in events if e.kind == "strips_kept").data["source"] == "web"


def test_an_abstention_without_web_still_tells_the_answer():
    crag = CRAG(
        ListRetriever([("last-year", "The ferry company was founded in 1952.")]),
        NoWebSearch(),
        lm=DummyLM(script()),
    )
    events: list[StageEvent] = []
    crag(question=QUESTION, on_event=events.append)
    assert [e.kind for e in events] == ["retrieved", "graded", "action", "answer", "citations"]
    assert events[-2].data["answer"] == "I don't know" and events[-1].data["citations"] == []


def test_a_cached_stage_emits_its_event_again_for_the_run_that_reuses_it():
    from crag_dspy.run import RunMemo

    crag, cache = crag_over_store(), RunMemo()
    first: list[StageEvent] = []
    second: list[StageEvent] = []
    crag(question=QUESTION, cache=cache, on_event=first.append)
    crag(question=QUESTION, cache=cache, on_event=second.append)
    assert [e.data for e in first] == [e.data for e in second]


def test_events_never_carry_a_key():
    event = make_event("web_query", 0.1, query="ferry sk-abcdefghijklmnop1234", results=0, failed=False)
    assert "sk-abcdefghijklmnop1234" not in event.model_dump_json()
    assert "***" in event.data["query"]


def test_a_failing_callback_stops_the_run_instead_of_being_ignored():
    def broken(event: StageEvent) -> None:
        raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError, match="went away"):
        crag_over_store()(question=QUESTION, on_event=broken)


def _streamed(program, **kwargs) -> list:
    stream = dspy.streamify(program, async_streaming=False, **kwargs)
    return list(stream(question=QUESTION))


def test_streamify_yields_the_stages_as_status_messages_then_the_prediction():
    items = _streamed(crag_over_store(), status_message_provider=StageMessages())
    statuses = [i for i in items if isinstance(i, StageStatus)]
    assert [s.event.kind for s in statuses] == [
        "retrieved",
        "graded",
        "action",
        "strips_kept",
        "answer",
        "citations",
    ]
    assert statuses[2].message.startswith("action CORRECT")
    assert isinstance(items[-1], dspy.Prediction) and items[-1].answer == "23:40 from pier four"


def test_a_status_provider_words_or_drops_stage_messages():
    class OnlyTheAction(StageMessages):
        def stage_message(self, event: StageEvent) -> str | None:
            return f"-> {event.data['action']}" if event.kind == "action" else None

    items = _streamed(crag_over_store(), status_message_provider=OnlyTheAction())
    assert [i.message for i in items if isinstance(i, StageStatus)] == ["-> CORRECT"]


def _chunk(text: str | None, predict_id: int) -> ModelResponseStream:
    chunk = ModelResponseStream(choices=[StreamingChoices(delta=Delta(content=text))])
    chunk.predict_id = predict_id
    return chunk


class StreamingDummyLM(DummyLM):
    """DummyLM that, inside streamify, also sends the answerer's bare reply as chunks of two words, as
    LiteLLM does for a hosted LM that streams (a test double: the words are the scripted reply's)."""

    def forward(self, prompt=None, messages=None, **kwargs):
        response = super().forward(prompt=prompt, messages=messages, **kwargs)
        stream, caller = dspy.settings.send_stream, dspy.settings.caller_predict
        if stream is not None and caller is not None:
            self.streamed_for = getattr(self, "streamed_for", []) + [caller]
            content = response.choices[0].message.content
            words = (wrapped_value("answer", content) or content).split(" ")
            for i in range(0, len(words), 2):
                piece = " ".join(words[i : i + 2]) + (" " if i + 2 < len(words) else "")
                anyio.from_thread.run(stream.send, _chunk(piece, id(caller)))
        return response


def test_an_answer_listener_streams_the_answerers_tokens_and_no_judges():
    lm = StreamingDummyLM(script())
    crag = crag_over_store(lm)
    items = _streamed(crag, stream_listeners=[answer_listener(crag)], status_message_provider=StageMessages())
    tokens = [i for i in items if isinstance(i, StreamResponse)]
    assert lm.streamed_for == [crag.answerer]  # the judges' LM calls never stream
    assert all(t.predict_name == "answerer" and t.signature_field_name == "answer" for t in tokens)
    assert "".join(t.chunk for t in tokens) == "23:40 from pier four" and tokens[-1].is_last_chunk
    kinds = [
        i.event.kind
        if isinstance(i, StageStatus)
        else "token"
        if isinstance(i, StreamResponse) and i.chunk
        else ""
        for i in items
    ]
    # The words come while the answer is written: after the strips are kept, before the answer event
    # (DSPy sends the listener's empty last chunk as the prediction arrives).
    assert kinds.index("token") > kinds.index("strips_kept")
    assert max(i for i, k in enumerate(kinds) if k == "token") < kinds.index("answer")
    assert items[-1].answer == "23:40 from pier four"


def test_the_bare_answer_listener_passes_every_content_chunk_on():
    crag = crag_over_store()
    listener = answer_listener(crag)
    assert listener.receive(_chunk(None, 0)) is None  # a role-only chunk
    first = listener.receive(_chunk("23:40 ", 0))
    assert (first.chunk, first.is_last_chunk, first.predict_name) == ("23:40 ", False, "answerer")
    assert listener.receive(_chunk("from pier four", 0)).chunk == "from pier four"
    assert listener.finalize().is_last_chunk


def test_run_with_tokens_hands_the_answers_tokens_over_and_returns_the_prediction():
    lm = StreamingDummyLM(script())
    crag = crag_over_store(lm)
    tokens: list[str] = []
    events: list[StageEvent] = []
    prediction = run_with_tokens(crag, tokens.append, question=QUESTION, on_event=events.append)
    # Handed over as they come, but for the last word of what has come (a key-shaped word may still grow:
    # crag_dspy.redaction.StreamRedactor), which follows with the next piece or the end.
    assert tokens == ["23:40 from ", "pier ", "four"] and lm.streamed_for == [crag.answerer]
    assert prediction.answer == "23:40 from pier four" and prediction.action == "CORRECT"
    assert [e.kind for e in events][-2:] == ["answer", "citations"]  # on_event as without streaming


def test_run_with_tokens_raises_what_the_run_raises():
    from crag_dspy.faults import LMUnavailableError

    class Down(DummyLM):
        def forward(self, prompt=None, messages=None, **kwargs):
            raise ConnectionError("connection refused")

    crag = crag_over_store(Down([]))
    with pytest.raises(LMUnavailableError, match="connection refused"):
        run_with_tokens(crag, lambda text: None, question=QUESTION)
