"""The synthesis state of a domain, in ``<domain>/synthetic/``: every candidate, and a person's decisions.

- ``candidates.jsonl``: every candidate (:class:`~.candidates.Candidate`), the machine's record, so a
  rerun asks nothing twice and ``--apply-review`` needs neither the LM nor the store.
- ``review.csv``: one row per candidate, for a person (any spreadsheet opens it). The ``decision``
  column is ``accept`` or ``reject``; a new row starts as the rules decided (``reason`` says which rule
  rejected it), and a person may change either way. Rows are matched by ``id``: a rerun appends new
  candidates and keeps every decision already in the file.

The folder is not a domain data file (only top-level .jsonl/.toml files are hashed into a program).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from crag_dspy.domain import DomainDataError

from .candidates import Candidate

__all__ = [
    "DECISIONS",
    "REVIEW_COLUMNS",
    "append_candidate",
    "load_candidates",
    "read_decisions",
    "state_dir",
    "write_atomically",
    "write_candidates",
    "write_review",
]

DECISIONS = ("accept", "reject")
REVIEW_COLUMNS = (
    "id",
    "decision",
    "reason",
    "kind",
    "split",
    "doc_id",
    "question",
    "answer",
    "paraphrase_rate",
    "negatives",
    "passage",
)


def state_dir(root: Path) -> Path:
    return root / "synthetic"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file: an interruption never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def load_candidates(root: Path) -> list[Candidate]:
    path = state_dir(root) / "candidates.jsonl"
    if not path.is_file():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                out.append(Candidate.model_validate_json(line))
            except ValueError as exc:
                raise DomainDataError(f"{path}:{number}: not a synthesis candidate ({exc})") from None
    return out


def write_candidates(root: Path, candidates: Iterable[Candidate]) -> Path:
    path = state_dir(root) / "candidates.jsonl"
    write_atomically(path, "".join(c.model_dump_json() + "\n" for c in candidates))
    return path


def append_candidate(root: Path, candidate: Candidate) -> None:
    """Add one candidate to ``candidates.jsonl`` as soon as it is made: a run that is killed (not only
    one that fails) keeps what it asked, and a rerun does not ask it again."""
    path = state_dir(root) / "candidates.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(candidate.model_dump_json() + "\n")


def read_decisions(root: Path) -> dict[str, str]:
    """``{candidate id: "accept" | "reject"}`` from ``review.csv`` (empty when there is none); a row
    with another decision is an error naming its line, never a silent reject."""
    path = state_dir(root) / "review.csv"
    if not path.is_file():
        return {}
    decisions = {}
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"id", "decision"} - set(reader.fieldnames or ())
        if missing:
            raise DomainDataError(f"{path}: no column(s) {sorted(missing)}")
        for row in reader:
            decision = (row["decision"] or "").strip().lower()
            if decision not in DECISIONS:
                raise DomainDataError(
                    f"{path}:{reader.line_num}: decision {row['decision']!r} is not accept or reject"
                )
            decisions[row["id"]] = decision
    return decisions


def write_review(root: Path, candidates: Iterable[Candidate], decisions: Mapping[str, str]) -> Path:
    """Write ``review.csv``: every candidate, with its decision in ``decisions`` or else the rules'."""
    path = state_dir(root) / "review.csv"
    lines: list[dict[str, str]] = []
    for c in candidates:
        lines.append(
            {
                "id": c.id,
                "decision": decisions.get(c.id, "accept" if c.passed else "reject"),
                "reason": c.reason.value if c.reason else "",
                "kind": c.kind,
                "split": c.split,
                "doc_id": c.doc_id,
                "question": c.question,
                "answer": "I don't know" if c.kind == "none" else (c.answer or ""),
                "paraphrase_rate": f"{1 - c.copied_share:.2f}" if c.question else "",
                "negatives": " ".join(n.kind for n in c.negatives),
                "passage": c.passage,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=REVIEW_COLUMNS)
        writer.writeheader()
        writer.writerows(lines)
    os.replace(tmp, path)
    return path
