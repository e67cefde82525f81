"""What the grader reads of a passage: its title and the sentences most similar to the question.

Grading every retrieved passage with the LM reads as many prompt tokens as plain RAG's whole answer,
so on a CPU grading alone cost about what plain RAG does (BENCHMARKS.md). Most of a passage is not
about what the question asks, and the sentence that is tends to be the one the bundled sentence
embeddings rank first. On the default domain's 232 val relevance pairs the embedded 1.5B model ranked
passages better from the title and the single most similar sentence (ROC AUC 0.900) than from the
whole passage (0.889), at 1.07 instead of 1.96 s per pair; on some subsets it ranks worse
(docs/grader.md). The paper's evaluator also reads a bounded input (512 tokens).

Similarity alone often picks the wrong sentence: the title names the entity, and MiniLM ranks a
sentence that repeats the entity ("Expedited jobs must be booked ... Dunmore accepts 25 expedited
units") above the one holding what is asked ("... for a surcharge of 180 velds per unit"). So a
sentence's rank also counts the share of the question's content words, those the title lacks, that it
holds (``term_weight``). Measured with no LM (``benchmarks/excerpt_recall.py``: does the excerpt of a
positive passage still hold the gold answer?), weight 0 -> 1: default domain train 93.8% -> 96.9%,
val 87.6% -> 92.9%; transit domain train 82.6% -> 93.5%, val 78.1% -> 96.9% (docs/grader.md).

Words are compared by their stems (``term_stems``): questions and passages word the same thing
differently ("Who chairs" / "The chair of", "take effect" / "effective"); on the default domain's val
split the excerpt then holds the answer in 108 of 113 positive passages instead of 105.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .embeddings import Embedder
from .evidence import content_terms, stemmed_terms, terms_beyond_title
from .strips import split_sentences

__all__ = [
    "DEFAULT_TERM_WEIGHT",
    "SentenceFocus",
    "check_grade_sentences",
    "check_term_stems",
    "check_term_weight",
    "focus_document",
    "ranked_excerpt",
    "ranked_sentences",
    "sentence_scores",
    "top_sentences",
]

DEFAULT_TERM_WEIGHT = 1.0
"""Weight of the question's words against embedding similarity when choosing sentences (see above)."""


def check_grade_sentences(sentences: object) -> int:
    """Return ``sentences`` if it is a valid ``grade_sentences`` (an integer >= 0; 0 = whole passages),
    else raise ValueError."""
    if not isinstance(sentences, int) or isinstance(sentences, bool) or sentences < 0:
        raise ValueError(f"grade_sentences must be an integer >= 0, got {sentences!r}")
    return sentences


def check_term_weight(weight: object) -> float:
    """Return ``weight`` as a float if it is a valid ``term_weight`` (a finite number >= 0), else raise
    ValueError."""
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight < 0
    ):
        raise ValueError(f"term_weight must be a finite number >= 0, got {weight!r}")
    return float(weight)


def check_term_stems(term_stems: object) -> bool:
    """Return ``term_stems`` if it is a valid ``term_stems`` (true or false), else raise ValueError."""
    if not isinstance(term_stems, bool):
        raise ValueError(f"term_stems must be true or false, got {term_stems!r}")
    return term_stems


def sentence_scores(
    question: str,
    title: str,
    sentences: Sequence[str],
    similarities: Sequence[float],
    term_weight: float,
    term_stems: bool = True,
) -> list[float]:
    """Each sentence's similarity to the question plus ``term_weight`` times the share of the question's
    content words missing from ``title`` that the sentence holds (all of them when the title holds every
    one: then the sentence must repeat them); words are compared by their stems if ``term_stems``."""
    terms = stemmed_terms if term_stems else content_terms
    wanted = terms_beyond_title(question, title, terms)
    if not wanted or not term_weight:
        return [float(similarity) for similarity in similarities]
    return [
        float(similarity) + term_weight * len(wanted & terms(sentence)) / len(wanted)
        for sentence, similarity in zip(sentences, similarities, strict=True)
    ]


