"""Citations: the sources an answer rests on, with the page or section and the sentence that says so.

Pure and without an LM, like the grounding check it builds on (:mod:`crag_dspy.grounding`): a kept
strip of the answer's context is cited when one of its sentences states the answer's key content (a
number with its unit, a name, an identifier) that the question does not already state. An answer with
no key content ("verbose mode") is cited to the sentence sharing most of its words, when it shares at
least half of them. An abstention cites nothing, and neither does an answer no kept strip states:
a citation is a claim that the source says it, never a list of what was read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from .grounding import answer_items, states
from .strips import split_sentences

__all__ = ["MAX_CITATIONS", "Citation", "citations_of_trace", "cite", "content_words"]

MAX_CITATIONS = 3
"""At most this many sources are cited: the strongest first."""

_ABSTENTION = re.compile(r"^\s*i (?:don't|do not) know\b", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9][a-z0-9_.\-/]*[a-z0-9]|[a-z0-9]")
_STOP = frozenset(
    "a an the of to in on at by for from with and or is are was were be been it its this that these those "  # noqa: SIM905
    "as which who what when where how than then there their they you your can may must not no yes".split()
)


class Citation(BaseModel):
    """One source of an answer: a document (``page`` for a PDF, ``section`` for a section under a
    heading path) or a web page (``url``), and the ``quote`` that states the answer's content."""

    model_config = ConfigDict(frozen=True)

    doc_id: str = Field(description="the document id (a corpus folder's path relative to corpus/) or URL")
    title: str
    source: str = Field(description='"internal" (the store) or "web"')
    page: int | None = None
    section: str | None = None
    url: str | None = None
    quote: str = Field(description="the sentence of the source that states the answer's key content")

    @computed_field  # in the JSON too: API clients and the page show the same label as `ask`
    @property
    def label(self) -> str:
        """How people read it: ``fleet-handbook.pdf, p. 2``, ``guide.html, Options > Limits``, or a URL."""
        if self.url:
            return self.url
        where = f"p. {self.page}" if self.page is not None else self.section
        return f"{self.doc_id}, {where}" if where else self.doc_id


def content_words(text: str) -> set[str]:
    """The words of ``text`` (lower case) without the common ones: what quotes are matched by."""
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def _best_sentence(answer: str, question: str, text: str) -> tuple[float, str]:
    """The sentence of ``text`` that best states ``answer``, and how well (0: it does not)."""
    items = answer_items(answer, question)
    best: tuple[float, str] = (0.0, "")
    for sentence in split_sentences(text):
        if items:
            score = sum(states(item, sentence) for item in items) / len(items)
        else:
            # No number or name to look for: the answer's own words, less those it repeats of the question.
            wanted = content_words(answer) - content_words(question) or content_words(answer)
            score = len(wanted & content_words(sentence)) / len(wanted) if wanted else 0.0
            score = score if score >= 0.5 else 0.0
        if score > best[0]:
            best = (score, sentence)
    return best


def cite(answer: str | None, question: str, strips: Sequence[Any], context: str) -> list[Citation]:
    """The citations of ``answer``: the kept strips in ``context`` (records with ``doc_id``, ``title``,
    ``source``, ``text``, ``kept``, ``page``, ``section``, ``url``, as the trace holds them) that state
    its key content, the strongest first (context order on ties), one per document location."""
    if not answer or _ABSTENTION.match(answer):
        return []
    found: dict[tuple[str, int | None, str | None], tuple[float, int, Citation]] = {}
    for order, strip in enumerate(s for s in strips if s.kept and s.text in context):
        score, quote = _best_sentence(answer, question, strip.text)
        if not score:
            continue
        key = (strip.doc_id, strip.page, strip.section)
        citation = Citation(
            doc_id=strip.doc_id,
            title=strip.title,
            source=strip.source,
            page=strip.page,
            section=strip.section,
            url=strip.url,
            quote=quote,
        )
        if key not in found or score > found[key][0]:
            found[key] = (score, found[key][1] if key in found else order, citation)
    ranked = sorted(found.values(), key=lambda entry: (-entry[0], entry[1]))
    return [citation for _, _, citation in ranked[:MAX_CITATIONS]]


def citations_of_trace(trace: Any) -> list[Citation]:
    """:func:`cite` of a finished run's :class:`~crag_dspy.trace.CRAGTrace`."""
    return cite(trace.answer, trace.question, [*trace.internal_strips, *trace.external_strips], trace.context)
