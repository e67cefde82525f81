"""Pure metric functions: binary classification quality, normalized gold-alias answer matching, and the
truthfulness scoring of Meta's CRAG benchmark (right +1, "I don't know" 0, wrong -1) with its tests."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "UNKNOWN_ALIASES",
    "BinaryReport",
    "SignTest",
    "answer_matches",
    "beats_beyond_noise",
    "binary_report",
    "bootstrap_auc_interval",
    "bootstrap_mean_interval",
    "bootstrap_ratio_interval",
    "cites_evidence",
    "contains_answer",
    "counted",
    "is_abstention",
    "is_answerable",
    "mcnemar_exact",
    "normalize_answer",
    "roc_auc",
    "sign_test",
    "truthfulness_score",
    "truthfulness_summary",
    "wilson_interval",
]

UNKNOWN_ALIASES = ("i don't know", "i do not know")


@dataclass(frozen=True)
class BinaryReport:
    n: int
    accuracy: float
    precision: float
    recall: float
    f1: float
    roc_auc: float | None
    unknown: int  # items without a score (the LM failed); counted as wrong in accuracy

    def as_dict(self) -> dict:
        return asdict(self)


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Probability that a random positive outscores a random negative (ties count half); None if undefined."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def binary_report(
    scores: Sequence[float | None], labels: Sequence[int], threshold: float = 0.5
) -> BinaryReport:
    """Accuracy, precision, recall, F1 at ``threshold`` and ROC AUC; a None score is a wrong prediction."""
    if len(scores) != len(labels):
        raise ValueError("scores and labels differ in length")
    tp = fp = fn = correct = 0
    for score, label in zip(scores, labels):
        predicted = None if score is None else int(score >= threshold)
        correct += predicted == label
        tp += predicted == 1 and label == 1
        fp += predicted == 1 and label == 0
        fn += predicted != 1 and label == 1
    n = len(labels)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    known = [(s, y) for s, y in zip(scores, labels) if s is not None]
    auc = roc_auc([s for s, _ in known], [y for _, y in known])
    return BinaryReport(
        n, correct / n if n else 0.0, precision, recall, f1, auc, sum(s is None for s in scores)
    )


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation if c not in "%"})


def normalize_answer(text: str) -> str:
    """SQuAD-style normalization: NFKC, lower case, digits' thousands separators dropped, punctuation and
    articles removed, whitespace collapsed ("1,240 Velds." -> "1240 velds")."""
    # Before NFKC, which turns the (narrow) no-break spaces used as thousands separators into spaces.
    text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", text)
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


_UNKNOWN = frozenset(normalize_answer(u) for u in UNKNOWN_ALIASES)


def _real_aliases(aliases: Sequence[str]) -> list[str]:
    """Normalized gold aliases, without empty ones and the unanswerable marker."""
    return [g for g in (normalize_answer(a) for a in aliases) if g and g not in _UNKNOWN]


def is_answerable(aliases: Sequence[str]) -> bool:
    """False for a question whose only gold answer is the unanswerable marker ("I don't know")."""
    return bool(_real_aliases(aliases))


def contains_answer(text: str | None, aliases: Sequence[str]) -> bool:
    """True when a real gold alias (not "I don't know") occurs in ``text`` as whole words, both
    normalized with :func:`normalize_answer`; e.g. whether a retrieved passage holds the answer."""
    padded = f" {normalize_answer(text or '')} "
    return any(f" {gold} " in padded for gold in _real_aliases(aliases))


def is_abstention(prediction: str | None) -> bool:
    """True when the answer abstains: "I don't know" / "I do not know" occurs in it as whole words after
    normalization, even hedged ("I don't know, maybe 90 days"). No answer at all (None, "": a failed
    question) is no abstention: nothing was said, so it is simply wrong."""
    if not prediction:
        return False
    pred = f" {normalize_answer(prediction)} "
    return any(f" {u} " in pred for u in _UNKNOWN)


def answer_matches(prediction: str | None, aliases: Sequence[str]) -> bool:
    """True when any normalized gold alias occurs in the normalized prediction as whole words
    (the paper's PopQA rule: a gold answer string appears in the generation).

    Unanswerable questions carry the alias "I don't know": they match only an abstaining answer, and an
    abstaining answer never matches a real alias.
    """
    if not prediction:
        return False
    if is_abstention(prediction):  # an abstention, even a hedged one, is not an answer
        return any(normalize_answer(a) in _UNKNOWN for a in aliases)
    return contains_answer(prediction, aliases)


def truthfulness_score(correct: bool, abstained: bool) -> int:
    """One question's score in Meta's CRAG benchmark (perfect +1, missing 0, incorrect -1): +1 when the
    answer is right (an unanswerable question answered "I don't know" is right), 0 when it abstains
    otherwise (an answerable question answered "I don't know"), -1 when it is wrong (an answer that is
    not an abstention, or none at all because the question failed)."""
    if correct:
        return 1
    return 0 if abstained else -1


def counted(n: int, total: int) -> dict[str, Any]:
    """``n`` of ``total`` as a share with its 95% Wilson interval (rate None when there is nothing)."""
    return {
        "n": n,
        "of": total,
        "rate": n / total if total else None,
        "interval": list(wilson_interval(n, total)),
    }


def truthfulness_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a run's question rows say about truthfulness; each row has ``correct``, ``abstained``,
    ``answerable`` and ``score`` (:func:`truthfulness_score`).

    ``abstained``: answers that are "I don't know"; ``hallucination``: rows scoring -1 (wrong answers
    that are not abstentions, failed questions included: the user got no abstention), so truthfulness
    = accuracy - hallucination rate; both with 95% Wilson intervals. ``truthfulness``: the mean score
    with a 95% percentile bootstrap interval over the questions (seed 0: the same rows always give the
    same interval). ``answerable_right``, ``answerable_abstained`` and ``unanswerable_abstained`` (right,
    for those) break the questions down."""
    scores = [r["score"] for r in rows]
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    interval = bootstrap_mean_interval(scores)
    return {
        "abstained": counted(sum(bool(r["abstained"]) for r in rows), len(rows)),
        "hallucination": counted(sum(r["score"] < 0 for r in rows), len(rows)),
        "truthfulness": {
            "mean": sum(scores) / len(scores) if scores else None,
            "interval": list(interval) if interval else None,
        },
        "answerable_right": counted(sum(bool(r["correct"]) for r in answerable), len(answerable)),
        "answerable_abstained": counted(sum(bool(r["abstained"]) for r in answerable), len(answerable)),
        "unanswerable_abstained": counted(sum(bool(r["abstained"]) for r in unanswerable), len(unanswerable)),
    }


def _field(item: Any, key: str) -> Any:
    """``key`` of a mapping (a JSON row) or attribute of an object (a ``Citation``); None if absent."""
    return item.get(key) if isinstance(item, Mapping) else getattr(item, key, None)


def cites_evidence(citations: Sequence[Any], evidence: Sequence[Any]) -> bool:
    """Whether some citation names a gold evidence document: the same ``doc_id`` and, when that evidence
    gives a ``page``, the same page (evidence without a page accepts any page of its document).
    Citations and evidence are mappings or objects with ``doc_id`` and ``page``."""
    for gold in evidence:
        doc, page = _field(gold, "doc_id"), _field(gold, "page")
        if doc is None:  # evidence that names no document can be cited by none
            continue
        for cited in citations:
            if _field(cited, "doc_id") == doc and (page is None or _same_page(_field(cited, "page"), page)):
                return True
    return False


def _same_page(cited: Any, gold: Any) -> bool:
    # Hand-written evidence files may spell a page "3" where a citation carries 3: the same page.
    return cited is not None and str(cited).strip() == str(gold).strip()


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (scipy's); (0, 1) for n == 0."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def bootstrap_auc_interval(
    scores: Sequence[float | None],
    labels: Sequence[int],
    groups: Sequence[str],
    *,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of ROC AUC, resampling whole ``groups`` (questions): pairs of
    one question are not independent. Unknown scores are left out. None when AUC is undefined."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    known = [(s, y, g) for s, y, g in zip(scores, labels, groups, strict=True) if s is not None]
    if len({y for _, y, _ in known}) < 2:
        return None
    by_group: dict[str, list[int]] = {}
    for i, (_, _, g) in enumerate(known):
        by_group.setdefault(g, []).append(i)
    members = list(by_group.values())
    s = np.array([x for x, _, _ in known], dtype=float)
    y = np.array([v for _, v, _ in known], dtype=int)
    rng = np.random.default_rng(seed)
    aucs = []
    for _ in range(resamples):
        idx = np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))])
        if 0 < y[idx].sum() < len(idx):
            aucs.append(roc_auc_score(y[idx], s[idx]))
    alpha = (1 - confidence) / 2
    return float(np.quantile(aucs, alpha)), float(np.quantile(aucs, 1 - alpha))


