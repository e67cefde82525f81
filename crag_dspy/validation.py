"""Validation of user questions: one pure function shared by the module, the CLI and the server.

A question is user input headed into prompts. It is normalised (Unicode NFC, control and bidi-override
characters removed, whitespace collapsed, forged prompt markers neutralised) and refused when it is not
a string, holds lone surrogates (bytes that were not UTF-8), is empty (only whitespace, control or
invisible format characters), or is longer than the limit, as typed or once normalised.
Over-long questions are refused rather than truncated: cutting a question can change what it asks, and
the caller is better placed to shorten it.
Questions in any language and script are accepted unchanged apart from that normalisation.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TypeVar

from .untrusted import neutralize

__all__ = ["DEFAULT_MAX_QUESTION_CHARS", "QuestionError", "normalize_question", "replace_surrogates"]

DEFAULT_MAX_QUESTION_CHARS = 2000
"""Default limit (characters as typed, and again after normalisation): far above any real question, far below the
embedded model's context, so a pasted document is refused before it costs LM calls."""

# Bidi overrides/isolates can make displayed text differ from what the model reads ("Trojan source").
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
# Lone surrogates are no text: Python makes them of bytes that are not UTF-8 (sys.argv, os.fsdecode),
# and they cannot be encoded for the store, the embedder or the LM.
_SURROGATE = re.compile("[\ud800-\udfff]")
_J = TypeVar("_J")


def replace_surrogates(value: _J) -> _J:
    """``value`` (decoded JSON: strings, lists and dicts, keys included) with each lone surrogate made
    U+FFFD. A server's JSON may escape one (``"\\ud800"``), which ``json.loads`` decodes into a string
    that cannot be encoded as UTF-8: every response, log line or file holding it would fail. Text from
    a server is cleaned where it enters (the LM's replies, web search results); a question holding one is
    refused instead (:func:`normalize_question`), since it is the user's to fix."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)  # type: ignore[return-value]
    if isinstance(value, list):
        return [replace_surrogates(item) for item in value]  # type: ignore[return-value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}  # type: ignore[return-value]
    return value


class QuestionError(ValueError):
    """The question cannot be asked: not a string, not valid UTF-8, empty, or over the length limit."""


def _is_control(char: str) -> bool:
    return unicodedata.category(char) == "Cc" or char == "\ufeff"


def normalize_question(
    question: object,
    *,
    max_chars: int | None = DEFAULT_MAX_QUESTION_CHARS,
    setting: str | None = "CRAG_MAX_QUESTION_CHARS",
) -> str:
    """Return ``question`` normalised for prompting, or raise :class:`QuestionError` saying why not.

    Control characters (including NUL, escape sequences and the BOM) become spaces, bidi controls are
    removed, runs of whitespace become one space, and DSPy field markers or passage fences are
    neutralised so a question cannot forge the prompt format. ``max_chars=None`` sets no limit: the
    module itself takes any length, and apps (CLI, server) enforce ``CRAG_MAX_QUESTION_CHARS``. The
    length is that of ``question`` as typed, and the normalised text is held to the same limit.
    ``setting`` names the setting that raises the limit in the message (None: the limit is fixed, as the
    server's request limit is). Pure: no I/O, no model.
    """
    if not isinstance(question, str):
        raise QuestionError(f"the question must be a string, not {type(question).__name__}")
    bad = _SURROGATE.search(question)
    if bad:
        raise QuestionError(
            f"the question is not valid UTF-8 (undecodable bytes at character {bad.start() + 1}): "
            "ask it as UTF-8 text"
        )
    # The limit is on what the user typed, so the message speaks of what they see; the normalised text
    # is bounded too (below), since NFC may spell one typed character as up to three.
    advice = f" (setting {setting}): shorten it, or raise the limit" if setting else ": shorten it"
    if max_chars is not None and len(question) > max_chars:
        raise QuestionError(
            f"the question is {len(question)} characters long; the limit is {max_chars}{advice}"
        )
    text = unicodedata.normalize("NFC", question)
    text = _BIDI_CONTROLS.sub("", text)
    text = "".join(" " if _is_control(c) else c for c in text)
    text = " ".join(neutralize(text).split())
    # Invisible format characters (zero-width space, word joiner, soft hyphen, ...) are kept inside a
    # question (ZWJ/ZWNJ spell words in some scripts) but a question of nothing else asks nothing.
    if all(unicodedata.category(c) == "Cf" or c.isspace() for c in text):
        raise QuestionError(
            "the question is empty: ask something (whitespace, control and invisible characters do not count)"
        )
    if max_chars is not None and len(text) > max_chars:
        raise QuestionError(
            f"the question is {len(question)} characters long, but {len(text)} once normalised (Unicode "
            f"NFC spells some characters as two or three); the limit is {max_chars}{advice}"
        )
    return text
