"""The ik_llama engine's request loop stops when its request is withdrawn: run over a fake llama.cpp
binding (no model), so that the checks between prompt batches and generated tokens are what is tested."""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import pytest

from crag_dspy.lm.ik_engine import Cancelled, IkEngine
from crag_dspy.lm.prompt_cache import PromptCache

VOCAB = 4  # token 1 always wins and is never end-of-generation


class FakeLlama:
    """The few llama.cpp calls IkEngine makes while serving a request; counts decoded tokens."""

    def __init__(self):
        self.decoded = 0
        logits = (ctypes.c_float * VOCAB)(0.0, 5.0, 1.0, 0.5)
        self._row = ctypes.cast(logits, ctypes.POINTER(ctypes.c_float))
        self._keep = logits

    def llama_batch_init(self, n, _embd, _seqs):
        return SimpleNamespace(
            n_tokens=0,
            token=[0] * n,
            pos=[0] * n,
            n_seq_id=[0] * n,
            seq_id=[[0] for _ in range(n)],
            logits=[0] * n,
        )

    def llama_batch_free(self, batch):
        pass

    def llama_decode(self, _ctx, batch):
        self.decoded += batch.n_tokens
        return 0

    def llama_get_logits_ith(self, _ctx, _i):
        return self._row

    def llama_token_is_eog(self, _model, _token):
        return False

    def llama_token_to_piece(self, _model, token, buf, size, _lstrip, _special):
        data = f"<{token}>".encode()
        ctypes.memmove(buf, data, len(data))
        return len(data)


def fake_engine(n_ctx: int = 4096) -> tuple[IkEngine, FakeLlama]:
    engine = object.__new__(IkEngine)  # no model: the request loop over the fake binding
    fake = FakeLlama()
    engine._C, engine._lock, engine._ctx, engine._model = fake, threading.Lock(), object(), object()
    engine._seq_rm = lambda *args: True
    engine.n_ctx, engine.n_vocab = n_ctx, VOCAB
    engine.cache = PromptCache(2, n_ctx)
    engine._bytes = {}
    return engine, fake


def after(n: int):
    """A cancel flag that turns True at its ``n``-th question (1-based)."""
    asked = [0]

    def cancelled() -> bool:
        asked[0] += 1
        return asked[0] >= n

    return cancelled


def test_an_uncancelled_request_runs_to_max_tokens():
    engine, fake = fake_engine()
    completion = engine.complete([0] * 1200, max_tokens=20, cancelled=lambda: False)
    assert completion.completion_tokens == 20 and completion.text == "<1>" * 20
    assert fake.decoded == 1200 + 19  # the prompt, then each generated token but the last


def test_a_request_withdrawn_before_its_turn_never_evaluates():
    engine, fake = fake_engine()
    with pytest.raises(Cancelled, match="while it waited for the model"):
        engine.complete([0] * 1200, max_tokens=20, cancelled=after(1))
    assert fake.decoded == 0


def test_a_long_prompt_stops_between_batches():
    engine, fake = fake_engine()
    with pytest.raises(Cancelled, match="during prompt evaluation"):
        engine.complete([0] * 1200, max_tokens=20, cancelled=after(3))  # 1: queue, 2: batch 2, 3: batch 3
    assert fake.decoded == 1024


def test_generation_stops_between_tokens_and_the_engine_serves_the_next_request():
    engine, fake = fake_engine()
    with pytest.raises(Cancelled, match="after 5 generated tokens"):
        engine.complete([0] * 100, max_tokens=500, cancelled=after(6))  # 1: queue, then one per token
    assert fake.decoded == 100 + 4
    # Its sequence is forgotten (its contents are not known), and the model is free.
    assert engine.complete([0] * 100, max_tokens=3).completion_tokens == 3
