"""Judging relevance: whether a retrieved passage, or a strip of one, helps answer a question.

Two kinds of judge, each behind one small protocol (:mod:`~crag_dspy.judges.protocols`):

- **The LLM judge** (:mod:`~crag_dspy.judges.llm`, a :class:`Judge`). :class:`BinaryJudge` asks
  the LM one yes/no question in one word (:class:`~crag_dspy.adapters.LabelAdapter`) and reads
  P(yes) from the first token's log-probabilities (:mod:`~crag_dspy.judges.scoring`). Its
  :class:`Calibration` (:mod:`~crag_dspy.judges.calibration`), fitted by the compile, maps P(yes) to
  the score, optionally weighing lexical evidence from the whole text
  (:mod:`~crag_dspy.judges.evidence`). The grader and the strip filter are both LLM judges; the
  grader reads a view of each passage (:mod:`~crag_dspy.judges.view`, :class:`SentenceFocus`: its
  title and the sentences most similar to the question).
- **The trained evaluator** (:mod:`~crag_dspy.judges.evaluator`, a :class:`PairScorer`).
  :class:`RelevanceEvaluator` is a cross-encoder fine-tuned on a domain's labelled pairs. It scores
  all of a question's passages in one batched pass.

**Fusion** (:mod:`~crag_dspy.judges.fusion`). A program's grade source, :class:`Grading`, says
where document grades come from: the LLM judge, the evaluator, or both. When both are used, a fitted
logistic map (:class:`LinearScore`) fuses them with the retrieval similarity. ``optimize.grade_source``
chooses the source on val, and the program JSON saves it.
"""

from .calibration import Calibration, fit_calibration
from .evaluator import EvaluatorError, RelevanceEvaluator, TrainingConfig, TrainingReport, train_evaluator
from .evidence import EVIDENCE_FEATURES, FITTED_FEATURES, evidence_features
from .fusion import GRADE_MODES, Grading, LinearScore, SignalScores, fit_linear_score, fused_signals
from .llm import BinaryJudge, Judgement
from .protocols import Judge, PairScorer
from .scoring import clamp_score, yes_probability
from .view import SentenceFocus

__all__ = [
    "EVIDENCE_FEATURES",
    "FITTED_FEATURES",
    "GRADE_MODES",
    "BinaryJudge",
    "Calibration",
    "EvaluatorError",
    "Grading",
    "Judge",
    "Judgement",
    "LinearScore",
    "PairScorer",
    "RelevanceEvaluator",
    "SentenceFocus",
    "SignalScores",
    "TrainingConfig",
    "TrainingReport",
    "clamp_score",
    "evidence_features",
    "fit_calibration",
    "fit_linear_score",
    "fused_signals",
    "train_evaluator",
    "yes_probability",
]
