"""CRAG's stages as DSPy modules: each returns its value, and the question's trace is written from it.

Being modules, the stages reach DSPy's callbacks (``on_module_start`` / ``on_module_end``) with their
inputs and the value they return, so ``mlflow.dspy.autolog()`` or
:class:`~crag_dspy.tracing.OpenTelemetryCallback` show one span per stage, retrieval and web search
included, nested under the question's ``CRAG`` span. Every named stage's value is cached through one
hook (:class:`~crag_dspy.stages.base.Stage`), keyed on what it reads.

The trace is written by :meth:`Stage.record`, not by a callback: DSPy logs and drops an exception raised
in a callback, and the trace is part of every answer.
"""

from .answer import UNKNOWN_ANSWER, Answer, Answered, abstain, answer_from, finish
from .base import Computed, Program, Stage, config_value, pieces_of, state_key
from .check import SearchWitnesses, check_answer
from .condense import Condense, clean_standalone
from .grade import Grade, GradePassage, PassageGraded
from .knowledge import Knowledge, Refined, knowledge_for, note_reserve_used
from .refine import RefineExternal, RefineInternal, internal_knowledge
from .retrieve import Retrieve
from .retry import RetryRetrieval, RetryRound, ReviseQuery, retry_internal
from .web import Rewrite, SearchWeb, WebSearched, web_knowledge, why_no_web

__all__ = [
    "UNKNOWN_ANSWER",
    "Answer",
    "Answered",
    "Computed",
    "Condense",
    "Grade",
    "GradePassage",
    "Knowledge",
    "PassageGraded",
    "Program",
    "RefineExternal",
    "RefineInternal",
    "Refined",
    "Retrieve",
    "RetryRetrieval",
    "RetryRound",
    "ReviseQuery",
    "Rewrite",
    "SearchWeb",
    "SearchWitnesses",
    "Stage",
    "WebSearched",
    "abstain",
    "answer_from",
    "check_answer",
    "clean_standalone",
    "config_value",
    "finish",
    "internal_knowledge",
    "knowledge_for",
    "note_reserve_used",
    "pieces_of",
    "retry_internal",
    "state_key",
    "web_knowledge",
    "why_no_web",
]
