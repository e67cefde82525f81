"""The corpus document record and the error of a bad domain file: shared by the domain loader
(:mod:`crag_dspy.domain`) and the document readers (:mod:`crag_dspy.loaders`), which it imports."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["MAX_TITLE_CHARS", "CorpusDoc", "DocPart", "DomainDataError", "Record", "short_title"]


class DomainDataError(ValueError):
    """A domain file is missing or malformed; the message names the file and line."""


class Record(BaseModel):
    """A line of a domain's data: surrounding whitespace stripped, extra fields kept."""

    model_config = ConfigDict(extra="allow", str_strip_whitespace=True)


MAX_TITLE_CHARS = 200
"""The longest title or heading name kept: a .txt file's title is its first line, and a file of one 3 MB
line once made every chunk carry 3 MB of title in its metadata and id hash (memory square in the size)."""


def short_title(text: str, most: int = MAX_TITLE_CHARS) -> str:
    """``text`` as is when it is at most ``most`` characters, else cut at the last word boundary before
    that (or mid-word, for a run without spaces) and ended with "…", ``most`` characters in all."""
    if len(text) <= most:
        return text
    cut = text[: most - 1]
    space = cut.rfind(" ")
    return f"{(cut[:space] if space > most // 2 else cut).rstrip()}…"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class DocPart(BaseModel):
    """A located part of a document: one page of a PDF, or one section (under a heading path) of an HTML,
    DOCX or Markdown document. Chunks never cross parts, so each chunk has one place to cite."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    page: int | None = Field(None, ge=1, description="1-based page of a PDF")
    section: str | None = Field(None, description='heading path, e.g. "Options > Limits"')


class CorpusDoc(Record):
    id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    text: str = Field(min_length=1)
    source: str | None = None
    parts: list[DocPart] | None = Field(
        None, description="where each part of the text is (pages, sections); None: the text is one part"
    )

    _blank = field_validator("id", "title", "text")(_not_blank)

    @field_validator("title")
    @classmethod
    def _short(cls, value: str) -> str:
        """Bounded wherever a title comes from (a file's first line, a PDF's metadata, corpus.jsonl):
        every chunk carries it, so its size must not grow with the document's."""
        return short_title(value)
