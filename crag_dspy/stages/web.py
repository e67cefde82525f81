"""The web: rewrite the question into a search query, search, and keep the results made inert."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..generation import clean_query
from ..protocols import WebResult, WebSearchError
from ..routing import Ablation
from ..run import QuestionRun
from ..trace import WebRecord
from ..untrusted import sanitize_web_result
from ..web import web_is_off
from .base import Program, Stage
from .calls import predict_with_retries, untrusted
from .knowledge import Knowledge
from .refine import RefineExternal

__all__ = ["Rewrite", "SearchWeb", "WebSearched", "search", "web_knowledge", "why_no_web"]


@dataclass(frozen=True)
class WebSearched:
    """What web search returned for ``query`` (empty when it failed, ``failed`` then set: the run's
    fallbacks say why)."""

    query: str
    results: list[WebResult] = field(default_factory=list)
    failed: bool = False

    def records(self) -> list[WebRecord]:
        """The results as the trace keeps them."""
        return [WebRecord(title=r.title, url=r.url, content=r.content) for r in self.results]

    def note(self, run: QuestionRun) -> None:
        """Tell the run what was searched: the witness search skips a query answered or a search that failed."""
        if self.failed:
            run.web_failed = True
        else:
            run.web_queries.add(self.query)


def search(program: Program, run: QuestionRun, what: str, query: str, n: int, instead: str) -> WebSearched:
    """Up to ``n`` web results for ``query``, made inert; a failed search (a fallback says what failed
    and what was done ``instead``) gives none."""
    try:
        results = untrusted(program.web_search.search(query, n), sanitize_web_result, run)
    except WebSearchError as exc:
        run.fallback(f"{what} failed ({exc}); {instead}")
    except Exception as exc:  # noqa: BLE001 - a broken backend must not take the answer down
        run.fallback(f"{what} crashed ({type(exc).__name__}: {exc}); {instead}")
    else:
        return WebSearched(query, results)
    return WebSearched(query, failed=True)


class Rewrite(Stage[str]):
    """The web search query (the question itself when rewriting fails)."""

    name = "rewrite"
    uses = ("rewriter",)
    reads = ("lm_calls.retries",)

    def compute(self, question: str) -> str:
        retries = self.program.config.lm_calls.retries
        pred = predict_with_retries(
            self.program.rewriter, "query rewrite", self.run, retries, question=question
        )
        query = clean_query(pred)
        if not query:
            self.run.fallback("query rewrite failed; searched with the question itself")
            return question
        return query


class SearchWeb(Stage[WebSearched]):
    """Search the web with the query, results made inert."""

    name = "web_search"
    uses = ("web_search",)
    reads = ("web_results",)

    def compute(self, query: str) -> WebSearched:
        found = search(
            self.program,
            self.run,
            "web search",
            query,
            self.program.config.web_results,
            "internal knowledge only",
        )
        if found.results == [] and not found.failed:
            self.run.fallback(f"web search returned no results for {query!r}; internal knowledge only")
        return found

    def record(self, value: WebSearched, run: QuestionRun) -> None:
        run.trace.web_query = value.query
        run.trace.web_results = value.records()
        value.note(run)
        run.emit("web_query", query=value.query, results=len(value.results), failed=value.failed)


def web_knowledge(program: Program, run: QuestionRun, question: str, ablation: Ablation) -> Knowledge | None:
    """Rewrite, search, decompose and select web results; None when web search produced nothing.
    ``ablation`` turns the rewrite (search with the question) or the selection (keep every strip) off.

    With web search off there is nothing to do: no query is rewritten (an LM call for a search that
    never happens) and nothing "fails"; :func:`why_no_web` says so."""
    if web_is_off(program.web_search):
        return None
    query = Rewrite(program, run)(question=question) if ablation.rewrite else question
    searched = SearchWeb(program, run)(query=query)
    if not searched.results:
        return None
    refine = RefineExternal(program, run)
    return Knowledge.of(refine(question=question, results=searched.results, select=ablation.select))


def why_no_web(program: Program) -> str:
    """Why a route that reads the web has no web knowledge: search is off (a setting), or it gave nothing."""
    if web_is_off(program.web_search):
        return program.web_search.reason
    return "web search gave nothing"
