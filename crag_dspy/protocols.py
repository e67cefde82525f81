"""The injected dependencies of the CRAG module, as structural protocols, and the values they exchange."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Passage", "Retriever", "WebResult", "WebSearch", "WebSearchError"]


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

    @property
    def display(self) -> str:
        """What graders and strip filters read: the title gives a chunk its subject."""
        return f"{self.title}\n{self.text}"


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
