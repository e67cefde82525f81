"""The rules a synthetic question must pass, as pure functions: each failure has a named reason.

A generated question is kept only when its gold answer is in its source passage, its words are not
mostly copied from the passage, it is not a duplicate, and neither it nor its answer is empty or too
long. Web-only questions must also not be answerable from the knowledge base. The reasons are the
values of :class:`Reason`; docs/synthesize.md explains each and how the copy cut was measured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum

from crag_dspy.judges.evidence import content_terms

from ..metrics import normalize_answer

__all__ = [
    "COPY_NGRAM",
    "MAX_ANSWER_WORDS",
    "MAX_COPIED_SHARE",
    "MAX_QUESTION_WORDS",
    "MIN_QUESTION_WORDS",
    "Reason",
    "answer_in",
    "copied_share",
    "paraphrase_rate",
    "question_key",
    "reject_reason",
]

COPY_NGRAM = 3
"""A question word counts as copied when it lies in a run of this many question words that the passage
holds in the same order: names of two words are not copies, a phrase lifted from the passage is."""
MAX_COPIED_SHARE = 0.8
"""Questions whose content words are copied beyond this share are rejected. Measured on the bundled
default domain's 320 hand-written answerable questions against their evidence passages (python -m
optimize.synthesis.copy_rates --domain-dir data/default): median 0.38, 90th percentile 0.78, and 9% of
them over 0.8. Hand-written questions reuse names, which the 3-word runs mostly do not count; a
question over the cut is a passage sentence turned round."""
MIN_QUESTION_WORDS, MAX_QUESTION_WORDS = 4, 40
MAX_ANSWER_WORDS = 8
"""Gold answers are short (a name, number, date or phrase): the bundled domain's longest has 7 words."""

_WORD = re.compile(r"[^\W_]+")


class Reason(StrEnum):
    """Why a candidate question was rejected (the review file's ``reason`` column)."""

    EMPTY = "empty"
    TOO_SHORT = "question_too_short"
    TOO_LONG = "question_too_long"
    ANSWER_TOO_LONG = "answer_too_long"
    ANSWER_NOT_IN_PASSAGE = "answer_not_in_passage"
    ANSWER_IN_QUESTION = "answer_in_question"
    COPIED = "copied_from_passage"
    DUPLICATE = "duplicate"
    IN_KNOWLEDGE_BASE = "answer_in_knowledge_base"
    UNPARSED = "lm_reply_unparsed"


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def answer_in(answer: str, text: str) -> bool:
    """Whether ``answer`` appears in ``text`` as whole words after SQuAD normalisation (case,
    punctuation, articles, thousands separators)."""
    wanted = normalize_answer(answer)
    return bool(wanted) and f" {wanted} " in f" {normalize_answer(text)} "


def copied_share(question: str, passage: str, n: int = COPY_NGRAM) -> float:
    """The share of the question's content words that lie in a run of ``n`` question words found in
    the passage in the same order (0.0: all in the question's own words; 1.0: lifted from the passage).
    A question without content words copies nothing (0.0)."""
    words = _words(question)
    content = [i for i, w in enumerate(words) if content_terms(w)]
    if not content:
        return 0.0
    passage_words = _words(passage)
    grams = {tuple(passage_words[i : i + n]) for i in range(len(passage_words) - n + 1)}
    copied: set[int] = set()
    for start in range(len(words) - n + 1):
        if tuple(words[start : start + n]) in grams:
            copied.update(range(start, start + n))
    return sum(i in copied for i in content) / len(content)


def paraphrase_rate(question: str, passage: str) -> float:
    """1 - :func:`copied_share`: the share of the question's content words in its own phrasing."""
    return 1.0 - copied_share(question, passage)


def question_key(question: str) -> str:
    """What two questions must share to be duplicates: their normalised text."""
    return normalize_answer(question)


def reject_reason(
    question: str,
    answer: str | None,
    passage: str,
    seen: Iterable[str] = (),
    knowledge_base: Sequence[str] = (),
) -> Reason | None:
    """Why the candidate (``question``, gold ``answer``, from ``passage``) is rejected, or None.

    ``answer`` is None for a question the knowledge base cannot answer (no gold answer to check);
    ``seen`` holds the :func:`question_key` of every question already kept; ``knowledge_base`` holds
    knowledge-base passages, given only for a web-only question, whose answer must be in none of them.
    Rules are checked in a fixed order and the first that fails is the reason.
    """
    words = _words(question)
    if not words or (answer is not None and not normalize_answer(answer)):
        return Reason.EMPTY
    if len(words) < MIN_QUESTION_WORDS:
        return Reason.TOO_SHORT
    if len(words) > MAX_QUESTION_WORDS:
        return Reason.TOO_LONG
    if answer is not None:
        if len(_words(answer)) > MAX_ANSWER_WORDS:
            return Reason.ANSWER_TOO_LONG
        if not answer_in(answer, passage):
            return Reason.ANSWER_NOT_IN_PASSAGE
        if answer_in(answer, question):
            return Reason.ANSWER_IN_QUESTION
    if copied_share(question, passage) > MAX_COPIED_SHARE:
        return Reason.COPIED
    if question_key(question) in set(seen):
        return Reason.DUPLICATE
    if answer is not None and any(answer_in(answer, text) for text in knowledge_base):
        return Reason.IN_KNOWLEDGE_BASE
    return None
