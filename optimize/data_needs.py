"""What labelled data each compile stage needs, checked before any LM call.

A compile of a domain that lacks the data a stage learns or measures from would start the model,
"compile" on nothing and fail, or ship an untested program. :func:`shortfalls` lists what is missing
for the stages asked, and :func:`guidance` says it in one message with the ways out: write or derive
the data, or compile only the stages the data supports.

>>> from crag_dspy.domain import CorpusDoc, Domain, DomainConfig
>>> docs_only = Domain(Path("pump"), DomainConfig(name="pump"), [CorpusDoc(id="a", title="A", text="x")])
>>> [s.what for s in shortfalls(docs_only, ("grader",), thresholds=True, test=False)]
['relevance.jsonl train pairs', 'relevance.jsonl val pairs', 'qa.jsonl val questions']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crag_dspy.domain import Domain

from .datasets import strip_examples

__all__ = [
    "MIN_JUDGE_PAIRS",
    "MIN_QA_QUESTIONS",
    "Shortfall",
    "guidance",
    "shortfalls",
    "synthetic_grader_warning",
]

MIN_JUDGE_PAIRS = 2
"""Labelled pairs per split a judge stage needs, with both labels among them: a judge is taught and
measured on examples of each answer, and accuracy or ROC AUC on one class says nothing."""
MIN_QA_QUESTIONS = 1
"""QA questions per split a stage that routes or answers needs (thresholds, retries, demos, the test
comparison). One is what makes a stage run, not what makes its result mean much: with fewer than
six val questions no tuned thresholds can beat the defaults beyond noise, so the defaults ship."""


@dataclass(frozen=True)
class Shortfall:
    """One kind of data a stage needs: ``what`` (file and split), how many there are and are needed."""

    what: str
    stages: tuple[str, ...]
    have: int
    need: int
    detail: str = ""

    def __str__(self) -> str:
        why = f" ({self.detail})" if self.detail else ""
        return f"{self.what}: {self.have} of at least {self.need}{why}, for {', '.join(self.stages)}"


def _labelled(what: str, stage: str, labels: Sequence[bool]) -> Shortfall | None:
    positives = sum(labels)
    if len(labels) >= MIN_JUDGE_PAIRS and 0 < positives < len(labels):
        return None
    detail = (
        "" if not labels else f"{positives} positive, {len(labels) - positives} negative: both are needed"
    )
    return Shortfall(what, (stage,), len(labels), MIN_JUDGE_PAIRS, detail)


def shortfalls(
    domain: Domain,
    stages: Sequence[str],
    *,
    thresholds: bool,
    test: bool,
    sentences_per_strip: int = 3,
) -> list[Shortfall]:
    """What ``domain`` lacks for the compile ``stages`` (and threshold tuning, the test comparison)."""
    found: list[Shortfall | None] = []
    if "grader" in stages:
        for split in ("train", "val"):
            labels = [bool(p.label) for p in domain.relevance if p.split == split]
            found.append(_labelled(f"relevance.jsonl {split} pairs", "grader", labels))
    if "strips" in stages:
        for split in ("train", "val"):
            labels = [bool(e.keep) for e in strip_examples(domain, split, sentences_per_strip)]
            found.append(
                _labelled(f"strip examples ({split}, derived from relevance.jsonl)", "strips", labels)
            )
    needs_qa = {
        "train": [s for s in ("rewriter", "answerer") if s in stages],
        "val": (["thresholds"] if thresholds else []) + (["retry"] if "retry" in stages else []),
        "test": ["the test comparison"] if test else [],
    }
    for split, users in needs_qa.items():
        have = sum(q.split == split for q in domain.qa)
        if users and have < MIN_QA_QUESTIONS:
            found.append(Shortfall(f"qa.jsonl {split} questions", tuple(users), have, MIN_QA_QUESTIONS))
    return [s for s in found if s is not None]


def guidance(root: Path, missing: Sequence[Shortfall]) -> str:
    """One message: what ``missing`` is, and the ways to make or avoid it."""
    lines = "\n".join(f"  - {s}" for s in missing)
    return (
        f"{root}: not enough labelled data to compile:\n{lines}\n"
        f"Make it from the domain's documents: crag-dspy synthesize --domain-dir {root} "
        "--accept-all (or review the candidates first; docs/synthesize.md). Or write it in the domain "
        "format (docs/configuration.md, Domain data format): qa.jsonl questions with gold answers and a "
        "split, relevance.jsonl (question, passage, label) pairs; questions with evidence quotes give "
        f"pairs with: python -m optimize.relevance_pairs --domain-dir {root}. Or compile only what the "
        "data supports, e.g. --stages grader --no-thresholds --no-test-eval."
    )


def synthetic_grader_warning(domain: Domain, stages: Sequence[str]) -> str | None:
    """A warning when the grader would be compiled on synthetic relevance pairs only, else None.

    Measured on both bundled domains (BENCHMARKS.md, "Synthetic labels against real ones"): compiled
    on 200 synthesized questions' pairs, the grader did worse than the uncompiled one on popqa-dev's
    real val pairs and recovered most of the real labels' gain on the default domain's, so a user
    should know before shipping it.
    """
    pairs = [p for p in domain.relevance if p.split in ("train", "val")]
    if "grader" not in stages or not pairs or any(p.source != "synthetic" for p in pairs):
        return None
    return (
        f"{domain.root}: every relevance pair is synthetic. Compiled on synthetic pairs, the grader scored "
        "below the uncompiled one on real labels on popqa-dev (above it on default); see BENCHMARKS.md, "
        '"Synthetic labels against real ones". Review the pairs (synthetic/review.csv), add hand-labelled '
        "ones, or leave the grader out of --stages."
    )
