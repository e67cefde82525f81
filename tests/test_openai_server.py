"""The loopback OpenAI-compatible endpoint of the ik_llama engine, over a scripted engine."""

import json
import math
import threading
import urllib.error
import urllib.request

import dspy
import pytest

from crag_dspy.lm.ik_engine import Completion, ContextOverflow, TokenLogprob
from crag_dspy.lm.openai_server import BadRequest, OpenAIServer, completion_response, parse_request
from crag_dspy.trace import usage_from_tracker


class ScriptedEngine:
    """Answers "yes" with P(yes)=0.8 (or raises what it is told to) and records its calls."""

    def __init__(self):
        self.calls: list[dict] = []
        self.raise_next: Exception | None = None
        self.lock = threading.Lock()

    def chat(self, messages, *, max_tokens, temperature=0.0, top_logprobs=None, stop=(), seed=None):
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


@pytest.fixture
def served():
    engine = ScriptedEngine()
    server = OpenAIServer(engine, "test-model")
    yield engine, f"http://127.0.0.1:{server.port}"
    server.close()


def post(base: str, path: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, data=body, headers={"Content-Type": "application/json"})
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
        ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "streaming is not supported"),
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
        api_key="x",
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
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as response:
        assert json.loads(response.read())["data"][0]["id"] == "test-model"
