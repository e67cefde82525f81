"""Derive labelled relevance pairs (question, passage, label) from questions with evidence quotes.

Each question's evidence quote locates its positive passage: the indexed chunk that contains it,
formatted exactly as the grader sees passages at run time ("title\\ntext"). Each positive gets one hard
negative: the chunk most similar to the question (bundled embeddings) that contains neither the quote
nor any gold alias. Classes are balanced by construction. Questions of the test split are never used,
so the grader is not trained or tuned on questions it will be evaluated on.

    python -m optimize.relevance_pairs --domain-dir data/default --questions data/default/relevance_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from crag_dspy.chunking import chunk_document
from crag_dspy.cli import error_line, user_error_types
from crag_dspy.domain import CorpusDoc, Domain, QAPair, load_domain, load_jsonl
from crag_dspy.embeddings import Embedder

__all__ = ["EvidenceError", "build_relevance_pairs", "main"]


class EvidenceError(ValueError):
    """A question's evidence does not point at a passage."""


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def _passages(docs: Iterable[CorpusDoc], chunk_words: int) -> list[tuple[str, str]]:
    """(doc_id, passage as the grader sees it) for every chunk."""
    return [
        (d.id, f"{d.title}\n{c.text}")
        for d in docs
        for c in chunk_document(d.id, d.title, d.text, chunk_words)
    ]


def build_relevance_pairs(domain: Domain, questions: list[QAPair], embedder: Embedder) -> list[dict]:
    """Balanced positive / hard-negative pairs for every evidence quote of every non-test question."""
    passages = {
        "kb": _passages(domain.corpus, domain.config.chunk_words),
        "web": _passages(domain.web, domain.config.chunk_words),
    }
    web_ids = {d.id for d in domain.web}
    vectors = {
        name: np.asarray(embedder.encode([p for _, p in items])) for name, items in passages.items() if items
    }
    usable = [q for q in questions if q.split != "test" and getattr(q, "evidence", None)]
    question_vectors = (
        np.asarray(embedder.encode([q.question for q in usable])) if usable else np.zeros((0, 0))
    )

    pairs = []
    for q, q_vector in zip(usable, question_vectors):
        aliases = [_norm(a) for a in q.answers if len(a.strip()) > 1]
        quotes = [_norm(e["quote"]) for e in q.evidence]
        for evidence in q.evidence:
            side = "web" if evidence["doc_id"] in web_ids else "kb"
            items = passages[side]
            quote = _norm(evidence["quote"])
            positive = next(
                (p for doc_id, p in items if doc_id == evidence["doc_id"] and quote in _norm(p)), None
            )
            if positive is None:
                raise EvidenceError(
                    f"{q.id}: quote not found in any chunk of {evidence['doc_id']}: {evidence['quote']!r}"
                )
            order = np.argsort(-(vectors[side] @ q_vector))
            negative = next(
                (items[i][1] for i in order if not any(x in _norm(items[i][1]) for x in [*quotes, *aliases])),
                None,
            )
            base = {"question": q.question, "split": q.split, "question_id": q.id}
            pairs.append({**base, "passage": positive, "label": 1, "doc_id": evidence["doc_id"]})
            if negative is not None:
                neg_doc = items[int(next(i for i in order if items[i][1] == negative))][0]
                pairs.append({**base, "passage": negative, "label": 0, "doc_id": neg_doc})
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m optimize.relevance_pairs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--domain-dir", type=Path, required=True)
    parser.add_argument(
        "--questions",
        type=Path,
        action="append",
        default=[],
        help="extra question files (qa.jsonl format with evidence); qa.jsonl is always used",
    )
    parser.add_argument("--out", type=Path, help="default: <domain-dir>/relevance.jsonl")
    args = parser.parse_args(argv)
    try:
        domain = load_domain(args.domain_dir)
        # Synthetic questions already have their pairs (optimize.synthesize), which a rewrite must keep.
        questions = [q for q in domain.qa if q.source != "synthetic"]
        for path in args.questions:
            questions.extend(load_jsonl(path, QAPair))
        pairs = build_relevance_pairs(domain, questions, Embedder())
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    out = args.out or args.domain_dir / "relevance.jsonl"
    # Rewriting the domain's own file keeps its synthetic pairs; another --out gets the derived ones only.
    own_file = out == args.domain_dir / "relevance.jsonl"
    kept = (
        [p.model_dump(exclude_none=True) for p in domain.relevance if p.source == "synthetic"]
        if own_file
        else []
    )
    lines = [*pairs, *kept]
    # Written whole, then moved over the old file: a failed write must not leave a domain half-labelled.
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in lines), encoding="utf-8")
    tmp.replace(out)
    if kept:
        print(f"kept {len(kept)} synthetic pairs (optimize.synthesize) after the derived ones")
    counts = {
        (s, lab): sum(1 for p in pairs if p["split"] == s and p["label"] == lab)
        for s in ("train", "val")
        for lab in (0, 1)
    }
    print(
        f"wrote {len(pairs)} pairs to {out}: " + ", ".join(f"{s}/{lab}={n}" for (s, lab), n in counts.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