def ranked_sentences(scores: Sequence[float]) -> list[int]:
    """Indices of sentences from the best-scoring (:func:`sentence_scores`) to the worst; equal scores:
    earlier first."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def top_sentences(scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` best-scoring sentences (:func:`sentence_scores`), in reading order (equal
    scores: earlier first)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return sorted(ranked_sentences(scores)[:n])


def _title_and_sentences(document: str) -> tuple[str, list[str]]:
    title, newline, text = document.partition("\n")
    if not newline:  # no title line: all of it is text
        title, text = "", document
    return title, split_sentences(text)


def _scores(
    question: str,
    title: str,
    sentences: list[str],
    embed: Callable[[list[str]], Any],
    term_weight: float,
    term_stems: bool,
) -> list[float]:
    vectors = np.asarray(embed([question, *sentences]))
    similarities = (vectors[1:] @ vectors[0]).tolist()
    return sentence_scores(question, title, sentences, similarities, term_weight, term_stems)


def _titled(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def focus_document(
    document: str,
    question: str,
    embed: Callable[[list[str]], Any],
    n: int,
    term_weight: float = DEFAULT_TERM_WEIGHT,
    term_stems: bool = True,
) -> str:
    """``document`` (a title line, then the text) cut to its title line and the ``n`` sentences of its text
    that best match ``question`` (:func:`sentence_scores`); a text of at most ``n`` sentences is returned
    unchanged (no embedding).

    ``embed`` maps a list of texts to unit vectors, so cosine similarity is a dot product.
    """
    title, sentences = _title_and_sentences(document)
    if len(sentences) <= n:
        return document
    scores = _scores(question, title, sentences, embed, term_weight, term_stems)
    return _titled(title, " ".join(sentences[i] for i in top_sentences(scores, n)))


def ranked_excerpt(
    document: str,
    question: str,
    embed: Callable[[list[str]], Any],
    rank: int,
    term_weight: float = DEFAULT_TERM_WEIGHT,
    term_stems: bool = True,
) -> str | None:
    """``document`` cut to its title line and the sentence of its text ranked ``rank`` (0 = the best,
    what :func:`focus_document` keeps for ``n=1``) by :func:`sentence_scores`; None when the text has
    no sentence of that rank. ``embed`` as for :func:`focus_document`."""
    title, sentences = _title_and_sentences(document)
    if len(sentences) <= rank:
        return None
    scores = _scores(question, title, sentences, embed, term_weight, term_stems)
    return _titled(title, sentences[ranked_sentences(scores)[rank]])


class SentenceFocus:
    """A judge input view: ``document`` becomes its title and the ``sentences`` sentences that best match
    ``question`` (bundled MiniLM embeddings plus the question's words weighted by ``term_weight``,
    compared by their stems if ``term_stems``; ~40 ms per new passage on 2 CPU cores, next to ~1 s for
    the LM's judgement).

    Infrastructure, not learned state: it is shared by copies of the judge, never saved in a program's
    state (the program's config records ``grade_sentences``, ``grade_term_weight`` and
    ``grade_term_stems`` instead).
    """

    VECTORS_KEPT = 16384
    """Sentence and question vectors kept (384 floats each: ~50 MB at most)."""

    def __init__(
        self,
        sentences: int,
        embedder: Embedder | None = None,
        term_weight: float = DEFAULT_TERM_WEIGHT,
        term_stems: bool = True,
    ):
        if sentences < 1:
            raise ValueError(f"sentences must be >= 1, got {sentences}")
        self.sentences = sentences
        self.term_weight = check_term_weight(term_weight)
        self.term_stems = check_term_stems(term_stems)
        self.embedder = embedder if embedder is not None else Embedder()
        # The same passage is focused for the same question again by the compile's cached re-runs and by
        # shared-work keys; embedding it again would cost more than the lookup.
        self._focus = functools.lru_cache(maxsize=4096)(self._compute)
        # Without these a question was embedded again for each passage it is graded against, and a passage's
        # sentences again for each question; a warm default recompile took 32 s, 22 s with them.
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._vectors_lock = threading.Lock()

    @property
    def key(self) -> str:
        """Identifies what the view shows, for caches of judgements."""
        stems = ":stems" if self.term_stems else ""
        return f"focus:{self.sentences}:{self.embedder.name}:terms={self.term_weight:g}{stems}"

    def _compute(self, document: str, question: str) -> str:
        return focus_document(
            document, question, self._embed, self.sentences, self.term_weight, self.term_stems
        )

    def ranked_excerpt(self, document: str, question: str, rank: int) -> str | None:
        """:func:`ranked_excerpt` with this view's embeddings (vectors shared with the focus)."""
        return ranked_excerpt(document, question, self._embed, rank, self.term_weight, self.term_stems)

    def _embed(self, texts: list[str]) -> np.ndarray:
        """``texts``' unit vectors, each text embedded once per view (at most ``VECTORS_KEPT`` kept)."""
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
        return {**inputs, "document": self._focus(str(inputs["document"]), str(inputs["question"]))}

    def __deepcopy__(self, memo: dict) -> SentenceFocus:
        return self  # holds the embedding model: shared, like the retriever

    def __repr__(self) -> str:
        return (
            f"SentenceFocus(sentences={self.sentences}, embedder={self.embedder.name!r}, "
            f"term_weight={self.term_weight:g}, term_stems={self.term_stems})"
        )
