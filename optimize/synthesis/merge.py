"""Accepted candidates as domain records, merged into ``qa.jsonl`` and ``relevance.jsonl``.

Every record written here carries ``source: "synthetic"``. A merge rewrites only those: every line
without it (hand-written data) is kept byte for byte and in place, and the synthetic records become
exactly the accepted candidates' (a candidate a person rejected later is taken out again). A merge of
the same decisions writes the same files: a rerun adds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crag_dspy.domain import DomainDataError, QAPair, RelevancePair
from crag_dspy.strips import split_sentences

from .candidates import Candidate
from .review import write_atomically
from .rules import answer_in
from .splits import RELEVANCE_SPLITS

__all__ = ["SYNTHETIC", "MergeReport", "merge_accepted", "merge_file", "qa_record", "relevance_records"]

SYNTHETIC = "synthetic"
UNKNOWN = "I don't know"


def _quote(candidate: Candidate) -> str:
    """The passage sentence holding the answer: the evidence quote, as the bundled qa.jsonl has."""
    title, _, text = candidate.passage.partition("\n")
    sentences = split_sentences(text or title)
    return next((s for s in sentences if answer_in(candidate.answer or "", s)), text or title)


def qa_record(candidate: Candidate) -> dict:
    """The qa.jsonl record of an accepted candidate (the bundled fields, plus ``source``)."""
    answerable = candidate.kind != "none"
    record = {
        "id": candidate.id,
        "question": candidate.question,
        "answers": [candidate.answer] if answerable else [UNKNOWN],
        "split": candidate.split,
        "kind": candidate.kind,
        "evidence": [{"doc_id": candidate.doc_id, "quote": _quote(candidate)}] if answerable else [],
        "source": SYNTHETIC,
    }
    QAPair.model_validate(record)  # a record the loader would refuse is a bug here, not in the data
    return record


def relevance_records(candidate: Candidate) -> list[dict]:
    """The relevance.jsonl records of an accepted candidate: its source passage (label 1) and its
    negatives (label 0); none for the test split or an unanswerable question."""
    if candidate.kind == "none" or candidate.split not in RELEVANCE_SPLITS:
        return []
    base = {"question": candidate.question, "split": candidate.split, "question_id": candidate.id}
    records = [{**base, "passage": candidate.passage, "label": 1, "doc_id": candidate.doc_id}]
    records += [
        {**base, "passage": n.passage, "label": 0, "doc_id": n.doc_id, "negative": n.kind}
        for n in candidate.negatives
    ]
    out = [{**r, "source": SYNTHETIC} for r in records]
    for record in out:
        RelevancePair.model_validate(record)
    return out


@dataclass(frozen=True)
class MergeReport:
    """What a merge did to one file."""

    path: Path
    kept: int  # hand-written lines, untouched
    added: int
    removed: int  # synthetic records no longer accepted
    synthetic: int  # synthetic records now in the file

    def __str__(self) -> str:
        removed = f", {self.removed} removed (rejected since)" if self.removed else ""
        return (
            f"{self.path}: {self.added} synthetic added{removed}; {self.synthetic} synthetic and "
            f"{self.kept} hand-written records in all (hand-written ones untouched)"
        )


def _key(record: dict) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False)


def merge_file(path: Path, records: Sequence[dict]) -> MergeReport:
    """Make ``path`` hold its hand-written lines as they are, followed by ``records`` (the synthetic
    ones); the file is written only when that changes it."""
    if not path.is_file() and not records:
        return MergeReport(path, 0, 0, 0, 0)  # no file is made to hold nothing
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    hand: list[str] = []
    old: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DomainDataError(f"{path}:{number}: not valid JSON ({exc.msg}); nothing merged") from None
        if isinstance(record, dict) and record.get("source") == SYNTHETIC:
            old.add(_key(record))
        else:
            hand.append(line)
    new_lines = [json.dumps(r, ensure_ascii=False) for r in records]
    new = {_key(r) for r in records}
    text = "".join(f"{line}\n" for line in [*hand, *new_lines])
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_atomically(path, text)
    return MergeReport(path, len(hand), len(new - old), len(old - new), len(new_lines))


def merge_accepted(root: Path, accepted: Iterable[Candidate]) -> list[MergeReport]:
    """Merge ``accepted`` candidates into ``root``'s qa.jsonl and relevance.jsonl."""
    accepted = list(accepted)
    qa = [qa_record(c) for c in accepted]
    pairs = [r for c in accepted for r in relevance_records(c)]
    return [merge_file(root / "qa.jsonl", qa), merge_file(root / "relevance.jsonl", pairs)]
