"""Scripted stand-ins for the LM, retriever and web search: control-flow tests only, never quality claims."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from types import SimpleNamespace

import dspy

from crag_dspy.protocols import Passage, WebResult, WebSearchError

NO_LM = ("--lm", "openai/m", "--lm-api-base", "http://127.0.0.1:9/v1")
"""CLI flags naming an LM nobody listens on: a command that got as far as asking it fails there, and the
embedded model is never started."""


def _response(text: str, logprobs: dict | None, prompt_tokens: int, model: str):
    choice = SimpleNamespace(
        message=SimpleNamespace(content=text, tool_calls=None), logprobs=logprobs, finish_reason="stop"
    )
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max(1, len(text.split())),
        "total_tokens": prompt_tokens + len(text.split()),
    }
    return SimpleNamespace(choices=[choice], usage=usage, model=model)


def yes_no_logprobs(p_yes: float) -> dict:
    """OpenAI-style logprobs whose first token is yes/no with probability p_yes / 1 - p_yes."""
    p_yes = min(max(p_yes, 1e-6), 1 - 1e-6)
    top = [{"token": "yes", "logprob": math.log(p_yes)}, {"token": "no", "logprob": math.log(1 - p_yes)}]
    first = top[0] if p_yes >= 0.5 else top[1]
    return {"content": [{**first, "top_logprobs": top}]}


class ScriptedLM(dspy.BaseLM):
    """Answers each prompt with ``script(system, user) -> str | (str, p_yes)`` and counts every call.

    Grader/strip-filter prompts (LabelAdapter) get "yes"/"no" plus logprobs for the given P(yes);
    other prompts get DSPy ChatAdapter-formatted fields from a dict the script returns.
    """

    def __init__(self, script: Callable[[str, str], object], model: str = "scripted/fake"):
        super().__init__(model=model, temperature=0.0, max_tokens=256, cache=False)
        self.script = script
        self.calls: list[tuple[str, str]] = []
        self.requests: list[dict] = []  # each call's request settings (stop, max_tokens, ...)
        self._lock = threading.Lock()

    def forward(self, prompt=None, messages=None, **kwargs):
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = messages[-1]["content"]
        with self._lock:
            self.calls.append((system, user))
            self.requests.append(kwargs)
            self.last_messages = messages  # scripts may look at the whole conversation (e.g. demos)
        result = self.script(system, user)
        if isinstance(result, Exception):
            raise result
        text, logprobs = render(result, bool(kwargs.get("logprobs")))
        return _response(text, logprobs, len(system.split()) + len(user.split()), self.model)


class ScriptEngine:
    """A :class:`~crag_dspy.lm.openai_server.ChatEngine` answering with ``script(system, user)`` as
    :class:`ScriptedLM` does (a one-field dict as the bare value, as TextAdapter replies), so that a real
    ``dspy.LM`` reaches it through :class:`~crag_dspy.lm.openai_server.OpenAIServer` and LiteLLM. A
    streamed request gets its text a word at a time through ``on_text``, waiting on ``gate`` (when given)
    before the last word (or ``piece`` characters at a time, when given: a word split across tokens);
    ``streamed`` records the system prompt of each streamed request."""

    def __init__(
        self,
        script: Callable[[str, str], object],
        gate: threading.Event | None = None,
        piece: int | None = None,
    ):
        self.script, self.gate, self.piece = script, gate, piece
        self.streamed: list[str] = []

    def chat(self, messages, *, max_tokens, top_logprobs=None, on_text=None, **_):
        from crag_dspy.lm.ik_engine import Completion, TokenLogprob

        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        result = self.script(system, messages[-1]["content"])
        if isinstance(result, Exception):
            raise result
        if isinstance(result, dict) and len(result) == 1:
            result = next(iter(result.values()))
        text, logprobs = render(result, top_logprobs is not None)
        entries = None
        if logprobs is not None:
            (first,) = logprobs["content"]
            top = tuple((t["token"], t["logprob"]) for t in first["top_logprobs"])
            entries = (TokenLogprob(first["token"], first["logprob"], top),)
        if on_text is not None:
            self.streamed.append(system)
            self._stream(text, on_text)
        return Completion(text, "stop", len(str(messages).split()), 0, max(1, len(text.split())), entries)

    def _stream(self, text: str, on_text: Callable[[str], None]) -> None:
        if self.piece:
            for i in range(0, len(text), self.piece):
                on_text(text[i : i + self.piece])
            return
        words = text.split(" ")
        for i, word in enumerate(words):
            if i == len(words) - 1 and i and self.gate is not None and not self.gate.wait(10):
                raise TimeoutError("nobody read the answer's first words")
            on_text(word if i == len(words) - 1 else word + " ")


def render(result: object, want_logprobs: bool) -> tuple[str, dict | None]:
    """A script's result as completion text (+ logprobs): a float is P(yes) of a yes/no answer, a dict
    the ChatAdapter fields, anything else the raw text."""
    if isinstance(result, float):
        return ("yes" if result >= 0.5 else "no"), (yes_no_logprobs(result) if want_logprobs else None)
    if isinstance(result, dict):
        return "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in result.items()) + "[[ ## completed ## ]]", None
    return str(result), None


def field(user: str, name: str) -> str:
    """Extract an input field's value from a LabelAdapter or ChatAdapter user message."""
    fenced = re.search(rf"{name}:\n<<<\n(.*?)\n>>>", user, re.DOTALL)
    if fenced:
        return fenced.group(1)
    chat = re.search(rf"\[\[ ## {name} ## \]\]\n(.*?)(?:\n\n\[\[|\n\nRespond with|\Z)", user, re.DOTALL)
    if chat:
        return chat.group(1)
    plain = re.search(rf"^{name}: (.*)$", user, re.MULTILINE)
    return plain.group(1) if plain else ""


class ListRetriever:
    """Returns the given passages (as many as asked), in order."""

    name = "list"

    def __init__(self, texts: list[tuple[str, str]]):
        self.passages = [
            Passage(id=f"c{i}", doc_id=doc_id, title=doc_id, text=text, rank=i, similarity=1 - i / 10)
            for i, (doc_id, text) in enumerate(texts)
        ]

    def retrieve(self, query: str, k: int) -> list[Passage]:
        return self.passages[:k]


class ListWebSearch:
    name = "listweb"

    def __init__(self, results: list[WebResult] | None = None, error: Exception | None = None):
        self.results = results or []
        self.error = error
        self.queries: list[str] = []

    def search(self, query: str, max_results: int) -> list[WebResult]:
        self.queries.append(query)
        if self.error:
            raise self.error
        return self.results[:max_results]


def compile_report(**fields: object) -> dict:
    """The least a compile report holds for ``optimize.report.write_report``, plus ``fields``."""
    return {
        "domain": "d",
        "lm": "openai/m",
        "optimizer": "none",
        "seed": 0,
        "seconds": 1.0,
        "lm_usage": {"calls": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0},
        "stages": {},
        **fields,
    }


__all__ = [
    "ListRetriever",
    "ListWebSearch",
    "ScriptedLM",
    "WebSearchError",
    "compile_report",
    "field",
    "render",
    "yes_no_logprobs",
]
