"""Check an answer against the web's pages for the question itself (the witness search). No LM call."""

from __future__ import annotations

from ..grounding import grounding_of_trace, key_content
from ..run import QuestionRun
from ..web import web_is_off
from .base import Program, Stage
from .web import WebSearched, search

__all__ = ["SearchWitnesses", "check_answer"]


class SearchWitnesses(Stage[WebSearched]):
    """Search the web with the question itself, for pages the grounding check compares the answer with."""

    name = "witness_search"
    uses = ("web_search",)
    reads = ("witness_results",)

    def compute(self, query: str) -> WebSearched:
        instead = "the answer was checked against the run's own sources only"
        n = self.program.config.witness_results
        return search(self.program, self.run, "witness search", query, n, instead)

    def record(self, value: WebSearched, run: QuestionRun) -> None:
        run.trace.witness_results = value.records()


def check_answer(program: Program, run: QuestionRun, question: str) -> None:
    """Check the answer (its grounding, from the answer stage) against the web's results for the
    question itself too, when it has key content: the route's own sources are what it chose to read,
    and a planted page that wins the retrieval pushes out the honest page that would dispute it; a
    search by the question reaches other pages and other parts of them."""
    # Web search that is off is a setting, not a fault to report; one that failed in this run is not
    # waited for twice; a route that searched with the question itself has its pages in the trace.
    searchable = not (web_is_off(program.web_search) or run.web_failed or question in run.web_queries)
    if not (program.config.witness_results and searchable and key_content(run.trace.answer or "")):
        return
    if SearchWitnesses(program, run)(query=question).results:
        run.trace.grounding = grounding_of_trace(run.trace)
