"""Decompose-then-recompose: pure functions that cut passages into knowledge strips and rebuild context."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .protocols import passage_heading

__all__ = [
    "Strip",
    "decompose",
    "format_context",
    "recompose",
    "select_strips",
    "split_sentences",
]

Source = Literal["internal", "web"]

# A sentence ends at . ! or ? followed by whitespace and an upper-case letter, digit or quote, unless
# the period belongs to a common abbreviation or an initial ("e.g.", "Dr.", "J. Smith").
_ABBREVIATIONS = {
    "e.g",
    "i.e",
    "etc",
    "dr",
    "mr",
    "mrs",
    "ms",
    "st",
    "no",
    "vs",
    "approx",
    "inc",
    "ltd",
    "co",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "fig",
}
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split text into sentences, keeping abbreviations, initials and decimals intact."""
    text = " ".join(text.split())
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        candidate = text[start : match.start()].rstrip()
        last_word = candidate.rsplit(" ", 1)[-1].rstrip(".").lower()
        if last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha()):
            continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def decompose(text: str, sentences_per_strip: int = 3) -> list[str]:
    """Cut a passage into knowledge strips.

    A passage of one or two sentences is one strip (paper: "if it is short, it is a strip"); longer
    passages are cut into windows of ``sentences_per_strip`` sentences; a trailing single sentence is
    joined to the window before it so that no strip loses its context.
    """
    if sentences_per_strip < 1:
        raise ValueError("sentences_per_strip must be >= 1")
    sentences = split_sentences(text)
    if len(sentences) <= 2:
        return [" ".join(sentences)] if sentences else []
    strips = [sentences[i : i + sentences_per_strip] for i in range(0, len(sentences), sentences_per_strip)]
    if len(strips) > 1 and len(strips[-1]) == 1 and sentences_per_strip > 1:
        strips[-2].extend(strips.pop())
    return [" ".join(group) for group in strips]


@dataclass(frozen=True)
class Strip:
    """A knowledge strip and where it came from; ``rank`` orders its passage, ``position`` the strip in it."""

    text: str
    source: Source
    doc_id: str
    title: str
    rank: int
    position: int
    url: str | None = None
    page: int | None = None
    section: str | None = None

    @property
    def tag(self) -> str:
        return f"[{self.source}]"


def select_strips(
    scored: Sequence[tuple[Strip, float | None]], threshold: float, max_strips: int, *, at_least: int = 0
) -> list[Strip]:
    """Keep strips scoring >= threshold, at most ``max_strips`` of the highest (ties: earlier first).

    When fewer than ``at_least`` reach the threshold, the highest-scoring others make up the number.
    Unknown scores (None) are never kept: a strip the filter could not judge is not trusted as context.
    """
    known = [(s, score) for s, score in scored if score is not None]
    known.sort(key=lambda item: (-item[1], item[0].rank, item[0].position))
    passing = sum(score >= threshold for _, score in known)
    return [s for s, _ in known[: min(max(passing, at_least), max_strips)]]


def recompose(strips: Iterable[Strip]) -> list[Strip]:
    """Put kept strips back in their original order: passage rank first, then position in the passage."""
    return sorted(strips, key=lambda s: (s.rank, s.position))


def format_context(internal: Sequence[Strip], external: Sequence[Strip]) -> str:
    """One line per strip, tagged with its source, internal knowledge first (CORRECT/AMBIGUOUS/INCORRECT)."""
    # A strip cut from its passage keeps the section it is from: "the default is 30" needs its heading.
    strips = [*recompose(internal), *recompose(external)]
    lines = [f"{s.tag} ({passage_heading(s.title, s.section)}) {s.text}" for s in strips]
    return "\n".join(lines)
