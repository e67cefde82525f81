"""The trace as clients see it: every decision and its reasons, none of the knowledge base's raw text.

The full :class:`~crag_dspy.trace.CRAGTrace` holds each passage as the grader read it, every strip's
text and the web pages' contents: whatever the store holds goes to whoever may ask. Clients get what
explains the answer: scores, actions, sources, the kept strips (the answer's only context), the
citations (a sentence of a kept strip each), the query and timings. The full trace is for debug keys
(``POST /ask?debug=1``).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..citations import Citation
from ..grounding import Grounding
from ..trace import CRAGTrace, DocumentGrade, InternalRound, StageUsage, StripRecord, WebRecord

__all__ = [
    "ClientDocument",
    "ClientStrip",
    "ClientTrace",
    "ClientWebResult",
    "client_citations",
    "client_trace",
]


class ClientDocument(BaseModel):
    id: str
    doc_id: str
    title: str
    rank: int
    similarity: float
    score: float | None = Field(description="P(relevant) in [0, 1]; None when the grader failed")
    score_source: str
    attempts: int
    error: str | None = None


class ClientStrip(BaseModel):
    source: str
    doc_id: str
    title: str
    position: int
    text: str | None = Field(
        description="the strip's text when it was kept (the answer's context); else None"
    )
    score: float | None
    score_source: str
    kept: bool
    url: str | None = None
    page: int | None = Field(None, description="1-based page of the PDF the strip is from")
    section: str | None = Field(None, description="heading path of the section the strip is from")


class ClientWebResult(BaseModel):
    title: str
    url: str


class ClientTrace(BaseModel):
    """CRAGTrace without raw passages, graded excerpts, dropped strips' text or web page contents."""

    question: str
    history_turns: int = 0
    standalone_question: str | None = None
    answer: str | None = None
    lm_answer: str | None = None
    action: str | None = None
    lower: float
    upper: float
    question_type: str | None = None
    retriever: str
    web_backend: str
    lm_model: str | None = None
    documents: list[ClientDocument] = []
    internal_retries: int = 0
    first_action: str | None = None
    internal_rounds: list[InternalRound] = []
    internal_strips: list[ClientStrip] = []
    web_query: str | None = None
    web_results: list[ClientWebResult] = []
    witness_results: list[ClientWebResult] = []
    external_strips: list[ClientStrip] = []
    defused: list[str] = []
    grounding: Grounding | None = None
    citations: list[Citation] = []
    fallbacks: list[str] = []
    errors: list[str] = []
    timings: dict[str, float] = {}
    lm_usage: dict[str, StageUsage] = {}


# What ``client_trace`` trims; every other field of ClientTrace is CRAGTrace's as it is, none of which
# holds raw knowledge-base text (``context``, the kept strips again, is withheld; ``grounding`` names the
# answer's own words and the sources, ids and URLs, that instruct the model).
_TRIMMED = {"documents", "internal_strips", "external_strips", "web_results", "witness_results", "citations"}
_KEPT_AS_IS = set(ClientTrace.model_fields) - _TRIMMED


def _document(d: DocumentGrade) -> ClientDocument:
    return ClientDocument(**d.model_dump(include=set(ClientDocument.model_fields)))


def _strip(s: StripRecord) -> ClientStrip:
    fields = s.model_dump(include=set(ClientStrip.model_fields))
    return ClientStrip(**{**fields, "text": s.text if s.kept else None})


def _links(results: list[WebRecord]) -> list[ClientWebResult]:
    return [ClientWebResult(title=r.title, url=r.url) for r in results]


def _normalised(text: str) -> str:
    # Quotes are sentences as crag_dspy.strips.split_sentences cut them: whitespace runs become one space.
    return " ".join(text.split())


def client_citations(trace: CRAGTrace) -> list[Citation]:
    """The trace's citations whose quote is text of a kept strip of the same source.

    ``cite`` only quotes kept strips, so this withholds nothing today; it is checked here because
    citations reach every client (in ``AskResponse`` too, not only in the trimmed trace), and a change
    to how citations are made must not let a dropped strip's or a raw passage's text through.
    """
    kept = [s for s in (*trace.internal_strips, *trace.external_strips) if s.kept]
    return [
        c
        for c in trace.citations
        if any(
            s.doc_id == c.doc_id and s.source == c.source and _normalised(c.quote) in _normalised(s.text)
            for s in kept
        )
    ]


def client_trace(trace: CRAGTrace) -> ClientTrace:
    """``trace`` trimmed for clients."""
    return ClientTrace(
        **trace.model_dump(include=_KEPT_AS_IS),
        citations=client_citations(trace),
        documents=[_document(d) for d in trace.documents],
        internal_strips=[_strip(s) for s in trace.internal_strips],
        external_strips=[_strip(s) for s in trace.external_strips],
        web_results=_links(trace.web_results),
        witness_results=_links(trace.witness_results),
    )
