"""The judges package's two protocols: the LLM judge is a Judge, the trained evaluator a PairScorer."""

from crag_dspy.judges import BinaryJudge, Judge, PairScorer, RelevanceEvaluator
from signatures import FilterStrip, GradeDocument


def test_the_llm_judges_are_judges():
    grader, strip_filter = BinaryJudge(GradeDocument), BinaryJudge(FilterStrip)
    assert isinstance(grader, Judge) and isinstance(strip_filter, Judge)


def test_the_trained_evaluator_is_a_pair_scorer():
    assert issubclass(RelevanceEvaluator, PairScorer)
    assert not issubclass(BinaryJudge, PairScorer)  # one judgement at a time, not batched logits
