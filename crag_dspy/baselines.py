"""Plain RAG (retrieve -> answer from the raw top-k), the baseline CRAG is measured against."""

from __future__ import annotations

from contextlib import nullcontext

import dspy

from signatures import AnswerFromContext

from .protocols import Retriever
from .strips import Strip, format_context

__all__ = ["PlainRAG"]


class PlainRAG(dspy.Module):
    """Retrieve top-k and answer from the unfiltered passages, with the same answer signature as CRAG."""

    def __init__(self, retriever: Retriever, *, lm: dspy.BaseLM | None = None, k: int = 5):
        super().__init__()
        self.retriever, self.lm, self.k = retriever, lm, k
        self.answerer = dspy.Predict(AnswerFromContext)

    def forward(self, question: str) -> dspy.Prediction:
        passages = self.retriever.retrieve(question, self.k)
        context = format_context(
            [Strip(p.text, "internal", p.doc_id, p.title, p.rank, 0, p.url) for p in passages], []
        )
        with dspy.context(lm=self.lm) if self.lm is not None else nullcontext():
            answer = self.answerer(question=question, context=context).answer
        return dspy.Prediction(answer=answer, context=context, passages=passages)
