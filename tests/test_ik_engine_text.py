"""The ik_llama engine's completion text when a character's UTF-8 bytes are split across tokens (a
byte-level BPE vocabulary does this for "ë", "ã", CJK, emoji): the character comes out whole, streamed
or not, never as U+FFFD. Run over a fake llama.cpp binding whose tokens stand for given bytes."""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import pytest

from crag_dspy.lm.ik_engine import IkEngine
from crag_dspy.lm.prompt_cache import PromptCache

EOG = 0


class ScriptedLlama:
    """The llama.cpp calls IkEngine makes while serving a request; it generates ``script``'s tokens
    (token ``i + 1`` stands for ``script[i]``'s bytes), then end-of-generation."""

    def __init__(self, script: list[bytes]):
        self.script = script
        self.vocab = len(script) + 1
        self._rows = 0

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

    def llama_decode(self, _ctx, _batch):
        return 0

    def llama_get_logits_ith(self, _ctx, _i):
        winner = min(self._rows + 1, self.vocab) % self.vocab  # the script's tokens in turn, then EOG
        self._rows += 1
        row = (ctypes.c_float * self.vocab)(*[5.0 if t == winner else 0.0 for t in range(self.vocab)])
        self._keep = row
        return ctypes.cast(row, ctypes.POINTER(ctypes.c_float))

    def llama_token_is_eog(self, _model, token):
        return token == EOG

    def llama_token_to_piece(self, _model, token, buf, size, _lstrip, _special):
        data = self.script[token - 1]
        if len(data) > size:
            return -len(data)
        ctypes.memmove(buf, data, len(data))
        return len(data)


def engine_for(script: list[bytes]) -> IkEngine:
    engine = object.__new__(IkEngine)  # no model: the request loop over the fake binding
    fake = ScriptedLlama(script)
    engine._C, engine._lock, engine._ctx, engine._model = fake, threading.Lock(), object(), object()
    engine._seq_rm = lambda *args: True
    engine.n_ctx, engine.n_vocab = 4096, fake.vocab
    engine.cache = PromptCache(2, 4096)
    engine._bytes = {}
    return engine


def run(script: list[bytes], **kwargs) -> tuple[str, list[str]]:
    streamed: list[str] = []
    completion = engine_for(script).complete([7] * 5, max_tokens=50, on_text=streamed.append, **kwargs)
    return completion.text, streamed


ZOE = [b"Zo", b"\xc3", b"\xab", b" is"]  # "Zoë is": the two bytes of "ë" in two tokens


def test_the_decoder_joins_a_characters_bytes_from_two_tokens():
    from crag_dspy.lm.ik_engine import Utf8Pieces

    pieces = Utf8Pieces()
    parts = [pieces.feed(b) for b in ZOE]
    assert parts == ["Zo", "", "ë", " is"]
    assert "".join(parts) + pieces.flush() == "Zoë is"


def test_bytes_a_generation_ends_inside_of_are_one_replacement_character():
    from crag_dspy.lm.ik_engine import Utf8Pieces

    pieces = Utf8Pieces()
    assert pieces.feed(b"S\xc3") == "S" and pieces.flush() == "\ufffd"


@pytest.mark.parametrize(
    "script, expected",
    [
        (ZOE, "Zoë is"),
        ([b"S", b"\xc3", b"\xa3o Paulo"], "São Paulo"),
        ([b"\xe6", b"\x9d", b"\xb1\xe4\xba", b"\xac"], "東京"),  # three-byte characters over four tokens
        ([b"ok ", b"\xf0\x9f", b"\x91\x8d"], "ok 👍"),
    ],
)
def test_a_character_split_across_tokens_is_whole_in_the_text_and_the_stream(script, expected):
    text, streamed = run(script)
    assert text == expected
    assert "".join(streamed) == expected and not any("\ufffd" in s for s in streamed)


def test_a_completion_cut_off_inside_a_character_ends_with_one_replacement_character():
    engine = engine_for([b"Zo", b"\xc3", b"\xab"])
    streamed: list[str] = []
    completion = engine.complete([7] * 5, max_tokens=2, on_text=streamed.append)
    assert completion.text == "Zo\ufffd" == "".join(streamed) and completion.finish_reason == "length"


def test_a_stop_string_with_a_split_character_is_held_back_and_cut():
    text, streamed = run([b"Zo", b"\xc3", b"\xab is", b" \xc3", b"\xa9t\xc3", b"\xa9 here"], stop=["été"])
    assert text == "Zoë is " == "".join(streamed)


def test_a_stop_string_ending_in_a_split_character_leaves_none_of_its_bytes():
    text, streamed = run([b"caf", b"\xc3", b"\xa9 ok"], stop=["café"])
    assert text == "" == "".join(streamed)
