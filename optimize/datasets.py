"""Turn a domain's labelled data into DSPy example sets for each compilable stage."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import zip_longest
from typing import TypeVar

import dspy

from crag_dspy.domain import Domain, QAPair, RelevancePair, load_jsonl
from crag_dspy.strips import decompose

from .metrics import normalize_answer

T = TypeVar("T")

__all__ = [
    "answers_by_question",
    "interleave_balanced",
    "qa_examples",
    "qa_split",
    "relevance_examples",
    "round_robin",
    "spread",
    "strip_examples",
    "strip_examples_from",
]


def interleave_balanced(examples: Sequence[dspy.Example], label: str, seed: int) -> list[dspy.Example]:
    """Seeded shuffle, then alternate positives and negatives, so that the first n examples (what
    LabeledFewShot(sample=False) and BootstrapFewShot take as demos) are balanced."""
    rng = random.Random(seed)
    pos = [e for e in examples if e[label]]
    neg = [e for e in examples if not e[label]]
    rng.shuffle(pos)
    rng.shuffle(neg)
    out = []
    for i in range(max(len(pos), len(neg))):
        out.extend(x[i] for x in (pos, neg) if i < len(x))
    return out


def relevance_examples(pairs: Sequence[RelevancePair], split: str) -> list[dspy.Example]:
    """Grader examples: (question, document) -> relevant, with the passage exactly as the grader reads it."""
    return [
        dspy.Example(question=p.question, document=p.passage, relevant=bool(p.label)).with_inputs(
            "question", "document"
        )
        for p in pairs
        if p.split == split
    ]


def domain_questions(domain: Domain) -> list[QAPair]:
    """Every question record of the domain: qa.jsonl's, then relevance_questions.jsonl's when it exists."""
    questions: list[QAPair] = list(domain.qa)
    extra = domain.root / "relevance_questions.jsonl"
    if extra.is_file():
        questions.extend(load_jsonl(extra, QAPair))
    return questions


def answers_by_question(domain: Domain) -> dict[str, list[str]]:
    """Gold aliases for every question text known to the domain (:func:`domain_questions`)."""
    return {q.question: q.answers for q in domain_questions(domain) if q.kind != "none"}


def strip_examples(domain: Domain, split: str, sentences_per_strip: int) -> list[dspy.Example]:
    """Strip-filter examples derived from the domain's relevance pairs of ``split``
    (:func:`strip_examples_from`, with the gold aliases of :func:`answers_by_question`)."""
    pairs = [(p.question, p.passage, p.label) for p in domain.relevance if p.split == split]
    return strip_examples_from(pairs, answers_by_question(domain), sentences_per_strip)


def strip_examples_from(
    pairs: Iterable[tuple[str, str, int | bool]],
    aliases: Mapping[str, Sequence[str]],
    sentences_per_strip: int,
) -> list[dspy.Example]:
    """Strip-filter examples from (question, passage, relevant) pairs: (question, strip) -> keep.

    Every strip of a negative passage is negative. In a positive passage, a strip holding a gold alias
    of its question (``aliases``: question -> gold answers) is positive and the others negative;
    positive passages of questions without known aliases are used only when they are a single strip.
    """
    examples = []
    for question, passage, label in pairs:
        title, _, text = passage.partition("\n")
        strips = decompose(text or title, sentences_per_strip)
        gold = [normalize_answer(a) for a in aliases.get(question, [])]
        for strip in strips:
            if not label:
                keep = False
            elif gold:
                keep = any(f" {g} " in f" {normalize_answer(strip)} " for g in gold)
            elif len(strips) == 1:
                keep = True
            else:
                continue
            examples.append(
                dspy.Example(question=question, strip=strip, keep=keep).with_inputs("question", "strip")
            )
    return examples


def _groups(items: Sequence[T], key: Callable[[T], str]) -> list[list[T]]:
    """Items grouped by ``key``: groups in order of first appearance, items in their order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


def round_robin(items: Sequence[T], key: Callable[[T], str], limit: int | None = None) -> list[T]:
    """Take items one group at a time (groups in order of first appearance, items in their order).

    A ``--limit`` on a file sorted by kind would otherwise evaluate only its first kinds (e.g. only
    questions the knowledge base answers, none that need the web).
    """
    gap = object()
    out: list[T] = []
    for row in zip_longest(*_groups(items, key), fillvalue=gap):
        out.extend(item for item in row if item is not gap)
    return out[:limit]


def spread(items: Sequence[T], key: Callable[[T], str], limit: int | None = None) -> list[T]:
    """Whole groups (e.g. one question's positive and negative pairs) at evenly spaced positions of
    ``items``, in their order, until ``limit`` items.

    The first 80 of the default domain's 232 val pairs are all from the QA file's questions and none
    from the extra relevance questions; an even spread samples the whole split and keeps each
    question's pairs (and so the label balance) together.
    """
    if limit is None or limit >= len(items):
        return list(items)
    groups = _groups(items, key)
    wanted = max(1, min(len(groups), round(limit * len(groups) / len(items))))
    chosen = sorted({i * len(groups) // wanted for i in range(wanted)})
    return [item for i in chosen for item in groups[i]][:limit]


def qa_split(domain: Domain, split: str, limit: int | None = None) -> list[QAPair]:
    """The QA questions of ``split``; with ``limit``, the first ``limit`` taken evenly across kinds."""
    return round_robin([q for q in domain.qa if q.split == split], lambda q: q.kind, limit)


def qa_examples(domain: Domain, split: str, limit: int | None = None) -> list[dspy.Example]:
    return [
        dspy.Example(question=q.question, answers=q.answers, id=q.id).with_inputs("question")
        for q in qa_split(domain, split, limit)
    ]