def bootstrap_mean_interval(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of ``mean(values)``, resampling the items (questions) with a
    fixed ``seed``, so that one run's table always prints the same interval. None for no items; the
    value itself when every item has the same one (nothing varies to resample: a small sample of equal
    scores gets a zero-width interval, so read it next to n and the Wilson intervals). Chosen over a
    t-interval because the percentile interval stays inside the values' range (truthfulness scores are
    -1, 0 or +1), where a t-interval of a short, skewed sample crosses it."""
    import numpy as np

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, (resamples, data.size))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def bootstrap_ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A paired percentile bootstrap interval (scipy's) of ``mean(numerator) / mean(denominator)``, the
    two measured on the same items (e.g. CRAG's and plain RAG's seconds per question): items are
    resampled whole, so what varies from question to question varies in both. None for fewer than two
    items; the ratio itself when every item gives the same one."""
    import numpy as np
    from scipy.stats import bootstrap

    top = np.asarray(numerator, dtype=float)
    bottom = np.asarray(denominator, dtype=float)
    if top.shape != bottom.shape:
        raise ValueError(f"paired values differ in length: {top.size} and {bottom.size}")
    if top.size < 2 or bottom.sum() <= 0:
        return None
    if np.allclose(top * bottom.sum(), bottom * top.sum()):  # one ratio throughout: nothing to resample
        ratio = float(top.sum() / bottom.sum())
        return ratio, ratio
    result = bootstrap(
        (top, bottom),
        lambda a, b, axis=-1: np.mean(a, axis=axis) / np.mean(b, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> float:
    """Exact (binomial) McNemar p-value, two-sided, for two systems' right/wrong on the same questions:
    only the questions one got right and the other wrong count. 1.0 when there are none."""
    from scipy.stats import binomtest

    if len(first) != len(second):
        raise ValueError(f"paired outcomes differ in length: {len(first)} and {len(second)}")
    only_first = sum(bool(a) and not bool(b) for a, b in zip(first, second))
    only_second = sum(bool(b) and not bool(a) for a, b in zip(first, second))
    if only_first + only_second == 0:
        return 1.0
    return float(binomtest(only_first, only_first + only_second, 0.5).pvalue)


def beats_beyond_noise(
    candidate: Sequence[bool], reference: Sequence[bool], alpha: float = 0.05
) -> tuple[bool, float]:
    """Whether ``candidate`` answers more questions right than ``reference`` (paired, the same
    questions) with an exact McNemar p below ``alpha``; and that p. The rule tuned thresholds and
    internal retries ship by: a gain a coin could have produced ships nothing. (Judges ship by val
    accuracy, never below the uncompiled one: on the compile's 80-pair sample this test misses
    calibrations that beat the uncompiled judge on every val pair; docs/experiments.md.)"""
    p = mcnemar_exact(candidate, reference)
    return (p < alpha and sum(map(bool, candidate)) > sum(map(bool, reference))), p


@dataclass(frozen=True)
class SignTest:
    """A paired sign test of two systems' per-question scores: ``wins`` where the first scored higher,
    ``losses`` where the second did, ``ties`` left out; ``p_value`` two-sided (1.0 without wins or
    losses)."""

    wins: int
    losses: int
    ties: int
    p_value: float

    def as_dict(self) -> dict:
        return asdict(self)


def sign_test(first_scores: Sequence[float], second_scores: Sequence[float]) -> SignTest:
    """Two-sided sign test (exact binomial, scipy's ``binomtest`` at 0.5) of paired per-question scores,
    e.g. truthfulness (+1/0/-1) of two systems on the same questions. Only the questions where the two
    differ count, by direction, not size: a right answer against a wrong one (+1 vs -1) weighs what a
    right answer against an abstention does, as McNemar does for right/wrong."""
    from scipy.stats import binomtest

    if len(first_scores) != len(second_scores):
        raise ValueError(f"paired scores differ in length: {len(first_scores)} and {len(second_scores)}")
    wins = sum(a > b for a, b in zip(first_scores, second_scores))
    losses = sum(a < b for a, b in zip(first_scores, second_scores))
    ties = len(first_scores) - wins - losses
    p = float(binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return SignTest(wins, losses, ties, p)
