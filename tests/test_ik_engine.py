"""The ik_llama engine on the real embedded model (slow): its prompt cache changes nothing but speed,
its log-probabilities are a distribution, and it agrees with llama.cpp's own server."""

from __future__ import annotations

import math

import pytest

from crag_dspy.lm.weights import EMBEDDED_MODELS, ensure_weights
from crag_dspy.settings import Settings

pytest.importorskip("ik_llama_cpp")
pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-1.5b-instruct"
SYSTEM = (
    "You judge search results. Answer yes if the document contains the information the question asks for. "
    "Reply with exactly one word: yes or no."
)
DOCUMENTS = [
    "AquaProbe 220 Product Page\nThe list price of the AquaProbe 220 is 1,240 velds per sensor.",
    "TideLog 5X Product Page\nThe TideLog 5X logger weighs 1.1 kg and is rated IP68.",
    "AquaProbe 200 Product Page (Legacy)\nThe AquaProbe 200 was sold for 990 velds until 2023.",
]


def judge(document: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": f"question: What is the list price of the AquaProbe 220?\n\ndocument:\n<<<\n{document}\n>>>",
        },
    ]


@pytest.fixture(scope="module")
def model_path():
    return ensure_weights(EMBEDDED_MODELS[MODEL], Settings().cache_dir)


@pytest.fixture(scope="module")
def engine(model_path):
    from crag_dspy.lm.ik_engine import IkEngine

    engine = IkEngine(model_path, n_threads=2, n_ctx=2048, slots=3)
    yield engine
    engine.close()


def yes(completion) -> float:
    top = dict(completion.logprobs[0].top)
    return math.exp(top.get("yes", -math.inf)) / (
        math.exp(top.get("yes", -math.inf)) + math.exp(top.get("no", -math.inf))
    )


def test_reused_prefixes_give_the_same_judgements_as_fresh_evaluation(engine):
    fresh = []
    for document in DOCUMENTS:
        engine._forget(None)  # nothing cached: every prompt evaluated from its first token
        fresh.append(engine.chat(judge(document), max_tokens=1, temperature=0, top_logprobs=5))
    engine._forget(None)
    cached = [engine.chat(judge(d), max_tokens=1, temperature=0, top_logprobs=5) for d in DOCUMENTS]
    assert cached[0].cached_tokens == 0 and all(c.cached_tokens == 0 for c in fresh)
    shared = cached[1].cached_tokens
    assert 40 < shared < cached[1].prompt_tokens - 10  # instructions + question, not the document
    assert cached[2].cached_tokens == shared
    for a, b in zip(fresh, cached):
        assert a.text == b.text
        assert yes(a) == pytest.approx(yes(b), abs=0.02)  # batch splits round differently, barely
    assert yes(cached[0]) > 0.5 > yes(cached[1])


def test_logprobs_are_a_sorted_distribution_over_the_vocabulary(engine):
    completion = engine.chat(judge(DOCUMENTS[0]), max_tokens=1, temperature=0, top_logprobs=10)
    (entry,) = completion.logprobs
    values = [lp for _, lp in entry.top]
    assert values == sorted(values, reverse=True) and len(values) == 10
    assert entry.token == entry.top[0][0] and entry.logprob == values[0]  # greedy took the most likely
    assert 0.9 < sum(math.exp(v) for v in values) <= 1.0 + 1e-9


def test_another_prompt_family_does_not_evict_the_first(engine):
    engine._forget(None)
    engine.chat(judge(DOCUMENTS[0]), max_tokens=1, temperature=0)
    other = [
        {"role": "system", "content": "Answer with a short phrase."},
        {"role": "user", "content": "Name a colour."},
    ]
    text = engine.chat(other, max_tokens=8, temperature=0)
    assert text.completion_tokens >= 1 and text.text.strip()
    again = engine.chat(judge(DOCUMENTS[1]), max_tokens=1, temperature=0)
    assert again.cached_tokens > 40


def test_generation_stops_at_the_end_of_turn_or_a_stop_string(engine):
    messages = [{"role": "user", "content": "Reply with exactly: red, green, blue"}]
    done = engine.chat(messages, max_tokens=40, temperature=0)
    assert done.finish_reason == "stop" and "green" in done.text
    cut = engine.chat(messages, max_tokens=40, temperature=0, stop=[","])
    assert cut.finish_reason == "stop" and "," not in cut.text and cut.text.strip()
    short = engine.chat(messages, max_tokens=1, temperature=0)
    assert short.finish_reason == "length" and short.completion_tokens == 1


