"""Compilation and evaluation of CRAG programs (teleprompters, threshold tuning, relevance data).

``from optimize import CRAGOptimizer``: the compile as a DSPy teleprompter (:mod:`optimize.optimizer`).
"""

from typing import Any

__all__ = ["CRAGOptimizer"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `python -m optimize.<tool>` need not load the whole compile.
    if name == "CRAGOptimizer":
        from .optimizer import CRAGOptimizer

        return CRAGOptimizer
    raise AttributeError(f"module 'optimize' has no attribute {name!r}")
