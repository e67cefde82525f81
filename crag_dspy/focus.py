"""What the grader reads of a passage: its title and the sentences most similar to the question.

Grading every retrieved passage with the LM reads as many prompt tokens as plain RAG's whole answer,
so on a CPU grading alone cost about what plain RAG does (BENCHMARKS.md). Most of a passage is not
about what the question asks, and the sentence that is tends to be the one the bundled sentence
embeddings rank first. On the default domain's 232 val relevance pairs the embedded 1.5B model ranked
passages better from the title and the single most similar sentence (ROC AUC 0.900) than from the
whole passage (0.889), at 1.07 instead of 1.96 s per pair; on some subsets it ranks worse
(docs/grader.md). The paper's evaluator also reads a bounded input (512 tokens).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .embeddings import Embedder
from .strips import split_sentences

__all__ = ["SentenceFocus", "check_grade_sentences", "focus_document", "top_sentences"]


def check_grade_sentences(sentences: object) -> int:
    """Return ``sentences`` if it is a valid ``grade_sentences`` (an integer >= 0; 0 = whole passages),
    else raise ValueError."""
    if not isinstance(sentences, int) or isinstance(sentences, bool) or sentences < 0:
        raise ValueError(f"grade_sentences must be an integer >= 0, got {sentences!r}")
    return sentences


def top_sentences(similarities: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` most similar sentences, in reading order (equal similarity: earlier first)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ranked = sorted(range(len(similarities)), key=lambda i: (-similarities[i], i))
    return sorted(ranked[:n])


def focus_document(document: str, question: str, embed: Callable[[list[str]], Any], n: int) -> str:
    """``document`` (a title line, then the text) cut to its title line and the ``n`` sentences of its text most
    similar to ``question``; a text of at most ``n`` sentences is returned unchanged (no embedding).

    ``embed`` maps a list of texts to unit vectors, so cosine similarity is a dot product.
    """
    title, newline, text = document.partition("\n")
    if not newline:  # no title line: all of it is text
        title, text = "", document
    sentences = split_sentences(text)
    if len(sentences) <= n:
        return document
    vectors = np.asarray(embed([question, *sentences]))
    similarities = vectors[1:] @ vectors[0]
    kept = " ".join(sentences[i] for i in top_sentences(similarities.tolist(), n))
    return f"{title}\n{kept}" if title else kept


class SentenceFocus:
    """A judge input view: ``document`` becomes its title and its ``sentences`` sentences most similar
    to ``question`` (bundled MiniLM embeddings, a few milliseconds per passage on a CPU).

    Infrastructure, not learned state: it is shared by copies of the judge, never saved in a program's
    state (the program's config records ``grade_sentences`` instead).
    """

    def __init__(self, sentences: int, embedder: Embedder | None = None):
        if sentences < 1:
            raise ValueError(f"sentences must be >= 1, got {sentences}")
        self.sentences = sentences
        self.embedder = embedder if embedder is not None else Embedder()
        # The same passage is focused for the same question again by the compile's cached re-runs and by
        # shared-work keys; embedding it again would cost more than the lookup.
        self._focus = functools.lru_cache(maxsize=4096)(self._compute)

    @property
    def key(self) -> str:
        """Identifies what the view shows, for caches of judgements."""
        return f"focus:{self.sentences}:{self.embedder.name}"

    def _compute(self, document: str, question: str) -> str:
        return focus_document(document, question, self.embedder.encode, self.sentences)

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {**inputs, "document": self._focus(str(inputs["document"]), str(inputs["question"]))}

    def __deepcopy__(self, memo: dict) -> SentenceFocus:
        return self  # holds the embedding model: shared, like the retriever

    def __repr__(self) -> str:
        return f"SentenceFocus(sentences={self.sentences}, embedder={self.embedder.name!r})"
