"""The two kinds of relevance judge, as structural protocols: what CRAG, the compile and the evaluation
need of each, and nothing more.

- A :class:`Judge` decides one input at a time: called with one signature's inputs (the grader with
  ``question=..., document=...``, the strip filter with ``question=..., strip=...``), it returns a
  ``dspy.Prediction`` whose ``judgement`` is a :class:`~crag_dspy.judges.llm.Judgement` (``score``:
  P(relevant) in [0, 1], None when no usable answer came). :class:`~crag_dspy.judges.llm.BinaryJudge`
  (the LLM judge) is one.
- A :class:`PairScorer` scores many (question, text) pairs in one batched pass and returns raw
  logits (higher: more relevant), which a fitted map turns into P(relevant)
  (:class:`~crag_dspy.judges.fusion.LinearScore`). The trained cross-encoder
  :class:`~crag_dspy.judges.evaluator.RelevanceEvaluator` is one.

Both are ``runtime_checkable``; like every such check, ``isinstance`` looks for the method only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import dspy

__all__ = ["Judge", "PairScorer"]


@runtime_checkable
class Judge(Protocol):
    """Judges one input: ``judge(question=..., document=...).judgement`` is a
    :class:`~crag_dspy.judges.llm.Judgement`, and the prediction's ``score`` is its score."""

    def __call__(self, **inputs: Any) -> dspy.Prediction: ...


@runtime_checkable
class PairScorer(Protocol):
    """Scores (question, text) pairs together: one raw relevance logit per pair, in order."""

    def logits(self, pairs: Sequence[tuple[str, str]]) -> list[float]: ...
