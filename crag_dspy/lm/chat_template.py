"""The chat template of the embedded Qwen2.5 models (ChatML), for engines that take raw prompts.

It reproduces the GGUF's own Jinja template (``tokenizer.chat_template``) for conversations without
tools, which is what llama.cpp's server renders for the same messages, so both engines read the
same prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_SYSTEM", "render_chatml"]

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_ROLES = frozenset({"system", "user", "assistant"})


def _text(content: Any) -> str:
    # OpenAI clients send either a string or a list of parts; only text parts exist for this model.
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise ValueError(f"unsupported message part {part!r}: only text parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    if content is None:
        return ""
    raise ValueError(f"unsupported message content of type {type(content).__name__}")


def render_chatml(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages``: a system turn (Qwen's default when there is none), each turn
    as ``<|im_start|>role\\ncontent<|im_end|>\\n``, then the assistant's opening."""
    if not messages:
        raise ValueError("no messages")
    for message in messages:
        if message.get("role") not in _ROLES:
            raise ValueError(f"unsupported message role {message.get('role')!r}")
    first = messages[0]
    system = _text(first.get("content")) if first["role"] == "system" else DEFAULT_SYSTEM
    rest = messages[1:] if first["role"] == "system" else messages
    turns = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    turns += [f"<|im_start|>{m['role']}\n{_text(m.get('content'))}<|im_end|>\n" for m in rest]
    if add_generation_prompt:
        turns.append("<|im_start|>assistant\n")
    return "".join(turns)
