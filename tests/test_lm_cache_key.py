"""DSPy's response cache and the LM server (issue 62, item 12): DSPy leaves ``api_base`` out of its cache
key, so a server the user names is added to it (crag_dspy/lm/server_key.py). Fake OpenAI servers on
loopback; no real model."""

import asyncio

import dspy
import pytest
from dspy.clients.cache import Cache
from dspy.clients.execution import IGNORED_CACHE_KEYS
from fake_servers import FakeOpenAI

from crag_dspy.lm import build_lm
from crag_dspy.lm.server_key import SERVER_KEY_FIELD, ServerKeyedLM, server_digest
from crag_dspy.settings import Settings

PROMPT = "What is the list price of one AquaProbe 220 sensor?"


class KeyRecorder(Cache):
    """DSPy's own cache (memory and disk under ``tmp_path``) that records each key it is asked for."""

    def __init__(self, folder):
        super().__init__(True, True, str(folder))
        self.keys: list[str] = []
        self.requests: list[dict] = []

    def get(self, request, ignored_args_for_cache_key=None):
        self.requests.append(request)
        self.keys.append(self.cache_key(request, ignored_args_for_cache_key))
        return super().get(request, ignored_args_for_cache_key)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    recorder = KeyRecorder(tmp_path / "dspy-cache")
    monkeypatch.setattr(dspy, "cache", recorder)
    return recorder


def served(api_base: str) -> dspy.LM:
    """The LM ``ask`` builds for ``--lm openai/shared-name --lm-api-base <api_base>``."""
    return build_lm(Settings(lm="openai/shared-name", lm_api_base=api_base), num_retries=0, max_tokens=32)


def test_a_wrong_base_url_is_not_answered_from_another_servers_cache(cache):
    """Two servers serving the same model name: the second is asked, not answered from the first's cache."""
    with FakeOpenAI(lambda s, u: "1,240 velds") as good, FakeOpenAI(lambda s, u: "another server") as other:
        assert served(good.api_base)(PROMPT) == ["1,240 velds"]
        assert served(other.api_base)(PROMPT) == ["another server"]
        assert len(other.requests) == 1
        # The same server again is a cache hit: the cache still works.
        assert served(good.api_base)(PROMPT) == ["1,240 velds"] and len(good.requests) == 1


def test_the_cache_key_names_the_server_for_a_base_url_the_user_sets(cache):
    with FakeOpenAI(lambda s, u: "a") as one, FakeOpenAI(lambda s, u: "b") as two:
        for api_base in (one.api_base, two.api_base, one.api_base + "/"):
            served(api_base)(PROMPT)
    first, second, first_again = cache.keys
    assert first != second and first == first_again  # a trailing slash is the same server
    # The key is DSPy's own function of the request, which carries a digest of the URL, not the URL.
    assert cache.requests[0][SERVER_KEY_FIELD] == server_digest(one.api_base)
    assert first == Cache.cache_key(cache, cache.requests[0], IGNORED_CACHE_KEYS)


def test_async_calls_are_keyed_by_the_server_too(cache):
    with FakeOpenAI(lambda s, u: "a") as one, FakeOpenAI(lambda s, u: "b") as two:
        assert asyncio.run(served(one.api_base).acall(PROMPT)) == ["a"]
        assert asyncio.run(served(two.api_base).acall(PROMPT)) == ["b"]
    assert cache.keys[0] != cache.keys[1]


def test_the_digest_holds_no_credentials_and_ignores_case_of_scheme_and_host():
    secret = "http://alice:s3cret-pw@LLM.Internal:8000/v1/?token=abc"
    assert server_digest(secret) == server_digest("http://llm.internal:8000/v1")
    assert server_digest("http://llm.internal:8000/v1") != server_digest("http://llm.internal:8001/v1")
    assert "s3cret" not in server_digest(secret) and len(server_digest(secret)) == 64


def test_without_a_base_url_the_lm_keeps_dspys_plain_cache_key(monkeypatch):
    """A hosted provider's and the embedded model's keys stay what they were: existing caches stay warm."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-000")
    lm = build_lm(Settings(lm="openai/gpt-4o-mini"))
    assert type(lm) is dspy.LM
    assert isinstance(served("http://127.0.0.1:9/v1"), ServerKeyedLM)
