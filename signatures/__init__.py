"""Typed DSPy Signatures of the CRAG program; each class docstring is the instruction the LM sees."""

from .answering import AnswerFromContext, AnswerWithoutContext
from .grading import GradeDocument
from .rewriting import ReviseQuery, RewriteQuery
from .strips import FilterStrip

__all__ = [
    "AnswerFromContext",
    "AnswerWithoutContext",
    "FilterStrip",
    "GradeDocument",
    "ReviseQuery",
    "RewriteQuery",
]
