"""The embedded model on ik_llama.cpp: chat completions with token log-probabilities and a KV cache
kept across calls in several sequences.

ik_llama.cpp is a fork of llama.cpp with its own CPU matrix kernels; its PyPI wheel
(``ik-llama-cpp-python``, AVX2, no compiler needed) evaluates the embedded Qwen2.5-Coder-1.5B's
prompts 1.5-1.8x faster than the xllamacpp wheel on the project's 2-core machine once its tensors are
repacked at load time (``docs/performance.md``), and prompt evaluation is where CRAG and a compile
spend their time. Its Python package offers only low-level bindings (no server, no prompt cache, no
log-probabilities), so this module adds what :mod:`crag_dspy.lm.embedded` needs from an engine:
OpenAI-style chat completions served by :mod:`crag_dspy.lm.openai_server`.
"""

from __future__ import annotations

import codecs
import ctypes
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..held_text import prefix_at_end
from .chat_template import render_chatml
from .prompt_cache import CachePlan, PromptCache

__all__ = [
    "Cancelled",
    "Completion",
    "ContextOverflow",
    "EngineError",
    "IkEngine",
    "TokenLogprob",
    "Utf8Pieces",
]

log = logging.getLogger(__name__)

# A sampled answer's alternatives are cut like llama.cpp's server does by default.
_TOP_K, _TOP_P = 40, 0.95


class EngineError(RuntimeError):
    """The engine could not load its model or serve a request (bad request or a llama.cpp failure)."""


class ContextOverflow(EngineError):
    """A prompt (with the tokens to generate) longer than the engine's context."""


class Cancelled(EngineError):
    """The work was withdrawn before it was done (a request whose client left, or a load stopped by
    closing the engine); nothing is returned."""


Cancel = Callable[[], bool] | None
OnText = Callable[[str], None] | None


def _check(cancelled: Cancel, where: str) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled(f"request withdrawn by its client {where}")


class _NoRoom(EngineError):
    """llama.cpp found no contiguous run of free KV cells for a batch."""


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None


class Utf8Pieces:
    """The text of one generation from its tokens' bytes, fed a token at a time.

    A token is a run of bytes, not of characters: a byte-level BPE vocabulary (Qwen's, GPT-2's) splits
    a character it has no token for ("ë", "ã", most CJK characters, emoji) into tokens of one or two of
    its UTF-8 bytes. Decoded token by token, each part would be U+FFFD; here the bytes of a character
    not yet complete are kept until the token that completes it, and :meth:`feed` returns only whole
    characters. :meth:`flush` ends the generation: bytes that never became a character are U+FFFD.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def _bind(lib: ctypes.CDLL, name: str, argtypes: list, restype: Any):
    func = getattr(lib, name)
    func.argtypes, func.restype = argtypes, restype
    return func


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


@_LOG_CALLBACK
def _route_log(level: int, text: bytes, _user: Any) -> None:
    # llama.cpp logs every tensor it loads; those lines belong in a debug log, not the user's terminal.
    message = (text or b"").decode("utf-8", errors="replace").rstrip()
    if message:
        log.log(
            logging.WARNING if level == 4 else logging.DEBUG, "ik_llama: %s", message
        )  # 4: its ERROR level


@contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Capture what native code prints straight to file descriptor 2 (ik_llama.cpp's loader prints
    its reason for failing with printf, past the log callback); the text is in the yielded list
    afterwards, and is written to the real stderr then too: the model loads in a background thread
    (:mod:`crag_dspy.lm.background`), so other threads' output (a progress bar, a log line) may be in
    it and must not be lost."""
    captured: list[str] = []
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            if data:
                os.write(2, data)
            captured.append(data.decode("utf-8", errors="replace"))


