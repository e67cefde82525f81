"""The LM tokens a request costs, counted the same whether DSPy's cache answered it or the LM did.

DSPy clears the usage of a response its cache serves (``dspy.clients.cache``), so the usage a run
records says what that run paid, not what its requests cost: a warm run of a whole evaluation reports 0
tokens. The cost-quality frontier compares routes by what they would cost on a cold run, so it counts
the tokens of each request's text with LiteLLM's token counter: the model's own tokenizer where
LiteLLM has it offline, else OpenAI's cl100k encoding it bundles, an estimate for other models
(Qwen2.5's byte-level BPE has a vocabulary of the same kind and size class, so English prompts count
within a few percent). Chat-template tokens a server adds are counted by LiteLLM's per-message
allowance, not exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["completion_tokens", "prompt_tokens"]

log = logging.getLogger(__name__)


def _count(model: str, **text: Any) -> int:
    import litellm

    try:
        return int(litellm.token_counter(model=model, **text))
    except Exception as exc:  # noqa: BLE001 - a count is a report's column; it must not stop the run
        # LiteLLM raises on content it cannot tokenize (e.g. an image part); the column then undercounts
        # that request, which the log says, instead of losing the evaluation.
        log.warning("could not count the tokens of a request to %s: %s", model, exc)
        return 0


def prompt_tokens(model: str, inputs: Mapping[str, Any]) -> int:
    """Tokens of an LM request's input: ``inputs`` as DSPy's callbacks receive them (``messages`` or
    ``prompt``)."""
    messages = inputs.get("messages")
    if messages:
        return _count(model, messages=list(messages))
    prompt = inputs.get("prompt")
    return _count(model, text=prompt) if prompt else 0


def completion_tokens(model: str, outputs: Sequence[Any] | None) -> int:
    """Tokens of an LM request's outputs (strings, or DSPy's dicts with a ``text``)."""
    total = 0
    for output in outputs or ():
        text = output.get("text") if isinstance(output, dict) else output
        if isinstance(text, str) and text:
            total += _count(model, text=text)
    return total
