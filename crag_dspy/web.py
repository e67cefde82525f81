"""Web search backends: Tavily when a key is set, an offline stand-in over the domain's web corpus."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .protocols import Passage, Retriever, WebResult, WebSearchError
from .redaction import set_key_advice
from .validation import replace_surrogates

__all__ = ["NoWebSearch", "OfflineWebSearch", "TavilyWebSearch", "tavily_api_key", "web_is_off"]


def tavily_api_key(api_key: str | None = None) -> str:
    """``api_key``, else ``TAVILY_API_KEY``; a :class:`WebSearchError` naming the variable when neither is set."""
    key = api_key or os.environ.get("TAVILY_API_KEY")
    if not key:
        raise WebSearchError(f"Tavily needs an API key: {set_key_advice('TAVILY_API_KEY')}")
    return key


class TavilyWebSearch:
    """Tavily web search (``tavily-python``); the key comes from ``TAVILY_API_KEY`` only."""

    name = "tavily"

    def __init__(
        self,
        *,
        timeout_s: float = 15.0,
        prefer_domains: Sequence[str] = (),
        api_key: str | None = None,
        api_base_url: str | None = None,
    ):
        from tavily import TavilyClient

        self._client = TavilyClient(api_key=tavily_api_key(api_key), api_base_url=api_base_url)
        self._timeout_s = timeout_s
        self._prefer = list(prefer_domains)

    def search(self, query: str, max_results: int) -> list[WebResult]:
        options = {"include_domains": self._prefer, "include_domains_mode": "prefer"} if self._prefer else {}
        try:
            response = self._client.search(query, max_results=max_results, timeout=self._timeout_s, **options)
            response = replace_surrogates(response)  # "\ud800" in its JSON: text that is no UTF-8
            # A proxy or outage page can answer 200 with anything: read defensively, as untrusted data.
            results = [
                WebResult(
                    title=str(r.get("title") or r.get("url") or ""),
                    url=str(r.get("url") or ""),
                    content=str(r.get("content") or ""),
                )
                for r in response.get("results") or []
                if isinstance(r, dict) and str(r.get("content") or "").strip()
            ]
        except Exception as exc:  # tavily raises many types; CRAG needs one to degrade on
            # Keys are redacted from every trace message regardless of what a server echoes.
            raise WebSearchError(f"Tavily search failed: {type(exc).__name__}: {exc}") from exc
        return results[:max_results]


class OfflineWebSearch:
    """Offline stand-in for web search: semantic search over the domain's ``web.jsonl`` collection.

    It answers the rewritten query exactly as a search engine would be asked, so the rewrite step is
    exercised offline too.
    """

    name = "offline"

    def __init__(self, retriever: Retriever):
        self._retriever = retriever

    def search(self, query: str, max_results: int) -> list[WebResult]:
        try:
            passages: list[Passage] = self._retriever.retrieve(query, max_results)
        except Exception as exc:  # storage faults degrade like network faults
            raise WebSearchError(f"offline web search failed: {type(exc).__name__}: {exc}") from exc
        return [
            WebResult(title=p.title, url=p.url or f"offline://{p.doc_id}", content=p.text) for p in passages
        ]


class NoWebSearch:
    """Web search switched off (``web_search='none'``, or ``auto`` with neither a Tavily key nor a
    ``web.jsonl``): INCORRECT/AMBIGUOUS questions fall back to internal knowledge, and ``reason`` is what
    every trace reports."""

    name = "none"

    def __init__(self, reason: str = "web search is disabled (web_search='none')"):
        self.reason = reason

    def search(self, query: str, max_results: int) -> list[WebResult]:
        raise WebSearchError(self.reason)


def web_is_off(web_search: object) -> bool:
    """Whether ``web_search`` is search switched off (a setting, not a fault): no query is rewritten
    for it, nothing "fails", and there is no "RAG + web always" to compare with."""
    return isinstance(web_search, NoWebSearch)
