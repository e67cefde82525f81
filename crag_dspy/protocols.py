"""The injected dependencies of the CRAG module, as structural protocols, and the values they exchange."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Passage", "Retriever", "WebResult", "WebSearch", "WebSearchError", "passage_heading"]


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk of internal knowledge."""

    id: str
    doc_id: str
    title: str
    text: str
    rank: int
    similarity: float
    source: str | None = None
    url: str | None = None
    page: int | None = None
    """1-based page of a PDF the chunk is from."""
    section: str | None = None
    """Heading path of the section the chunk is from ("Options > Limits")."""

    @property
    def display(self) -> str:
        """What graders and strip filters read: the title (and section) give a chunk its subject."""
        return f"{passage_heading(self.title, self.section)}\n{self.text}"


def passage_heading(title: str, section: str | None) -> str:
    """A chunk's heading line: its document's title, and the section's heading path when it has one."""
    return f"{title} > {section}" if section else title


@dataclass(frozen=True)
class WebResult:
    title: str
    url: str
    content: str


class WebSearchError(RuntimeError):
    """A web search backend failed (network, timeout, quota, bad key); CRAG degrades to internal knowledge."""


@runtime_checkable
class Retriever(Protocol):
    name: str

    def retrieve(self, query: str, k: int) -> list[Passage]: ...


@runtime_checkable
class WebSearch(Protocol):
    name: str

    def search(self, query: str, max_results: int) -> list[WebResult]: ...
