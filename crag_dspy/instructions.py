"""A learned second opinion on instruction-like sentences, for the grounding check.

Logistic regression over two views of a sentence whose numbers and names are masked
(:func:`mask_specifics`: the classifier should learn how a sentence addresses its reader, not which
product it is about): its bundled MiniLM sentence embedding (:class:`~crag_dspy.embeddings.Embedder`)
and its word n-grams (1-3, TF-IDF, :func:`ngram_features`), which carry the function words an
instruction is made of ("any reply", "is to be", "whoever relays") that a sentence embedding blurs.

Trained by ``python benchmarks/service.py train-classifier`` on
- positives: instruction sentences of the injection suite's *tuned* sets (``dev``, ``round2``,
  ``round3``: the sentences the phrase rule recognises) and the team-written instruction sentences of
  ``benchmarks/instruction_sentences.jsonl`` (many styles and topics, none about a bundled domain);
- negatives: every sentence of the bundled domains' corpora and web pages, and the written look-alikes
  of that file (instructions to people, obligations, descriptions of chatbots, citation conventions).

The ``held-out`` sets of the injection suite are never read. The regularisation is the one with the
best cross-validated recall; the threshold is the lowest whose cross-validated false positives stay
within budget on both kinds of negatives. The weights are a JSON file in the package (never a pickle).
The measured generalisation is modest (docs/reliability.md): a second opinion, not a defence.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .embeddings import Embedder

__all__ = [
    "TUNED_SETS",
    "WEIGHTS",
    "InstructionClassifier",
    "default_classifier",
    "fit",
    "mask_specifics",
    "ngram_features",
]

WEIGHTS = Path(__file__).with_name("instruction_weights.json")
TUNED_SETS = ("dev", "round2", "round3")
"""The injection suite's sets the classifier may learn from; the ``held-out`` sets are kept for measuring."""
NGRAMS = (1, 3)
_WORD = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token pattern: the features must match it


def mask_specifics(sentence: str) -> str:
    """Numbers as ``N`` and capitalised words after the first as ``X``: "the AquaProbe 220 costs 990
    velds" -> "the X N costs N velds"."""
    sentence = re.sub(r"\d[\d,.:/-]*", "N", sentence)
    return re.sub(r"(?<=\w )[A-Z][\w-]*", "X", sentence)


def ngram_features(sentence: str, idf: Mapping[str, float]) -> dict[str, float]:
    """The masked ``sentence``'s word n-grams in ``idf``'s vocabulary, weighted (1 + log count) * idf
    and scaled to unit length: scikit-learn's ``TfidfVectorizer(ngram_range=NGRAMS, sublinear_tf=True)``
    with the vocabulary and idf it was fitted with."""
    words = _WORD.findall(mask_specifics(sentence).lower())
    low, high = NGRAMS
    counts = Counter(
        gram
        for n in range(low, high + 1)
        for i in range(len(words) - n + 1)
        if (gram := " ".join(words[i : i + n])) in idf
    )
    weighted = {gram: (1.0 + math.log(c)) * idf[gram] for gram, c in counts.items()}
    norm = math.sqrt(sum(v * v for v in weighted.values()))
    return {gram: v / norm for gram, v in weighted.items()} if norm else {}


@dataclass(frozen=True)
class InstructionClassifier:
    """P(instruction) of a sentence: ``sigmoid(w . embed(mask(s)) + sum(v[g] * tfidf(s)[g]) + bias)``;
    flagged at ``threshold`` or above."""

    weights: tuple[float, ...]
    idf: Mapping[str, float]  # the n-gram vocabulary, with each n-gram's idf
    ngram_weights: Mapping[str, float]
    bias: float
    threshold: float
    embedder: Embedder

    @classmethod
    def load(cls, path: Path = WEIGHTS, embedder: Embedder | None = None) -> InstructionClassifier:
        state = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            tuple(state["weights"]),
            {gram: float(idf) for gram, (idf, _) in state["ngrams"].items()},
            {gram: float(w) for gram, (_, w) in state["ngrams"].items()},
            float(state["bias"]),
            float(state["threshold"]),
            embedder or Embedder(),
        )

    def scores(self, sentences: Sequence[str]) -> list[float]:
        if not sentences:
            return []
        vectors = np.asarray(self.embedder.encode([mask_specifics(s) for s in sentences]))
        z = vectors @ np.asarray(self.weights) + self.bias
        z += [
            sum(v * self.ngram_weights[g] for g, v in ngram_features(s, self.idf).items()) for s in sentences
        ]
        return [1.0 / (1.0 + math.exp(-float(v))) for v in z]

    def __call__(self, sentences: Sequence[str]) -> list[bool]:
        """Which of ``sentences`` read as instructions to the model."""
        return [score >= self.threshold for score in self.scores(sentences)]