def test_the_server_streams_the_engines_tokens_as_litellm_reads_them(engine):
    """Through the embedded server and LiteLLM with stream=True: several pieces, which join to the text
    the same request gets unstreamed, with a stop string held back and cut as it is there."""
    import litellm

    from crag_dspy.lm.openai_server import OpenAIServer

    server = OpenAIServer(engine, "m", api_key="k" * 20)
    request = {
        "model": "openai/m",
        "api_base": f"http://127.0.0.1:{server.port}/v1",
        "api_key": "k" * 20,
        "messages": [{"role": "user", "content": "List the colours red, green, blue, one per line."}],
        "max_tokens": 12,
        "temperature": 0,
        "stop": ["Blue"],
        "num_retries": 0,
    }
    try:
        whole = litellm.completion(**request).choices[0].message.content
        pieces = [c.choices[0].delta.content for c in litellm.completion(**request, stream=True)]
    finally:
        server.close()
    text = [p for p in pieces if p]
    assert len(text) >= 3, f"one piece per token or so, got {text}"
    assert "".join(text) == whole and "Green" in whole and "Blue" not in whole


def test_a_character_split_across_tokens_is_decoded_whole(engine):
    """Qwen's byte-level vocabulary has no token for some characters (rare CJK, some emoji; it has
    tokens for "ë", "ã", "東"): their UTF-8 bytes come in two tokens, each of which is no text on its
    own, and the completion's decoder (tests/test_ik_engine_text.py) makes the characters of them."""
    from crag_dspy.lm.ik_engine import Utf8Pieces

    text = "鱻 🦜"
    parts = [engine.token_bytes(t) for t in engine.tokenize(text)]
    assert [p for p in parts if not _decodes(p)], "a token for every character: the test tests nothing"
    pieces = Utf8Pieces()
    assert "".join(pieces.feed(p) for p in parts) + pieces.flush() == text


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_sampling_is_seeded(engine):
    messages = [{"role": "user", "content": "Write one word about the sea."}]
    a = engine.chat(messages, max_tokens=6, temperature=0.9, seed=3)
    b = engine.chat(messages, max_tokens=6, temperature=0.9, seed=3)
    assert a.text == b.text


def test_a_prompt_longer_than_the_context_is_refused_and_the_engine_goes_on(engine):
    from crag_dspy.lm.ik_engine import ContextOverflow

    with pytest.raises(ContextOverflow, match="exceeds the context"):
        engine.chat([{"role": "user", "content": "word " * 3000}], max_tokens=1)
    assert engine.chat(judge(DOCUMENTS[0]), max_tokens=1, temperature=0).text.strip().lower() == "yes"


def test_traffic_beyond_the_cache_evicts_and_stays_correct(model_path, engine):
    from crag_dspy.lm.ik_engine import IkEngine

    small = IkEngine(model_path, n_threads=2, n_ctx=400, slots=2)
    try:
        for i in range(6):  # three families of ~150-token prompts in 400 cells: evictions on most calls
            system = f"{SYSTEM} Rule set {i % 3}: " + " ".join(["be strict"] * 20)
            messages = [{"role": "system", "content": system}, judge(DOCUMENTS[i % 2])[1]]
            got = small.chat(messages, max_tokens=1, temperature=0, top_logprobs=5)
            assert small.cache.used_cells() <= small.cache.capacity
            engine._forget(None)
            expected = engine.chat(messages, max_tokens=1, temperature=0, top_logprobs=5)
            assert got.text == expected.text and yes(got) == pytest.approx(yes(expected), abs=0.02)
    finally:
        small.close()


def test_a_load_told_to_stop_stops_within_a_second_and_says_so(model_path):
    import time

    from crag_dspy.lm.background import BackgroundEngine
    from crag_dspy.lm.ik_engine import Cancelled, IkEngine

    started = time.perf_counter()
    with pytest.raises(Cancelled, match="was stopped"):
        IkEngine(model_path, n_threads=2, n_ctx=512, cancelled=lambda: True)
    assert time.perf_counter() - started < 1.5  # a whole load takes 4-7 s here

    loading = BackgroundEngine(
        lambda stopping: IkEngine(model_path, n_threads=2, n_ctx=512, cancelled=stopping)
    )
    time.sleep(0.5)
    started = time.perf_counter()
    loading.close()  # e.g. at exit after every answer came from DSPy's cache
    assert time.perf_counter() - started < 1.5 and loading.loaded


def test_the_engines_agree_on_judgements(model_path):
    """ik_llama.cpp's kernels round differently from llama.cpp's: P(yes) moves in the second digit."""
    pytest.importorskip("xllamacpp")
    import dspy

    from crag_dspy.judges.llm import BinaryJudge
    from crag_dspy.lm import build_lm
    from signatures import GradeDocument

    grader = BinaryJudge(GradeDocument)
    scores = {}
    for name in ("ik_llama", "xllamacpp"):
        settings = Settings(embedded_engine=name, embedded_threads=2, embedded_ctx=2048)
        lm = build_lm(settings, num_retries=0, cache=False)
        with dspy.context(lm=lm):
            judgements = [
                grader(question="What is the list price of the AquaProbe 220?", document=d).judgement
                for d in DOCUMENTS
            ]
        assert all(j.score_source == "logprobs" for j in judgements)
        scores[name] = [j.raw_score for j in judgements]
    for a, b in zip(scores["ik_llama"], scores["xllamacpp"]):
        assert a == pytest.approx(b, abs=0.1)
        assert (a >= 0.5) == (b >= 0.5)
