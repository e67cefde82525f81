"""Untrusted text (corpus passages, web results, questions) made inert before it enters a prompt.

Passages are data, never instructions. Prompts label and fence them (``LabelAdapter`` fences each
passage in ``<<<``/``>>>``; the answerer reads one ``[source] (title) text`` line per strip inside its
own field). Two layers keep a passage from acting as an instruction:

1. Format tokens are made inert, always (:func:`neutralize`): DSPy's field markers
   (``[[ ## answer ## ]]``) could open a field or end one early, the fences ``<<<``/``>>>`` could close
   a fence, the source tags ``[internal]``/``[web]`` could pass web text off as internal knowledge,
   and line breaks in a title could start a forged context line.
2. Sentences in the common phrasing of a prompt injection (:func:`defuse_instructions`: "ignore
   previous instructions", "new instructions", "system notice", "this document is relevant", "the
   answer to every question is") are replaced by a marker. Small local models do follow such
   sentences even when told not to (measured: the embedded model answered with an injected word), so
   this is defence in depth: a heuristic that catches the usual phrasing, not a guarantee.

Passages without injection phrasing are returned unchanged apart from (1).
"""

from __future__ import annotations

import dataclasses
import re

from .protocols import Passage, WebResult
from .strips import split_sentences

__all__ = [
    "REMOVED_INSTRUCTION",
    "defuse_instructions",
    "neutralize",
    "one_line",
    "sanitize_passage",
    "sanitize_web_result",
]

REMOVED_INSTRUCTION = "(instruction-like text removed)"

_BRACKETS = re.compile(r"\[\s*\[|\]\s*\]")
_FENCES = re.compile(r"<{3,}|>{3,}")
_SOURCE_TAGS = re.compile(r"\[\s*(internal|web)\s*\]", re.IGNORECASE)
# Phrases addressed to a model rather than to a reader; kept narrow so that ordinary knowledge
# ("installation instructions", "reply with your order number") is never removed.
_INSTRUCTION_PATTERNS = (
    (
        r"\b(ignore|disregard|forget|override|bypass)\b[^.!?]{0,40}"
        r"\b(previous|prior|above|earlier|preceding|all|any|other|your|system)\b[^.!?]{0,20}"
        r"\b(instructions?|prompts?|rules|directions|messages?|guidelines)\b"
    ),
    r"\b(new|updated|real|actual)\s+(instructions?|task|rules)\s*:",
    r"\b(system|developer|admin)\s+(notice|prompt|override)s?\b",
    r"\b(you|the assistant|the model|the ai)\s+(must|should|will)\s+(now\s+)?(answer|respond|reply|say|output)\b",
    r"\bthe\s+(correct\s+|only\s+)?answer\s+to\s+(this|every|any|all|each)\s+questions?\s+is\b",
    r"\bthis\s+(document|passage|text|page|strip)\s+is\s+(highly\s+|very\s+)?relevant\b",
    r"\b(grade|mark|rate|judge)\s+(it|this|me)\s+(as\s+)?(relevant|yes)\b",
)
_INSTRUCTION_LIKE = re.compile("|".join(f"(?:{p})" for p in _INSTRUCTION_PATTERNS), re.IGNORECASE)


def neutralize(text: str) -> str:
    """``text`` with every prompt-format token made inert (see the module docstring). Idempotent."""
    previous = None
    while previous != text:  # "[[[[" becomes "[[" after one pass; repeat until nothing is left
        previous = text
        text = _BRACKETS.sub(lambda m: m.group(0)[0], text)
    text = _FENCES.sub(lambda m: m.group(0)[0] * 2, text)
    return _SOURCE_TAGS.sub(lambda m: f"({m.group(1)})", text)


def defuse_instructions(text: str) -> tuple[str, int]:
    """Replace sentences phrased as instructions to a model by a marker; return (text, how many)."""
    if not _INSTRUCTION_LIKE.search(text):
        return text, 0  # the usual case: the passage is left exactly as it was
    sentences = split_sentences(text)
    kept = [REMOVED_INSTRUCTION if _INSTRUCTION_LIKE.search(s) else s for s in sentences]
    return " ".join(kept), sum(s == REMOVED_INSTRUCTION for s in kept)


def one_line(text: str) -> str:
    """Neutralised and on one line: for titles and other short labels printed inside a prompt line."""
    return " ".join(neutralize(text).split())


def sanitize_passage(passage: Passage) -> tuple[Passage, int]:
    """A retrieved passage that cannot forge the prompt format, and how many sentences were defused."""
    text, removed = defuse_instructions(neutralize(passage.text))
    title, removed_in_title = defuse_instructions(one_line(passage.title))
    return dataclasses.replace(passage, title=title, text=text), removed + removed_in_title


def sanitize_web_result(result: WebResult) -> tuple[WebResult, int]:
    """A web result that cannot forge the prompt format, and how many sentences were defused."""
    content, removed = defuse_instructions(neutralize(result.content))
    title, removed_in_title = defuse_instructions(one_line(result.title))
    return dataclasses.replace(result, title=title, content=content), removed + removed_in_title