class IkEngine:
    """One model and context; :meth:`complete` is thread-safe (calls run one at a time).

    ``slots`` KV-cache sequences keep the latest prompts of different families (see
    :class:`~crag_dspy.lm.prompt_cache.PromptCache`), at most ``n_ctx`` tokens in all; a prompt and
    its answer must fit in ``n_ctx``.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        n_threads: int,
        n_ctx: int,
        slots: int = 8,
        repack: bool = True,
        cancelled: Cancel = None,
    ):
        """``cancelled`` is asked as each tensor loads; when it says True, loading stops within a
        fraction of a second and :class:`Cancelled` is raised (a process that needs no model after
        all, e.g. every answer came from DSPy's cache, does not wait seconds for it at exit)."""
        # ``n_ctx`` tokens may be held in all; the KV cache gets twice as many cells, because a batch
        # needs a contiguous run of free cells and dropped prompt tails leave gaps.
        try:
            from ik_llama_cpp import _ctypes_api as C
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EngineError("the ik_llama engine needs: pip install 'crag-dspy[local]'") from exc
        self._C = C
        self._lock = threading.Lock()
        self._ctx = self._model = None
        lib = C._lib
        self._seq_rm = _bind(
            lib,
            "llama_kv_cache_seq_rm",
            [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32],
            ctypes.c_bool,
        )
        _bind(lib, "llama_log_set", [_LOG_CALLBACK, ctypes.c_void_p], None)(_route_log, None)
        C.llama_backend_init()
        mparams = C.llama_model_default_params()
        mparams.repack_tensors = repack  # interleave rows for the CPU kernels once, at load
        # Referenced until the load returns: ctypes frees a callback whose object is collected.
        go_on = C.llama_progress_callback(lambda _progress, _user: not (cancelled and cancelled()))
        mparams.progress_callback = go_on
        with _captured_stderr() as printed:
            self._model = C.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self._model and cancelled is not None and cancelled():
            raise Cancelled(f"loading {model_path.name} was stopped")
        if not self._model:
            raise EngineError(
                f"ik_llama.cpp could not load the model {model_path}: {printed[0].strip()[-500:]}"
            )
        cparams = C.llama_context_default_params()
        cparams.n_ctx = 2 * n_ctx
        cparams.n_batch = 512
        cparams.n_seq_max = slots
        cparams.n_threads = cparams.n_threads_batch = n_threads
        # Its flash attention asserts on long prompts without AVX-VNNI (the wheel's own guard does
        # the same); the plain path is what was measured.
        cparams.flash_attn = False
        self._ctx = C.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise EngineError("ik_llama.cpp could not create a context")
        self.n_ctx = n_ctx
        self.n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(self._model))
        self.cache = PromptCache(slots, n_ctx)
        self._bytes: dict[int, bytes] = {}

    # -- text <-> tokens ------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        C, data = self._C, text.encode("utf-8")
        # Qwen's GGUF adds no BOS; chat-template markers are special tokens.
        n = abs(C.llama_tokenize(self._model, data, len(data), None, 0, False, True))
        buf = (C.llama_token * n)()
        got = C.llama_tokenize(self._model, data, len(data), buf, n, False, True)
        if got < 0:
            raise EngineError(f"tokenization failed ({got})")
        return list(buf[:got])

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for: possibly part of a character (see :class:`Utf8Pieces`)."""
        if token not in self._bytes:
            size = 64
            buf = ctypes.create_string_buffer(size)
            n = self._C.llama_token_to_piece(self._model, token, buf, size, 0, False)
            if n < 0:  # a longer piece: llama.cpp says how long
                size = -n
                buf = ctypes.create_string_buffer(size)
                n = self._C.llama_token_to_piece(self._model, token, buf, size, 0, False)
            self._bytes[token] = buf.raw[: max(n, 0)]
        return self._bytes[token]

    def piece(self, token: int) -> str:
        """``token`` as text on its own (a log-probability's token); U+FFFD for part of a character.
        A completion's text is decoded across its tokens instead (:class:`Utf8Pieces`)."""
        return self.token_bytes(token).decode("utf-8", errors="replace")

    # -- requests -------------------------------------------------------------------------------
    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        cancelled: Cancel = None,
        on_text: OnText = None,
    ) -> Completion:
        return self.complete(
            self.tokenize(render_chatml(messages)),
            max_tokens=max_tokens,
            temperature=temperature,
            top_logprobs=top_logprobs,
            stop=stop,
            seed=seed,
            cancelled=cancelled,
            on_text=on_text,
        )

    def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_logprobs: int | None = None,
        stop: Sequence[str] = (),
        seed: int | None = None,
        cancelled: Cancel = None,
        on_text: OnText = None,
    ) -> Completion:
        """Continue ``prompt`` by up to ``max_tokens`` tokens; greedy at temperature 0.

        ``cancelled`` is asked before the work starts, between prompt batches and between generated
        tokens: when it says True, :class:`Cancelled` is raised and the model is free for the next request.
        ``on_text`` gets the completion's text as it is generated, in pieces that join to
        ``Completion.text``: text that may be the start of a stop string is held back until the next
        token shows it is not. An exception it raises ends the request (e.g. its client left).
        """
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        with self._lock:
            if self._ctx is None:
                raise EngineError("the engine is closed")
            _check(cancelled, "while it waited for the model")  # e.g. it timed out in the queue
            try:
                plan = self.cache.plan(prompt, reserve=max_tokens)
            except ValueError as exc:
                raise ContextOverflow(str(exc)) from exc
            try:
                try:
                    logits = self._evaluate(prompt, plan, cancelled)
                except _NoRoom:
                    # Freed cells are scattered and a batch needs a contiguous run: start afresh once.
                    self._forget(None)
                    plan = self.cache.plan(prompt, reserve=max_tokens)
                    logits = self._evaluate(prompt, plan, cancelled)
                return self._generate(
                    prompt,
                    plan,
                    logits,
                    max_tokens,
                    temperature,
                    top_logprobs,
                    stop,
                    seed,
                    cancelled,
                    on_text,
                )
            except BaseException:
                self._forget(plan.slot)  # what the sequence holds is no longer known
                raise

    def _forget(self, slot: int | None) -> None:
        self.cache.clear(slot)
        for i in range(self.cache.slots) if slot is None else (slot,):
            self._seq_rm(self._ctx, i, 0, -1)

    def _evaluate(self, prompt: list[int], plan: CachePlan, cancelled: Cancel = None) -> np.ndarray:
        for slot in plan.evict:
            self._forget(slot)
        self._seq_rm(self._ctx, plan.slot, plan.start, -1)
        return self._decode(prompt[plan.start :], plan.start, plan.slot, cancelled)

    def _decode(self, tokens: list[int], pos: int, slot: int, cancelled: Cancel = None) -> np.ndarray:
        """Evaluate ``tokens`` at positions ``pos...`` of sequence ``slot``; the last token's logits."""
        C = self._C
        for i in range(0, len(tokens), 512):
            if i:  # a long prompt takes seconds per batch on a CPU
                _check(cancelled, "during prompt evaluation")
            chunk = tokens[i : i + 512]
            batch = C.llama_batch_init(len(chunk), 0, 1)
            try:
                batch.n_tokens = len(chunk)
                for j, token in enumerate(chunk):
                    batch.token[j] = token
                    batch.pos[j] = pos + i + j
                    batch.n_seq_id[j] = 1
                    batch.seq_id[j][0] = slot
                    batch.logits[j] = 1 if i + j == len(tokens) - 1 else 0
                status = C.llama_decode(self._ctx, batch)
            finally:
                C.llama_batch_free(batch)
            if status == 1:
                raise _NoRoom(f"no room in the KV cache for {len(chunk)} tokens")
            if status != 0:
                raise EngineError(f"llama_decode failed ({status})")
        row = C.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).astype(np.float64)

    def _generate(
        self,
        prompt: list[int],
        plan: CachePlan,
        logits: np.ndarray,
        max_tokens: int,
        temperature: float,
        top_logprobs: int | None,
        stop: Sequence[str],
        seed: int | None,
        cancelled: Cancel = None,
        on_text: OnText = None,
    ) -> Completion:
        rng = np.random.default_rng(seed)
        held = list(prompt)
        generated: list[int] = []
        entries: list[TokenLogprob] = []
        text, finish = "", "length"
        pieces = Utf8Pieces()  # a character split across tokens joins ``text`` with its last byte
        cut: int | None = None  # where a stop string cut ``text``
        sent = 0  # characters of ``text`` handed to on_text
        while True:
            logp = logits - logits.max()
            logp -= math.log(np.exp(logp).sum())
            token = int(np.argmax(logp)) if temperature <= 0 else _sample(logp, temperature, rng)
            if self._C.llama_token_is_eog(self._model, token):
                finish = "stop"
                break
            generated.append(token)
            if top_logprobs is not None:
                entries.append(self._logprob_entry(logp, token, top_logprobs))
            text += pieces.feed(self.token_bytes(token))
            cut = _stop_at(text, stop)
            if cut is not None:
                text, finish = text[:cut], "stop"
                break
            if len(generated) >= max_tokens:
                break
            if on_text is not None:
                ready = len(text) - prefix_at_end(text, stop)
                if ready > sent:
                    on_text(text[sent:ready])
                    sent = ready
            _check(cancelled, f"after {len(generated)} generated tokens")
            logits = self._decode([token], len(held), plan.slot)
            held.append(token)
        if cut is None:  # (after a stop string, bytes held are not the completion's)
            text += pieces.flush()  # bytes of a character the generation ended inside of: U+FFFD
        if on_text is not None and len(text) > sent:
            on_text(text[sent:])  # what was held back for a stop string that never came
        self.cache.commit(plan, held)
        return Completion(
            text=text,
            finish_reason=finish,
            prompt_tokens=len(prompt),
            cached_tokens=plan.start,
            completion_tokens=len(generated),
            logprobs=tuple(entries) if top_logprobs is not None else None,
        )

    def _logprob_entry(self, logp: np.ndarray, token: int, n: int) -> TokenLogprob:
        n = max(1, min(n, 20))
        top = np.argpartition(-logp, n)[:n]
        top = top[np.argsort(-logp[top])]
        return TokenLogprob(
            self.piece(token), float(logp[token]), tuple((self.piece(int(t)), float(logp[t])) for t in top)
        )

    def close(self) -> None:
        """Free the context and model; waits for a request in flight (freeing under it would crash)."""
        with self._lock:
            if self._ctx:
                self._C.llama_free(self._ctx)
                self._ctx = None
            if self._model:
                self._C.llama_free_model(self._model)
                self._model = None


def _sample(logp: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Top-k, then top-p, then temperature sampling (llama.cpp's server defaults)."""
    top = np.argpartition(-logp, _TOP_K)[:_TOP_K]
    top = top[np.argsort(-logp[top])]
    p = np.exp(logp[top])
    keep = int(np.searchsorted(np.cumsum(p / p.sum()), _TOP_P)) + 1
    top = top[:keep]
    scaled = logp[top] / temperature
    weights = np.exp(scaled - scaled.max())
    return int(rng.choice(top, p=weights / weights.sum()))


def _stop_at(text: str, stop: Sequence[str]) -> int | None:
    """Where ``text`` is cut by the first stop string it contains, if any."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return min(cuts) if cuts else None
