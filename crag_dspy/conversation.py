"""A conversation's earlier turns: checked, bounded, and made inert before a prompt shows them.

``CRAG(question=..., history=...)`` takes the turns before ``question``; its ``condense`` stage
(:mod:`crag_dspy.stages.condense`) rewrites a follow-up ("and the night ferry?") into a standalone
question from them. History is untrusted input, as documents are: a client writes it, and an earlier
answer may quote a document. Its text passes the same defusing as passages (:mod:`crag_dspy.untrusted`)
and is bounded, so that a long conversation cannot crowd the question out of the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .files import read_regular_file
from .untrusted import defuse_instructions, one_line
from .validation import DEFAULT_MAX_QUESTION_CHARS, QuestionError, normalize_question

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_HISTORY_BYTES",
    "HistoryError",
    "Turn",
    "as_history",
    "history_text",
    "read_history",
]

MAX_ANSWER_CHARS = 4000
"""Longest answer of an earlier turn (a question's limit is the question's own, 2,000 characters)."""

MAX_HISTORY_BYTES = 4 * 1024 * 1024
"""Largest history file read (``ask --history``, 4 MB): the most turns a program takes
(``MOST_HISTORY_TURNS``, 32) of the longest questions and answers are under 2.5 MB even with every
character escaped in the JSON; a bigger file is no conversation, and would be read whole."""


class HistoryError(ValueError):
    """The history is not a list of turns of a question and an answer, or has more turns than the
    program takes (``CRAGConfig.max_history_turns``)."""


class Turn(BaseModel):
    """One earlier turn: a question and the answer it got."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    question: str
    answer: str


def _turn(item: Any, index: int) -> Turn:
    where = f"history[{index}]"
    if isinstance(item, Turn):
        question, answer = item.question, item.answer
    elif isinstance(item, Mapping):
        missing = [key for key in ("question", "answer") if key not in item]
        extra = sorted(set(item) - {"question", "answer"}, key=str)
        if missing or extra:
            problem = f"lacks {', '.join(map(repr, missing))}" if missing else f"has unknown keys {extra}"
            raise HistoryError(f"{where} {problem}: each turn is {{'question': ..., 'answer': ...}}")
        question, answer = item["question"], item["answer"]
    elif isinstance(item, tuple | list) and len(item) == 2:
        question, answer = item
    else:
        raise HistoryError(
            f"{where} is a {type(item).__name__}: each turn is {{'question': ..., 'answer': ...}} "
            "or a (question, answer) pair"
        )
    for name, value, most in (
        ("question", question, DEFAULT_MAX_QUESTION_CHARS),
        ("answer", answer, MAX_ANSWER_CHARS),
    ):
        if not isinstance(value, str):
            raise HistoryError(f"{where}.{name} must be a string, got {type(value).__name__}")
        if len(value) > most:
            raise HistoryError(f"{where}.{name} has {len(value)} characters; at most {most}")
    try:  # as the question itself is: control and invisible characters alone ask nothing
        normalize_question(question, max_chars=None)
    except QuestionError as exc:
        raise HistoryError(f"{where}.question: {exc}") from None
    return Turn(question=question.strip(), answer=answer.strip())


def as_history(
    history: Sequence[Turn | Mapping[str, str] | tuple[str, str]] | None, *, max_turns: int
) -> list[Turn]:
    """``history`` as checked :class:`Turn` objects, oldest first ([] for None); a :class:`HistoryError`
    names the first bad turn and what is wrong with it, or says there are more than ``max_turns``
    (``CRAGConfig.max_history_turns``). Never truncated: pass the last turns yourself."""
    if history is None:
        return []
    if isinstance(history, str | bytes | Mapping) or not isinstance(history, Sequence):
        raise HistoryError(
            f"history must be a list of turns (each {{'question': ..., 'answer': ...}}), got {type(history).__name__}"
        )
    if len(history) > max_turns:
        if max_turns == 0:
            raise HistoryError(
                f"history has {len(history)} turns, and this program takes none (max_history_turns is 0): "
                "ask a standalone question, or raise CRAG_CONFIG__MAX_HISTORY_TURNS"
            )
        raise HistoryError(
            f"history has {len(history)} turns; at most {max_turns} (max_history_turns): pass the last "
            f"{max_turns} (a follow-up refers to the latest ones)"
        )
    return [_turn(item, i) for i, item in enumerate(history)]


def history_text(turns: Sequence[Turn]) -> tuple[str, int]:
    """The turns as the condensing prompt shows them, each field on one line and made inert (prompt-format
    tokens neutralised, instruction-like sentences removed), and how many sentences were removed."""
    lines, removed = [], 0
    for number, turn in enumerate(turns, 1):
        for label, text in (("Q", turn.question), ("A", turn.answer)):
            clean, n = defuse_instructions(one_line(text))
            lines.append(f"{label}{number}: {clean}")
            removed += n
    return "\n".join(lines), removed


def read_history(path: Path) -> list[Any]:
    """The turns in the file at ``path`` (``ask --history``), unchecked (:func:`as_history` checks
    them): a JSON list of ``{"question": ..., "answer": ...}``, or JSON Lines with one such object a
    line. A file that is neither is a :class:`HistoryError` naming the file and the line."""
    # Regular files only, and bounded: a FIFO blocked ``ask`` for ever, and /dev/zero filled memory.
    raw = read_regular_file(path, MAX_HISTORY_BYTES, "history file", HistoryError)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise HistoryError(f"{path}: cannot read the history file ({exc})") from None
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        whole = None  # JSON Lines, or broken: read line by line to say which line
    if isinstance(whole, list):
        return whole
    turns = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            turn = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise HistoryError(
                f"{path}:{number}: not JSON ({exc}); a history file is a JSON list of turns "
                '[{"question": ..., "answer": ...}] or one such object a line (JSON Lines)'
            ) from None
        if not isinstance(turn, dict):
            raise HistoryError(
                f"{path}:{number}: a {type(turn).__name__}, not a turn: each line of JSON Lines is one "
                '{"question": ..., "answer": ...}'
            )
        turns.append(turn)
    return turns
