"""Typed DSPy Signatures of the CRAG program; each class docstring is the instruction the LM sees."""

from .answering import AnswerFromContext
from .grading import GradeDocument
from .rewriting import RewriteQuery
from .strips import FilterStrip

__all__ = ["AnswerFromContext", "FilterStrip", "GradeDocument", "RewriteQuery"]
