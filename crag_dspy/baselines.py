"""The baselines CRAG is measured against: plain RAG (answer from the raw top-k) and no retrieval."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import dspy

from signatures import AnswerFromContext, AnswerWithoutContext

from .generation import attach_unit, text_format
from .protocols import Passage, Retriever
from .strips import Strip, format_context

__all__ = ["NoRetrieval", "PlainRAG", "passage_strips"]


def passage_strips(passages: Sequence[Passage]) -> list[Strip]:
    """Retrieved passages as whole, unjudged internal strips: the context plain RAG answers from."""
    return [
        Strip(p.text, "internal", p.doc_id, p.title, p.rank, 0, p.url, p.page, p.section) for p in passages
    ]


class PlainRAG(dspy.Module):
    """Retrieve top-k and answer from the unfiltered passages, with the same answer signature as CRAG."""

    def __init__(
        self,
        retriever: Retriever,
        *,
        lm: dspy.BaseLM | None = None,
        k: int = 5,
        answer_units: bool = True,
    ):
        super().__init__()
        self.retriever, self.lm, self.k = retriever, lm, k
        self.answer_units = answer_units  # as CRAG: both answerers' replies are read the same way
        self.answerer = dspy.Predict(AnswerFromContext)

    def forward(self, question: str) -> dspy.Prediction:
        passages = self.retriever.retrieve(question, self.k)
        context = format_context(passage_strips(passages), [])
        with (
            dspy.context(lm=self.lm) if self.lm is not None else nullcontext(),
            text_format(),
        ):
            answer = self.answerer(question=question, context=context).answer
        if self.answer_units:
            answer = attach_unit(answer, context)
        return dspy.Prediction(answer=answer, context=context, passages=passages)


class NoRetrieval(dspy.Module):
    """Answer from the model's own (parametric) knowledge, without any context: the floor a retrieval
    system must clear, and close to zero on a domain the model cannot have seen."""

    def __init__(self, *, lm: dspy.BaseLM | None = None):
        super().__init__()
        self.lm = lm
        self.answerer = dspy.Predict(AnswerWithoutContext)

    def forward(self, question: str) -> dspy.Prediction:
        with (
            dspy.context(lm=self.lm) if self.lm is not None else nullcontext(),
            text_format(),
        ):
            answer = self.answerer(question=question).answer
        return dspy.Prediction(answer=answer)
