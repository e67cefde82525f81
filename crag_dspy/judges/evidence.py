"""Lexical evidence that a text answers a question: which of the question's terms and numbers it holds.

The grader's LM reads only an excerpt of each passage (``crag_dspy.judges.view``), and a small model's
P(yes) misses passages that hold the question's specific terms outside that excerpt, or that name
another model number or year. How much of the question a passage covers is a cheap, complementary
signal; ``optimize.compile`` learns how much to trust it next to the LM's P(yes)
(:class:`~crag_dspy.judges.calibration.Calibration`), and keeps it only when it helps on val. On the default
domain's 232 val pairs, a calibration fitted on 64 train pairs with the whole-text word and number
coverage took the grader from 82.8% to 89.7% accuracy (ROC AUC 0.900 -> 0.940); the best single
sentence's coverage added ~1.3 points more; counting codes with digits ("5X") among the numbers
raised ROC AUC slightly (docs/grader.md).

Pure functions of two strings (and of :func:`~crag_dspy.strips.split_sentences`): no model, no
state, no I/O. A program's calibration names the features it weighs, so adding one here leaves
programs compiled before it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ..strips import split_sentences

__all__ = [
    "EVIDENCE_FEATURES",
    "FITTED_FEATURES",
    "content_terms",
    "digit_term_coverage",
    "evidence_features",
    "number_coverage",
    "sentence_coverage",
    "term_coverage",
    "terms_beyond_title",
]

# Letters and digits of any script ("für", "µS"), so a domain in another language still gets word
# tokens; the stop words below are English, which only dilutes coverage elsewhere (the compile keeps
# the evidence only when it helps on val).
_TOKEN = re.compile(r"[^\W_]+")
# Question words and function words: a passage holding "what" or "the" is no evidence of anything.
_STOP_WORDS = frozenset(
    """a an and any are as at be been by can could did do does for from had has have how i if in into
    is it its many may me might much must my of on one or our should than that the their them then there these
    they this those to under up us was we were what when where which while who whom whose why will
    with would you your""".split()  # noqa: SIM905 - a word list reads better as text
)


def content_terms(text: str) -> set[str]:
    """Lower-cased runs of letters and digits of ``text``, without question and function words."""
    return {token for token in _TOKEN.findall(text.lower()) if token not in _STOP_WORDS}


def _coverage(wanted: set[str], text: str) -> float:
    # A question that asks for nothing of the kind misses nothing: full coverage, not zero.
    return len(wanted & content_terms(text)) / len(wanted) if wanted else 1.0


def term_coverage(question: str, text: str) -> float:
    """The fraction of the question's content terms that ``text`` contains (1.0 if it has none)."""
    return _coverage(content_terms(question), text)


def number_coverage(question: str, text: str) -> float:
    """The fraction of the question's all-digit terms (years, quantities, "220") in ``text`` (1.0 if
    none). Kept for programs compiled before :func:`digit_term_coverage` replaced it."""
    return _coverage({term for term in content_terms(question) if term.isdigit()}, text)


def digit_term_coverage(question: str, text: str) -> float:
    """The fraction of the question's terms that hold a digit (years, quantities, and codes such as
    "5x", "ip66" or "v2") that ``text`` contains (1.0 if none).

    A product line's models often differ only in such a code ("TideLog 5" / "TideLog 5X"): a passage
    about the neighbouring model holds every other word of the question.
    """
    return _coverage({term for term in content_terms(question) if any(c.isdigit() for c in term)}, text)


def terms_beyond_title(question: str, title: str) -> set[str]:
    """The question's :func:`content_terms` that ``title`` lacks:
    what a passage's sentences must supply (a title names the entity, a sentence holds what is asked
    of it); all of them when the title holds every one, since then the sentence must repeat them."""
    wanted = content_terms(question)
    return (wanted - content_terms(title)) or wanted


def sentence_coverage(question: str, text: str) -> float:
    """The largest share of the question's terms beyond the title (:func:`terms_beyond_title`) that a
    single sentence of ``text`` holds (1.0 if the question has no content terms, 0.0 if ``text`` has no
    sentence). ``text`` is a passage as judged ("title\nbody") or a strip (no title line).

    Whole-text coverage cannot tell a passage that holds the asked-for fact from a neighbouring passage
    of the same document that repeats the entity and the topic words in different sentences; an
    answer sentence tends to hold several of the question's words at once.
    """
    title, newline, body = text.partition("\n")
    if not newline:
        title, body = "", text
    wanted = terms_beyond_title(question, title)
    if not wanted:
        return 1.0
    sentences = split_sentences(body)
    return max((len(wanted & content_terms(s)) / len(wanted) for s in sentences), default=0.0)


# Every feature a calibration may weigh: a program names the ones it was fitted on.
EVIDENCE_FEATURES: dict[str, Callable[[str, str], float]] = {
    "term_coverage": term_coverage,
    "number_coverage": number_coverage,
    "digit_term_coverage": digit_term_coverage,
    "sentence_coverage": sentence_coverage,
}

# What a calibration is fitted on now. digit_term_coverage replaced number_coverage, which it extends
# to codes such as "5x" (on the default domain's val split both judges' ROC AUC rose by 0.001-0.004,
# accuracy moved within a fit's noise; docs/grader.md); number_coverage stays in EVIDENCE_FEATURES
# so that older programs score as they did.
FITTED_FEATURES: tuple[str, ...] = ("term_coverage", "digit_term_coverage", "sentence_coverage")


def evidence_features(question: str, text: str, names: Iterable[str] = FITTED_FEATURES) -> dict[str, float]:
    """The features of :data:`EVIDENCE_FEATURES` called ``names`` (by default the fitted ones), by name."""
    return {name: EVIDENCE_FEATURES[name](question, text) for name in names}
