"""``POST /ask/stream``: the stages as server-sent events while the question runs, the answer's tokens as
the LM writes them, then the answer or the error ``POST /ask`` would give, with the same keys, limits,
queue and deadline. Scripted LM; the tokens come through a real ``dspy.LM`` and LiteLLM from the embedded
server over a scripted engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dspy
from fakes import ScriptedLM, ScriptEngine
from serving import local_client
from test_serve import make_service, script

from crag_dspy.lm.openai_server import OpenAIServer
from crag_dspy.serve import create_app
from crag_dspy.serve.policy import ServePolicy

QUESTION = "What is the range of the AquaProbe 220?"


def events_of(lines) -> list[tuple[str, dict]]:
    """(event, data) of each server-sent event in ``lines``."""
    found, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            found.append((name, json.loads(line.removeprefix("data: "))))
    return found


def test_the_stages_stream_then_the_answer_post_ask_gives():
    client = local_client(create_app(make_service()))
    response = client.post("/ask/stream", json={"question": QUESTION})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text.splitlines())
    assert [(name, data.get("kind")) for name, data in events] == [
        ("stage", "retrieved"),
        ("stage", "graded"),
        ("stage", "action"),
        ("stage", "strips_kept"),
        ("stage", "answer"),
        ("stage", "citations"),
        ("answer", None),
    ]
    answer = events[-1][1]
    plain = client.post("/ask", json={"question": QUESTION}).json()
    assert (answer["answer"], answer["action"], answer["citations"]) == (
        plain["answer"],
        plain["action"],
        plain["citations"],
    )
    assert "context" not in answer["trace"]  # trimmed for clients, as /ask
    assert events[0][1]["data"]["titles"] == ["kb-good", "kb-bad"]


def test_stages_are_sent_while_the_run_goes_on_not_at_its_end():
    read_action = threading.Event()

    def waits_for_the_client(system: str, user: str):
        # The answer is written only once the client has read the action.
        if "You judge" not in system and not read_action.wait(10):
            return ConnectionError("the action event never reached the client")
        return script(system, user)

    client = local_client(create_app(make_service(lm=ScriptedLM(waits_for_the_client), retries=0)))
    with client.stream("POST", "/ask/stream", json={"question": QUESTION}) as response:
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if '"kind":"action"' in line.replace(" ", ""):
                read_action.set()
    events = events_of(lines)
    assert read_action.is_set() and events[-1][0] == "answer" and events[-1][1]["answer"] == "0 to 25 mg/L"


def test_a_failed_lm_ends_the_stream_with_the_503_post_ask_gives():
    lm = ScriptedLM(lambda s, u: ConnectionError("connection refused"))
    client = local_client(create_app(make_service(lm=lm, retries=0)))
    events = events_of(client.post("/ask/stream", json={"question": QUESTION}).text.splitlines())
    name, error = events[-1]
    assert name == "error" and error["status"] == 503 and error["dependency"] == "lm"
    assert "connection refused" in error["detail"] and error["trace"]["errors"]


def test_past_the_deadline_the_stream_ends_with_a_504_and_the_run_stops():
    release = threading.Event()

    def slow(system: str, user: str):
        release.wait(10)
        return script(system, user)

    service = make_service(lm=ScriptedLM(slow))
    client = local_client(create_app(service, ServePolicy(request_timeout_s=0.3)))
    events = events_of(client.post("/ask/stream", json={"question": QUESTION}).text.splitlines())
    release.set()
    name, error = events[-1]
    assert name == "error" and error["status"] == 504 and "deadline" in error["detail"].lower()


def test_a_full_queue_is_a_503_before_any_stream_and_keys_are_required_as_for_ask():
    release = threading.Event()

    def blocked(system: str, user: str):
        release.wait(10)
        return script(system, user)

    app = create_app(make_service(lm=ScriptedLM(blocked)), ServePolicy(workers=1, queue=1))
    client = local_client(app)
    first = threading.Thread(target=client.post, args=("/ask",), kwargs={"json": {"question": QUESTION}})
    first.start()
    try:
        while app.state.queue.admitted == 0:
            first.join(0.01)
        response = client.post("/ask/stream", json={"question": QUESTION})
        assert response.status_code == 503 and "Retry-After" in response.headers
        assert response.headers["content-type"].startswith("application/json")
    finally:
        release.set()
        first.join()

    keyed = local_client(create_app(make_service(), ServePolicy(api_keys=("k" * 32,), open_debug=False)))
    assert keyed.post("/ask/stream", json={"question": QUESTION}).status_code == 401
    assert (
        keyed.post("/ask/stream", json={"question": " "}, headers={"X-API-Key": "k" * 32}).status_code == 422
    )


@contextmanager
def streaming_lm(
    gate: threading.Event | None = None, answers=script, piece: int | None = None
) -> Iterator[tuple[dspy.LM, ScriptEngine]]:
    """A real ``dspy.LM`` (LiteLLM) on the embedded model's OpenAI-compatible server, over an engine
    answering with ``answers`` (test_serve's script) and streaming its text a word (or ``piece``
    characters) at a time."""
    engine = ScriptEngine(answers, gate, piece)
    server = OpenAIServer(engine, "scripted", api_key=None)
    lm = dspy.LM(
        "openai/scripted",
        api_base=f"http://127.0.0.1:{server.port}/v1",
        api_key="unused",
        temperature=0.0,
        max_tokens=256,
        num_retries=0,
        cache=False,
    )
    try:
        yield lm, engine
    finally:
        server.close()


def test_the_answers_tokens_stream_as_the_lm_writes_them():
    gate = threading.Event()
    with streaming_lm(gate) as (lm, engine):
        client = local_client(create_app(make_service(lm=lm)))
        lines, tokens = [], ""
        with client.stream("POST", "/ask/stream", json={"question": QUESTION}) as response:
            for line in response.iter_lines():
                lines.append(line)
                if line.startswith("data: ") and lines[-2:-1] == ["event: token"]:
                    tokens += json.loads(line.removeprefix("data: "))["text"]
                    if tokens == "0 to 25 ":
                        gate.set()  # the last word is written only once the client has the first ones
    events = events_of(lines)
    names = [name if name != "stage" else data["kind"] for name, data in events]
    assert names == [
        "retrieved",
        "graded",
        "action",
        "strips_kept",
        "token",
        "token",
        "token",
        "token",
        "answer",  # the stage event: the final answer, once the answer stage is done
        "citations",
        "answer",
    ]
    assert [data["text"] for name, data in events if name == "token"] == ["0 ", "to ", "25 ", "mg/L"]
    assert gate.is_set() and events[-1][1]["answer"] == "0 to 25 mg/L"
    assert len(engine.streamed) == 1 and "You judge" not in engine.streamed[0]  # the answer only


def test_a_key_the_lm_echoes_is_redacted_in_the_streamed_tokens_too(monkeypatch):
    # Probe 3: the final answer was redacted, the tokens sent to every client were not (sk-p, robe3, ...).
    key = "sk-probe3-SECRET-abcdef0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)

    def echoes(system: str, user: str):
        if "You judge" in system or "web search query" in system:
            return script(system, user)
        return {"answer": f"The key is {key} ok"}

    with streaming_lm(answers=echoes, piece=4) as (lm, _engine):
        client = local_client(create_app(make_service(lm=lm)))
        text = client.post("/ask/stream", json={"question": QUESTION}).text
    tokens = [data["text"] for name, data in events_of(text.splitlines()) if name == "token"]
    assert len(tokens) > 2 and "".join(tokens) == "The key is *** ok"
    assert not [part for part in ("sk-p", "SECR", "abcdef", "6789") if part in text]


def test_a_withheld_answer_never_streams_its_tokens():
    with streaming_lm() as (lm, engine):
        client = local_client(create_app(make_service(lm=lm), ServePolicy(on_flag="withhold")))
        events = events_of(client.post("/ask/stream", json={"question": QUESTION}).text.splitlines())
    assert [name for name, _ in events].count("token") == 0 and engine.streamed == []
    assert events[-1][0] == "answer"


def test_an_lm_that_cannot_stream_gives_the_stages_and_the_answer_without_tokens():
    client = local_client(create_app(make_service()))  # ScriptedLM answers whole
    events = events_of(client.post("/ask/stream", json={"question": QUESTION}).text.splitlines())
    assert "token" not in [name for name, _ in events] and events[-1][1]["answer"] == "0 to 25 mg/L"


def test_a_bug_inside_the_run_ends_the_stream_with_an_error_event_not_a_broken_response():
    # Past the 200 the app's exception handler cannot answer: the stream ended with no answer or error.
    service = make_service()

    def broken(*args, **kwargs):
        raise AttributeError("'str' object has no attribute 'copy'")

    service.ask = broken
    response = local_client(create_app(service), raise_server_exceptions=False).post(
        "/ask/stream", json={"question": QUESTION}
    )
    name, error = events_of(response.text.splitlines())[-1]
    assert response.status_code == 200 and name == "error" and error["status"] == 500
    assert error["detail"] == "internal error: AttributeError: 'str' object has no attribute 'copy'"


def test_a_lone_surrogate_the_lm_sends_is_u_fffd_in_the_answer_the_tokens_and_post_ask():
    # Probe 6: an LM may escape a lone surrogate ("\ud800") in its JSON; decoded, it cannot be encoded as
    # UTF-8: /ask answered 500 and /ask/stream broke off without an error event.
    from fake_servers import FakeOpenAI

    def odd(system: str, user: str):
        return script(system, user) if "You judge" in system else {"answer": "0 to 25 mg/L \ud800 at most"}

    with FakeOpenAI(odd) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="k", cache=False, num_retries=0)
        client = local_client(create_app(make_service(lm=lm, retries=0)))
        plain = client.post("/ask", json={"question": QUESTION})
        events = events_of(client.post("/ask/stream", json={"question": QUESTION}).text.splitlines())
    assert plain.status_code == 200 and plain.json()["answer"] == "0 to 25 mg/L \ufffd at most"
    assert events[-1][0] == "answer" and events[-1][1]["answer"] == "0 to 25 mg/L \ufffd at most"
    assert "\ufffd" in "".join(data["text"] for name, data in events if name == "token")
    assert server.requests[-1]["body"].get("stream")  # the streamed deltas' path


def test_a_lone_surrogate_in_an_event_or_a_json_response_never_fails_to_encode():
    # The second line of defence, for text that enters some other way.
    from crag_dspy.serve.api import JSONResponse, _sse

    assert "\ufffd" in _sse("token", {"text": "a\ud800"}).encode().decode()
    assert JSONResponse({"answer": "a\udc00"}).body == '{"answer":"a\ufffd"}'.encode()