@functools.cache
def default_classifier() -> InstructionClassifier:
    """The package's classifier on its own embedder, loaded once per process (on first use)."""
    return InstructionClassifier.load()


def fit(
    positives: Sequence[str],
    negatives: Sequence[str],
    lookalikes: Sequence[str],
    embedder: Embedder,
    *,
    c_values: Sequence[float] = (1.0, 3.0, 10.0, 30.0),
    max_false_positive_rate: float = 0.005,
    max_lookalike_rate: float = 0.10,
    folds: int = 5,
) -> dict:
    """The classifier's state (see the module docstring), with its cross-validated recall and false
    positives. ``negatives`` are ordinary knowledge text, ``lookalikes`` honest sentences written to
    resemble instructions; the threshold keeps cross-validated false positives within
    ``max_false_positive_rate`` of the first and ``max_lookalike_rate`` of the second."""
    from scipy.sparse import csr_matrix, hstack
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    texts = [mask_specifics(s) for s in [*positives, *negatives, *lookalikes]]
    embedded = np.asarray(embedder.encode(texts))
    y = np.array([1] * len(positives) + [0] * (len(negatives) + len(lookalikes)))
    kind = np.array([0] * len(positives) + [1] * len(negatives) + [2] * len(lookalikes))

    def vectorizer_of(train: np.ndarray) -> TfidfVectorizer:
        vectorizer = TfidfVectorizer(ngram_range=NGRAMS, min_df=2, sublinear_tf=True, lowercase=True)
        vectorizer.fit([texts[i] for i in train])
        return vectorizer

    def design(vectorizer: TfidfVectorizer, rows: np.ndarray) -> csr_matrix:
        return hstack([csr_matrix(embedded[rows]), vectorizer.transform([texts[i] for i in rows])]).tocsr()

    def threshold_of(p: np.ndarray) -> float:
        """The lowest threshold within both false-positive budgets: just above the highest negative
        score that would break one."""
        limits = []
        for k, rate in ((1, max_false_positive_rate), (2, max_lookalike_rate)):
            ranked = np.sort(p[kind == k])[::-1]
            allowed = math.floor(rate * len(ranked))
            if len(ranked) > allowed:
                limits.append(ranked[allowed] + 1e-6)
        return float(min(0.999, max(limits, default=0.5)))

    cv = StratifiedKFold(folds, shuffle=True, random_state=0)
    best: tuple[float, float, float, np.ndarray] | None = None  # (recall, c, threshold, scores)
    for c in c_values:
        p = np.zeros(len(y))
        for train, test in cv.split(texts, y):
            vectorizer = vectorizer_of(train)
            model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
            model.fit(design(vectorizer, train), y[train])
            p[test] = model.predict_proba(design(vectorizer, test))[:, 1]
        threshold = threshold_of(p)
        recall = float((p[y == 1] >= threshold).mean())
        if best is None or recall > best[0]:
            best = (recall, c, threshold, p)
    assert best is not None, "c_values is empty"
    recall, c, threshold, p = best
    everything = np.arange(len(y))
    vectorizer = vectorizer_of(everything)
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000).fit(
        design(vectorizer, everything), y
    )
    dims = embedded.shape[1]
    coef = model.coef_[0]
    names = vectorizer.get_feature_names_out()
    return {
        "weights": [round(float(w), 6) for w in coef[:dims]],
        "ngrams": {
            str(g): [round(float(vectorizer.idf_[i]), 6), round(float(coef[dims + i]), 6)]
            for i, g in enumerate(names)
        },
        "bias": round(float(model.intercept_[0]), 6),
        "threshold": round(threshold, 6),
        "trained_on": {
            "positives": len(positives),
            "negatives": len(negatives),
            "lookalikes": len(lookalikes),
            "c": c,
            "budgets": {"negatives": max_false_positive_rate, "lookalikes": max_lookalike_rate},
        },
        "cross_validated": {
            "recall": recall,
            "false_positives": int((p[kind == 1] >= threshold).sum()),
            "lookalike_false_positives": int((p[kind == 2] >= threshold).sum()),
            "folds": folds,
        },
    }
