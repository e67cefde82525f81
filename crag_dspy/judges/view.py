"""What an LLM judge reads: the sentences most similar to the question (and a passage's title).

Grading every retrieved passage with the LM reads as many prompt tokens as plain RAG's whole answer,
so on a CPU grading alone cost about what plain RAG does (BENCHMARKS.md). Most of a passage is not
about what the question asks, and the sentence that is tends to be the one the bundled sentence
embeddings rank first. The grader reads the title and that sentence (``CRAGConfig.grader_view``);
the measurements behind the default are in docs/experiments.md ("Settings beyond the paper"). The
paper's evaluator also reads a bounded input (512 tokens). The strip filter reads a strip's best
sentence the same way (``CRAGConfig.strip_view``): a strip is three sentences of one passage, and the
answer still reads the strips it keeps whole.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..embeddings import Embedder
from ..strips import split_sentences

__all__ = [
    "SentenceFocus",
    "focus_document",
    "ranked_excerpt",
    "ranked_sentences",
    "top_sentences",
]


def ranked_sentences(scores: Sequence[float]) -> list[int]:
    """Indices of sentences from the most similar to the question to the least; equal scores: earlier
    first."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def top_sentences(scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` most similar sentences, in reading order (equal scores: earlier first)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return sorted(ranked_sentences(scores)[:n])


def _title_and_sentences(document: str) -> tuple[str, list[str]]:
    title, newline, text = document.partition("\n")
    if not newline:  # no title line: all of it is text
        title, text = "", document
    return title, split_sentences(text)


def _similarities(question: str, sentences: list[str], embed: Callable[[list[str]], Any]) -> list[float]:
    vectors = np.asarray(embed([question, *sentences]))
    return (vectors[1:] @ vectors[0]).tolist()


def _titled(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def focus_document(document: str, question: str, embed: Callable[[list[str]], Any], n: int) -> str:
    """``document`` (a title line, then the text) cut to its title line and the ``n`` sentences of its text
    most similar to ``question``; a text of at most ``n`` sentences is returned unchanged (no embedding).

    ``embed`` maps a list of texts to unit vectors, so cosine similarity is a dot product.
    """
    title, sentences = _title_and_sentences(document)
    if len(sentences) <= n:
        return document
    scores = _similarities(question, sentences, embed)
    return _titled(title, " ".join(sentences[i] for i in top_sentences(scores, n)))


def ranked_excerpt(document: str, question: str, embed: Callable[[list[str]], Any], rank: int) -> str | None:
    """``document`` cut to its title line and the sentence of its text ranked ``rank`` (0 = the most
    similar, what :func:`focus_document` keeps for ``n=1``); None when the text has no sentence of that
    rank. ``embed`` as for :func:`focus_document`."""
    title, sentences = _title_and_sentences(document)
    if len(sentences) <= rank:
        return None
    return _titled(title, sentences[ranked_sentences(_similarities(question, sentences, embed))[rank]])


class SentenceFocus:
    """A judge input view: the input ``field`` (``"document"`` for the grader, ``"strip"`` for the strip
    filter) becomes its title line and the ``sentences`` sentences most similar to ``question`` (bundled
    MiniLM embeddings; ~40 ms per new passage on 2 CPU cores, next to ~1 s for the LM's judgement). A
    text without a line break has no title line: a strip is sentences only.

    Infrastructure, not learned state: it is shared by copies of the judge, never saved in a program's
    state (the program's config records ``grader_view`` and ``strip_view`` instead).
    """

    VECTORS_KEPT = 16384
    """Sentence and question vectors kept (384 floats each: ~50 MB at most)."""

    def __init__(
        self,
        sentences: int,
        embedder: Embedder | None = None,
        *,
        field: str = "document",
        vectors_of: SentenceFocus | None = None,
    ):
        """``vectors_of``: a view with the same embedder whose vectors this one shares (the strip filter's
        view shares the grader's: a strip's sentences are its passage's, and the question is the same)."""
        if sentences < 1:
            raise ValueError(f"sentences must be >= 1, got {sentences}")
        self.sentences = sentences
        self.field = field
        self.embedder = embedder if embedder is not None else Embedder()
        # The same passage is focused for the same question again by the compile's cached re-runs and by
        # shared-work keys; embedding it again would cost more than the lookup.
        self._focus = functools.lru_cache(maxsize=4096)(self._compute)
        # Without these a question was embedded again for each passage it is graded against, and a passage's
        # sentences again for each question; a warm default recompile took 32 s, 22 s with them.
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._vectors_lock = threading.Lock()
        if vectors_of is not None:
            if vectors_of.embedder is not self.embedder:
                raise ValueError("a view shares vectors only with a view of the same embedder")
            self._vectors, self._vectors_lock = vectors_of._vectors, vectors_of._vectors_lock

    @property
    def key(self) -> str:
        """Identifies what the view shows, for caches of judgements."""
        return f"focus:{self.sentences}:{self.embedder.name}"

    def _compute(self, document: str, question: str) -> str:
        return focus_document(document, question, self._embed, self.sentences)

    def ranked_excerpt(self, document: str, question: str, rank: int) -> str | None:
        """:func:`ranked_excerpt` with this view's embeddings (vectors shared with the focus)."""
        return ranked_excerpt(document, question, self._embed, rank)

    def _embed(self, texts: list[str]) -> np.ndarray:
        """``texts``' unit vectors, each text embedded once per view and the views sharing its vectors (at
        most ``VECTORS_KEPT`` kept)."""
        known: dict[str, np.ndarray] = {}
        with self._vectors_lock:
            for text in texts:
                if text in self._vectors:
                    self._vectors.move_to_end(text)  # least recently used go first
                    known[text] = self._vectors[text]
        missing = [text for text in dict.fromkeys(texts) if text not in known]
        if missing:
            fresh = dict(zip(missing, np.asarray(self.embedder.encode(missing)), strict=True))
            known.update(fresh)
            with self._vectors_lock:
                self._vectors.update(fresh)
                while len(self._vectors) > self.VECTORS_KEPT:
                    self._vectors.popitem(last=False)
        return np.stack([known[text] for text in texts])

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {**inputs, self.field: self._focus(str(inputs[self.field]), str(inputs["question"]))}

    def __deepcopy__(self, memo: dict) -> SentenceFocus:
        return self  # holds the embedding model: shared, like the retriever

    def __repr__(self) -> str:
        return f"SentenceFocus(sentences={self.sentences}, embedder={self.embedder.name!r}, field={self.field!r})"


def focus_view(
    sentences: int, embedder: Embedder | None, field: str, vectors_of: SentenceFocus | None = None
) -> SentenceFocus | None:
    """The view a config's ``JudgeView`` asks for: None (the whole text) for 0 sentences."""
    return SentenceFocus(sentences, embedder, field=field, vectors_of=vectors_of) if sentences else None
