"""Typed DSPy Signatures of the CRAG program and of data synthesis; each class docstring is the instruction the LM sees."""

from .answering import AnswerFromContext, AnswerWithoutContext
from .conversation import CondenseQuestion
from .grading import GradeDocument
from .rewriting import ReviseQuery, RewriteQuery
from .strips import FilterStrip
from .synthesis import WriteQuestions, WriteUnanswerableQuestions

__all__ = [
    "AnswerFromContext",
    "AnswerWithoutContext",
    "CondenseQuestion",
    "FilterStrip",
    "GradeDocument",
    "ReviseQuery",
    "RewriteQuery",
    "WriteQuestions",
    "WriteUnanswerableQuestions",
]
