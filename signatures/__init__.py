"""Typed DSPy Signatures of the CRAG program; each class docstring is the instruction the LM sees."""

from .answering import AnswerFromContext, AnswerWithoutContext
from .grading import GradeDocument
from .rewriting import RewriteQuery
from .strips import FilterStrip

__all__ = ["AnswerFromContext", "AnswerWithoutContext", "FilterStrip", "GradeDocument", "RewriteQuery"]
