"""The loopback OpenAI-compatible endpoint of the ik_llama engine, over a scripted engine."""

import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request

import dspy
import pytest

from crag_dspy.lm.ik_engine import Cancelled, Completion, ContextOverflow, TokenLogprob
from crag_dspy.lm.openai_server import BadRequest, OpenAIServer, completion_response, parse_request

KEY = "test-key-0123456789"
from crag_dspy.trace import usage_from_tracker


class ScriptedEngine:
    """Answers "yes" with P(yes)=0.8 (or raises what it is told to) and records its calls."""

    def __init__(self):
        self.calls: list[dict] = []
        self.raise_next: Exception | None = None
        self.lock = threading.Lock()

    def chat(
        self,
        messages,
        *,
        max_tokens,
        temperature=0.0,
        top_logprobs=None,
        stop=(),
        seed=None,
        cancelled=None,
        on_text=None,  # ignored: the server then streams the whole text as one piece
    ):
        with self.lock:
            self.calls.append(
                {
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    "top_logprobs": top_logprobs,
                    "stop": stop,
                    "seed": seed,
                }
            )
            if self.raise_next is not None:
                exc, self.raise_next = self.raise_next, None
                raise exc
        entry = TokenLogprob("yes", math.log(0.8), (("yes", math.log(0.8)), ("no", math.log(0.2))))
        return Completion("yes", "length", 120, 100, 1, (entry,) if top_logprobs else None)

    def close(self):
        pass


@pytest.fixture
def served():
    engine = ScriptedEngine()
    server = OpenAIServer(engine, "test-model", api_key=KEY)
    yield engine, f"http://127.0.0.1:{server.port}"
    server.close()


