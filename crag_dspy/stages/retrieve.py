"""Retrieve the top-k passages: the evidence the action is decided on."""

from __future__ import annotations

from ..faults import RetrievalError, describe_error
from ..protocols import Passage
from ..run import QuestionRun
from ..untrusted import sanitize_passage
from .base import Stage
from .calls import untrusted

__all__ = ["Retrieve"]


class Retrieve(Stage[list[Passage]]):
    """The top-k passages for the question, made inert (``crag_dspy.untrusted``); with
    ``sanitize=False`` as stored (the evaluation's plain-RAG baselines read them so)."""

    name = "retrieve"
    uses = ("retriever",)
    reads = ("k",)

    def compute(self, question: str, sanitize: bool = True) -> list[Passage]:
        run = self.run
        try:
            found = self.program.retriever.retrieve(question, self.program.config.k)
        except Exception as exc:
            run.error(f"retriever {run.trace.retriever} failed: {describe_error(exc)}")
            raise RetrievalError(run.trace.errors[-1], run.trace) from exc
        return untrusted(found, sanitize_passage, run) if sanitize else list(found)

    def record(self, value: list[Passage], run: QuestionRun) -> None:
        run.emit("retrieved", ids=[p.id for p in value], titles=[p.title for p in value])