def post(base: str, path: str, body: bytes, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(base + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_request_parameters():
    messages = [{"role": "user", "content": "hi"}]
    assert parse_request({"messages": messages}) == {
        "messages": messages,
        "max_tokens": 512,
        "temperature": 0.8,
        "top_logprobs": None,
        "stop": [],
        "seed": None,
    }
    parsed = parse_request(
        {
            "messages": messages,
            "max_completion_tokens": 3,
            "max_tokens": 9,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 10,
            "stop": "\n",
            "seed": 7,
        }
    )
    assert parsed == {
        "messages": messages,
        "max_tokens": 3,
        "temperature": 0.0,
        "top_logprobs": 10,
        "stop": ["\n"],
        "seed": 7,
    }
    assert parse_request({"messages": messages, "logprobs": True})["top_logprobs"] == 1


@pytest.mark.parametrize(
    "body, message",
    [
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "only n=1"),
        ({}, "'messages' must be a non-empty list"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "bad request parameter"),
    ],
)
def test_requests_the_engine_cannot_serve_are_refused_by_name(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_request(body)


def test_response_is_an_openai_chat_completion():
    entry = TokenLogprob("yes", -0.1, (("yes", -0.1), ("no", -2.4)))
    response = completion_response(Completion("yes", "stop", 50, 40, 1, (entry,)), "m")
    assert response["object"] == "chat.completion" and response["model"] == "m"
    choice = response["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "yes"} and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["content"][0]["top_logprobs"][1] == {
        "token": "no",
        "logprob": -2.4,
        "bytes": [110, 111],
    }
    assert response["usage"] == {
        "prompt_tokens": 50,
        "completion_tokens": 1,
        "total_tokens": 51,
        "prompt_tokens_details": {"cached_tokens": 40},
    }
    assert completion_response(Completion("x", "stop", 5, 0, 1, None), "m")["choices"][0]["logprobs"] is None


def test_a_judge_reads_p_yes_and_cached_tokens_through_litellm(served):
    from crag_dspy.judges.llm import BinaryJudge
    from signatures import GradeDocument

    engine, base = served
    lm = dspy.LM(
        "openai/test-model",
        api_base=base + "/v1",
        api_key=KEY,
        temperature=0.0,
        max_tokens=512,
        num_retries=0,
        cache=False,
    )
    with dspy.context(lm=lm), dspy.track_usage() as tracker:
        judgement = BinaryJudge(GradeDocument)(question="Q?", document="D.").judgement
    assert (judgement.label, judgement.score_source) == (True, "logprobs")
    assert judgement.raw_score == pytest.approx(0.8)
    usage = usage_from_tracker(tracker)
    assert (usage.calls, usage.prompt_tokens, usage.cached_prompt_tokens) == (1, 120, 100)
    (call,) = engine.calls
    assert call["messages"][0]["role"] == "system" and "question: Q?" in call["messages"][-1]["content"]
    assert (call["max_tokens"], call["temperature"], call["top_logprobs"]) == (1, 0.0, 10)


def test_errors_are_reported_and_the_server_keeps_serving(served):
    engine, base = served
    ok = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
    status, body = post(base, "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    engine.raise_next = ContextOverflow("prompt of 9000 tokens exceeds the context of 8192 tokens")
    status, body = post(base, "/v1/chat/completions", ok)
    assert status == 400 and "exceeds the context" in body["error"]["message"]
    engine.raise_next = RuntimeError("llama_decode failed (-3)")
    status, body = post(base, "/v1/chat/completions", ok)
    assert status == 500 and body["error"]["message"] == "RuntimeError: llama_decode failed (-3)"
    status, body = post(base, "/v1/embeddings", ok)
    assert status == 404
    status, body = post(base, "/v1/chat/completions", ok)
    assert status == 200 and body["choices"][0]["message"]["content"] == "yes"


def test_health_and_models(served):
    _, base = served
    with urllib.request.urlopen(base + "/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok"}
    models = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(models, timeout=10) as response:
        assert json.loads(response.read())["data"][0]["id"] == "test-model"


def test_answers_go_out_without_waiting_for_the_clients_ack(served, monkeypatch):
    # Headers and body are two writes; with Nagle's algorithm on, the body waits for the client's
    # delayed ACK (~40 ms per call on loopback, measured: 47 ms of overhead per call against 4 ms).
    _, base = served
    options = []
    real = socket.socket.setsockopt

    def recording(sock, level, option, value, *rest):
        options.append((sock.getsockname()[1], level, option, bool(value)))
        return real(sock, level, option, value, *rest)

    monkeypatch.setattr(socket.socket, "setsockopt", recording)
    status, _ = post(
        base, "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()
    )
    assert status == 200
    port = int(base.rsplit(":", 1)[1])  # the server's side of the connection, not the client's
    assert (port, socket.IPPROTO_TCP, socket.TCP_NODELAY, True) in options


# --- the server's key ----------------------------------------------------------------------------------
OK_BODY = json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode()


@pytest.mark.parametrize("key", [None, "", "wrong-key-0123456789", KEY + "x"])
def test_requests_without_the_servers_key_are_refused(served, key):
    engine, base = served
    status, body = post(base, "/v1/chat/completions", OK_BODY, key=key)
    assert status == 401 and "needs its key" in body["error"]["message"]
    request = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert engine.calls == []  # the model never saw them
    with urllib.request.urlopen(base + "/health", timeout=10) as response:  # liveness needs no key
        assert response.status == 200


def test_the_embedded_server_makes_a_random_key_and_build_lm_hands_it_to_the_lm(monkeypatch, tmp_path):
    """The real start-up path of the ik_llama engine, with a scripted engine in place of the model."""
    from crag_dspy.lm import embedded, factory, ik_engine
    from crag_dspy.settings import Settings

    monkeypatch.setattr(ik_engine, "IkEngine", lambda *a, **k: ScriptedEngine())
    first = embedded._start_ik_llama("m", tmp_path / "m.gguf", n_threads=1, n_ctx=1024, n_parallel=1)
    second = embedded._start_ik_llama("m", tmp_path / "m.gguf", n_threads=1, n_ctx=1024, n_parallel=1)
    try:
        assert len(first.api_key) > 40 and first.api_key != second.api_key
        assert first.api_key not in repr(first)
        base = f"http://127.0.0.1:{first.port}"
        assert post(base, "/v1/chat/completions", OK_BODY, key=None)[0] == 401
        assert post(base, "/v1/chat/completions", OK_BODY, key=second.api_key)[0] == 401
        assert post(base, "/v1/chat/completions", OK_BODY, key=first.api_key)[0] == 200
        monkeypatch.setattr(factory, "start_embedded_server", lambda *a, **k: first)
        lm = factory.build_lm(Settings(lm="embedded"), cache=False, num_retries=0)
        assert lm.kwargs["api_key"] == first.api_key
        assert lm("x") == ["yes"]  # through LiteLLM, with the key
    finally:
        first.close()
        second.close()


# --- abandoned requests --------------------------------------------------------------------------------
class SlowEngine:
    """Generates one token every 20 ms up to ``max_tokens``, asking ``cancelled`` between tokens as the
    ik_llama engine does; one request at a time, as the one model is."""

    def __init__(self):
        self.lock = threading.Lock()
        self.generated: list[int] = []  # tokens generated per request, in order
        self.outcomes: list[str] = []

    def chat(self, messages, *, max_tokens, cancelled=None, **_):
        with self.lock:
            tokens = 0
            try:
                while tokens < max_tokens:
                    if cancelled is not None and cancelled():
                        raise Cancelled(f"request withdrawn by its client after {tokens} generated tokens")
                    time.sleep(0.02)
                    tokens += 1
            except Cancelled:
                self.outcomes.append("cancelled")
                raise
            finally:
                self.generated.append(tokens)
            self.outcomes.append("done")
        return Completion("y" * tokens, "length", 10, 0, tokens, None)


def raw_post(port: int, body: bytes, key: str = KEY) -> socket.socket:
    """Send a chat request on a fresh connection and return the socket without reading the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_request_whose_client_left_stops_generating_and_frees_the_model():
    """A client that times out (here: closes its socket) stops its generation at the next token, and a
    request queued behind it is not kept waiting for the rest of the abandoned one."""
    engine = SlowEngine()
    server = OpenAIServer(engine, "slow", api_key=KEY)
    long = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 500}).encode()  # ~10 s
    try:
        abandoned = raw_post(server.port, long)
        time.sleep(0.3)  # it is generating
        abandoned.close()
        started = time.monotonic()
        short = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}).encode()
        status, body = post(f"http://127.0.0.1:{server.port}", "/v1/chat/completions", short)
        waited = time.monotonic() - started
    finally:
        server.close()
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    assert engine.outcomes == ["cancelled", "done"]
    assert engine.generated[0] < 100, "the abandoned request went on generating"
    assert waited < 3, f"the retry waited {waited:.1f} s behind the abandoned generation"


def test_a_request_that_keeps_its_client_is_not_cancelled():
    engine = SlowEngine()
    server = OpenAIServer(engine, "slow", api_key=KEY)
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 25}).encode()
    try:
        status, answer = post(f"http://127.0.0.1:{server.port}", "/v1/chat/completions", body)
    finally:
        server.close()
    assert status == 200 and answer["usage"]["completion_tokens"] == 25 and engine.outcomes == ["done"]


# -- the engine loading in the background (crag_dspy.lm.background) -----------------------------------


def test_a_request_waits_for_the_engine_still_loading_and_is_answered():
    from crag_dspy.lm.background import BackgroundEngine

    release, engine = threading.Event(), ScriptedEngine()

    def load(stopping):
        release.wait(10)
        return engine

    loading = BackgroundEngine(load, name="test model")
    server = OpenAIServer(loading, "test-model", api_key=KEY)  # serves before the model is there
    try:
        assert not loading.loaded
        answered: list = []
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
        client = threading.Thread(
            target=lambda: answered.append(
                post(f"http://127.0.0.1:{server.port}", "/v1/chat/completions", body)
            )
        )
        client.start()
        time.sleep(0.3)
        assert not answered and not engine.calls  # waiting, not failing
        release.set()
        client.join(10)
        status, response = answered[0]
        assert status == 200 and response["choices"][0]["message"]["content"] == "yes"
        assert loading.loaded and len(engine.calls) == 1
    finally:
        release.set()
        server.close()
        loading.close()


def test_an_engine_that_failed_to_load_answers_503_with_the_reason_on_every_request(caplog):
    from crag_dspy.lm.background import BackgroundEngine
    from crag_dspy.lm.ik_engine import EngineError

    def load(stopping):
        raise MemoryError("cannot allocate 1.1 GB")

    loading = BackgroundEngine(load, name="embedded model m")
    server = OpenAIServer(loading, "test-model", api_key=KEY)
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
        for _ in range(2):  # not only the first: a retry gets the reason too
            status, response = post(f"http://127.0.0.1:{server.port}", "/v1/chat/completions", body)
            assert status == 503
            assert response["error"]["message"] == (
                "the embedded model m could not be loaded: cannot allocate 1.1 GB"
            )
        with pytest.raises(EngineError, match="could not be loaded") as raised:
            loading.chat([{"role": "user", "content": "hi"}], max_tokens=1)
        assert isinstance(raised.value.__cause__, MemoryError)
        assert not [r for r in caplog.records if r.exc_info]  # the reason, no traceback per request
    finally:
        server.close()
        loading.close()


def test_closing_stops_a_load_in_progress_and_closes_an_engine_already_made(caplog):
    from crag_dspy.lm.background import BackgroundEngine
    from crag_dspy.lm.ik_engine import Cancelled, EngineError

    def slow_load(stopping):
        for _ in range(500):  # 5 s unless told to stop, as IkEngine checks between tensors
            if stopping():
                raise Cancelled("loading m.gguf was stopped")
            time.sleep(0.01)
        return ScriptedEngine()

    loading = BackgroundEngine(slow_load)
    started = time.perf_counter()
    loading.close()  # e.g. at exit, every answer having come from DSPy's cache
    assert time.perf_counter() - started < 1 and loading.loaded
    assert not caplog.records  # stopping on purpose is not a failure to report
    with pytest.raises(EngineError, match="closed"):
        loading.chat([{"role": "user", "content": "hi"}], max_tokens=1)

    closed: list[bool] = []

    class Closing(ScriptedEngine):
        def close(self):
            closed.append(True)

    loaded = BackgroundEngine(lambda stopping: Closing())
    loaded.wait()
    loaded.close()
    assert closed == [True]


def test_what_other_threads_print_while_the_loader_holds_stderr_is_not_lost(capfd):
    import os

    from crag_dspy.lm.ik_engine import _captured_stderr

    with _captured_stderr() as printed:
        os.write(2, b"ingest 40/87 chunks\n")  # e.g. the main thread's progress bar
    assert printed == ["ingest 40/87 chunks\n"]
    assert capfd.readouterr().err == "ingest 40/87 chunks\n"


def test_a_model_that_failed_to_load_is_loaded_again_by_the_next_start(monkeypatch, tmp_path):
    """The failure is not cached for the life of the process (e.g. a service), as a raise at start
    never was."""
    from crag_dspy.lm import embedded, ik_engine

    attempts: list[int] = []

    def flaky(*args, **kwargs):
        attempts.append(1)
        if len(attempts) == 1:
            raise MemoryError("cannot allocate 1.1 GB")
        return ScriptedEngine()

    monkeypatch.setattr(ik_engine, "IkEngine", flaky)
    monkeypatch.setattr(embedded, "ensure_weights", lambda spec, cache_dir: tmp_path / "m.gguf")
    monkeypatch.setattr(embedded, "_servers", {})
    model = next(iter(embedded.EMBEDDED_MODELS))
    start = lambda: embedded.start_embedded_server(
        model, tmp_path, n_threads=1, n_ctx=1024, engine="ik_llama"
    )
    first = start()
    base = f"http://127.0.0.1:{first.port}"
    assert post(base, "/v1/chat/completions", OK_BODY, key=first.api_key)[0] == 503
    assert first.failed
    second = start()
    try:
        assert second is not first and not second.failed and len(attempts) == 2
        assert (
            post(f"http://127.0.0.1:{second.port}", "/v1/chat/completions", OK_BODY, key=second.api_key)[0]
            == 200
        )
        assert start() is second  # a working server is shared, as before
    finally:
        second.close()


# --- streamed completions ------------------------------------------------------------------------------
class WordEngine:
    """Writes ``text`` one word at a time through ``on_text`` (as the ik_llama engine hands its tokens
    on), waiting on ``gate`` (when set) before the last word; ``streams=False`` ignores ``on_text``, as an
    engine that cannot generate incrementally may."""

    def __init__(self, text="The range is 0 to 25 mg/L.", streams=True, gate=None, raise_after=None):
        self.text, self.streams, self.gate, self.raise_after = text, streams, gate, raise_after
        self.outcomes: list[str] = []

    def chat(self, messages, *, max_tokens, cancelled=None, on_text=None, top_logprobs=None, **_):
        words = self.text.split(" ")
        pieces = [w + " " for w in words[:-1]] + [words[-1]]
        try:
            for i, piece in enumerate(pieces):
                if i == len(pieces) - 1 and self.gate is not None and not self.gate.wait(10):
                    raise AssertionError("the client never read the first pieces")
                if self.raise_after is not None and i == self.raise_after:
                    raise RuntimeError("llama_decode failed (-3)")
                if cancelled is not None and cancelled():
                    raise Cancelled(f"request withdrawn by its client after {i} generated tokens")
                if on_text is not None and self.streams:
                    on_text(piece)
                time.sleep(0.01)
        except Cancelled:
            self.outcomes.append("cancelled")
            raise
        self.outcomes.append("done")
        entry = TokenLogprob("The", -0.1, (("The", -0.1),))
        return Completion(self.text, "stop", 42, 30, len(pieces), (entry,) if top_logprobs else None)


@pytest.fixture
def word_server():
    servers = []

    def start(engine):
        server = OpenAIServer(engine, "test-model", api_key=KEY)
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.close()


STREAM_BODY = {"messages": [{"role": "user", "content": "range?"}], "stream": True}


def sse_payloads(raw: str) -> list:
    """The ``data:`` payloads of a server-sent event stream, JSON-decoded except ``[DONE]``."""
    payloads = []
    for block in raw.split("\n\n"):
        if block.startswith("data: "):
            data = block.removeprefix("data: ")
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


def stream_post(base: str, body: dict) -> tuple[int, str, str]:
    request = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers["Content-Type"], response.read().decode()


def test_stream_options_are_read_and_checked():
    from crag_dspy.lm.openai_server import StreamRequest, parse_stream

    assert parse_stream({"messages": []}) is None and parse_stream({"stream": False}) is None
    assert parse_stream({"stream": True}) == StreamRequest(include_usage=False)
    assert parse_stream({"stream": True, "stream_options": {"include_usage": True}}).include_usage
    with pytest.raises(BadRequest, match="'stream_options' must be an object"):
        parse_stream({"stream": True, "stream_options": "usage"})


def test_a_streamed_completion_is_openai_chunks_then_done(word_server):
    base = word_server(WordEngine())
    body = {**STREAM_BODY, "stream_options": {"include_usage": True}, "logprobs": True}
    status, kind, raw = stream_post(base, body)
    assert status == 200 and kind == "text/event-stream"
    *chunks, done = sse_payloads(raw)
    assert done == "[DONE]"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-") and chunks[0]["model"] == "test-model"
    first, *content, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"]["content"] for c in content]
    assert pieces == ["The ", "range ", "is ", "0 ", "to ", "25 ", "mg/L."]  # one event per piece
    assert all(c["choices"][0]["finish_reason"] is None and c["choices"][0]["index"] == 0 for c in content)
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "stop",
        "logprobs": {
            "content": [
                {
                    "token": "The",
                    "logprob": -0.1,
                    "bytes": [84, 104, 101],
                    "top_logprobs": [{"token": "The", "logprob": -0.1, "bytes": [84, 104, 101]}],
                }
            ]
        },
    }
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 30}


def test_the_openai_client_and_litellm_read_the_stream(word_server):
    import litellm
    import openai

    base = word_server(WordEngine())
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="test-model",
            messages=STREAM_BODY["messages"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The range is 0 to 25 mg/L."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.total_tokens == 49

    streamed = litellm.completion(
        model="openai/test-model",
        api_base=base + "/v1",
        api_key=KEY,
        messages=STREAM_BODY["messages"],
        stream=True,
        num_retries=0,
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "The range is 0 to 25 mg/L."
    # The connection is reused for the next request (a chunked body ends where it says).
    status, _, raw = stream_post(base, STREAM_BODY)
    assert status == 200 and sse_payloads(raw)[-1] == "[DONE]"


def test_pieces_reach_the_client_while_the_engine_generates(word_server):
    import http.client

    gate = threading.Event()
    base = word_server(WordEngine(gate=gate))
    port = int(base.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(STREAM_BODY),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    response = connection.getresponse()
    seen = ""
    while "mg/L" not in seen:
        line = response.readline().decode()
        if not line or "[DONE]" in line:
            break  # the stream ended without the last word
        if line.startswith("data: {") and "content" in line:
            seen += json.loads(line.removeprefix("data: "))["choices"][0]["delta"].get("content") or ""
            if seen == "The range is 0 to 25 ":
                gate.set()  # the engine writes the last word only once these were read
    connection.close()
    assert gate.is_set() and seen == "The range is 0 to 25 mg/L."


def test_an_engine_that_cannot_stream_sends_its_text_as_one_piece(word_server):
    base = word_server(WordEngine(streams=False))
    status, _, raw = stream_post(base, STREAM_BODY)
    contents = [p["choices"][0]["delta"].get("content") for p in sse_payloads(raw)[:-1] if p["choices"]]
    assert status == 200 and contents == ["", "The range is 0 to 25 mg/L.", None]


def test_an_error_before_any_text_is_an_http_error_and_after_it_an_error_event(served, word_server):
    engine, base = served
    engine.raise_next = ContextOverflow("prompt of 9000 tokens exceeds the context of 8192 tokens")
    status, body = post(base, "/v1/chat/completions", json.dumps(STREAM_BODY).encode())
    assert status == 400 and "exceeds the context" in body["error"]["message"]

    failing = word_server(WordEngine(raise_after=2))
    status, kind, raw = stream_post(failing, STREAM_BODY)
    payloads = sse_payloads(raw)
    assert status == 200 and kind == "text/event-stream"
    assert payloads[-2] == {
        "error": {"message": "RuntimeError: llama_decode failed (-3)", "type": "server_error", "code": 500}
    }
    assert payloads[-1] == "[DONE]"


def test_a_streamed_request_whose_client_left_stops_generating():
    engine = WordEngine(" ".join(["word"] * 400))  # ~4 s
    server = OpenAIServer(engine, "slow", api_key=KEY)
    try:
        sock = raw_post(server.port, json.dumps(STREAM_BODY).encode())
        received = b""
        while b"data: " not in received:  # it is streaming (headers and events may come apart)
            more = sock.recv(4096)
            assert more, f"the server closed the connection after {received!r}"
            received += more
        sock.close()
        deadline = time.monotonic() + 3
        while not engine.outcomes and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        server.close()
    assert engine.outcomes == ["cancelled"]


def test_held_back_text_is_what_may_begin_a_stop_string():
    from crag_dspy.held_text import prefix_at_end

    assert prefix_at_end("The answer [[ ##", ["[[ ## completed ## ]]"]) == 5
    assert prefix_at_end("The answer\n", ["\n\n", "Q:"]) == 1
    assert prefix_at_end("The answer", ["\n\n"]) == 0
    assert prefix_at_end("ab", []) == 0
