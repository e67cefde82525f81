"""Retrieval recall: dense (embedding) ranking vs hybrid (dense + BM25, reciprocal rank fusion).

    python benchmarks/retrieval_recall.py --domain-dir data/default --split test
    python benchmarks/retrieval_recall.py --domain-dir ../shared/data/popqa-dev --split test --k 5 10
    python benchmarks/retrieval_recall.py --domain-dir benchmarks/owndocs --split all

Ingests the domain's corpus (``ingest_documents``, as ``python -m crag_dspy ingest`` does, the corpus
only) into an embedded Chroma in a fresh temporary folder (``--chroma-path`` to keep one), then for every
answerable question of the split asks both retrievers for the top ``k`` chunks of the question:

* answer recall@k: a gold alias occurs in a chunk as whole words (``contains_answer`` on what the graders
  read, title and text); over all answerable questions, and over those whose answer is in the internal
  knowledge (``kind`` kb, both or unset: the rest can only be answered from the web);
* evidence recall@k, for questions that name ``evidence`` documents of the corpus: one of them is among
  the top-k chunks' documents.

Each recall carries its Wilson 95% interval; hybrid vs dense is a paired exact McNemar test over the same
questions. No LM. Writes results/retrieval_recall_<domain>.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness

from crag_dspy.domain import Domain, QAPair
from crag_dspy.embeddings import Embedder
from crag_dspy.hybrid import HybridRetriever, bm25_cache_root
from crag_dspy.protocols import Retriever
from crag_dspy.settings import Settings
from crag_dspy.store import ChromaRetriever, collection_names, ingest_documents, open_client
from optimize.metrics import contains_answer, is_answerable, mcnemar_exact

SCRIPT = "retrieval_recall"
KB_KINDS = ("kb", "both", None)
"""Question kinds whose answer is in the internal knowledge (unset: the domain does not say)."""


def questions(domain: Domain, split: str) -> list[QAPair]:
    """The answerable questions of ``split`` ('all': every split)."""
    return [q for q in domain.qa if (split == "all" or q.split == split) and is_answerable(q.answers)]


def evidence_docs(question: QAPair, corpus_ids: set[str]) -> set[str]:
    """The corpus documents a question's ``evidence`` names (its web evidence is not retrievable here)."""
    found = getattr(question, "evidence", None) or []
    return {str(e["doc_id"]) for e in found if isinstance(e, dict) and str(e.get("doc_id")) in corpus_ids}


def compare(rows: Sequence[dict[str, Any]], field: str) -> dict[str, Any]:
    """Recall of dense and hybrid on the rows that have ``field`` (bool or None), with intervals and
    the paired exact McNemar p of hybrid vs dense."""
    kept = [r for r in rows if r["dense"][field] is not None]
    dense = [r["dense"][field] for r in kept]
    hybrid = [r["hybrid"][field] for r in kept]
    return {
        "dense": harness.rate(sum(dense), len(kept)),
        "hybrid": harness.rate(sum(hybrid), len(kept)),
        "only_dense": sum(d and not h for d, h in zip(dense, hybrid)),
        "only_hybrid": sum(h and not d for d, h in zip(dense, hybrid)),
        "mcnemar_p": mcnemar_exact(hybrid, dense),
    }


def measure(
    retrievers: dict[str, Retriever], qa: Sequence[QAPair], corpus_ids: set[str], k: int
) -> dict[str, Any]:
    """Per-question outcomes of every retriever at ``k``, and their comparisons."""
    rows, seconds = [], {name: [] for name in retrievers}
    for q in qa:
        row: dict[str, Any] = {"id": q.id, "kind": q.kind}
        wanted = evidence_docs(q, corpus_ids)
        for name, retriever in retrievers.items():
            start = time.perf_counter()
            passages = retriever.retrieve(q.question, k)
            seconds[name].append(time.perf_counter() - start)
            hits = [i for i, p in enumerate(passages) if contains_answer(p.display, q.answers)]
            row[name] = {
                "answer": bool(hits),
                "answer_in_kb": bool(hits) if q.kind in KB_KINDS else None,
                "evidence": bool(wanted & {p.doc_id for p in passages}) if wanted else None,
                "first_answer_rank": hits[0] if hits else None,
                "doc_ids": [p.doc_id for p in passages],
            }
        rows.append(row)
    return {
        "k": k,
        "answer": compare(rows, "answer"),
        "answer_in_kb": compare(rows, "answer_in_kb"),
        "evidence": compare(rows, "evidence"),
        "ms_per_query": {n: round(1000 * statistics.fmean(s), 1) if s else None for n, s in seconds.items()},
        "questions": rows,
    }


def table(domain: str, split: str, results: Sequence[dict[str, Any]]) -> str:
    lines = [f"retrieval recall, domain {domain!r}, split {split}"]
    for r in results:
        for what, label in (
            ("answer", "answer (all answerable)"),
            ("answer_in_kb", "answer (kind kb/both)"),
            ("evidence", "evidence document"),
        ):
            c = r[what]
            if not c["dense"]["n"]:
                continue
            lines.append(
                f"  @{r['k']:<2} {label:<24} dense {harness.fmt_rate(c['dense'])}   hybrid "
                f"{harness.fmt_rate(c['hybrid'])}   only dense {c['only_dense']}, only hybrid "
                f"{c['only_hybrid']}, McNemar p={c['mcnemar_p']:.3g}"
            )
        ms = r["ms_per_query"]
        lines.append(f"  @{r['k']:<2} ms per query: dense {ms['dense']}, hybrid {ms['hybrid']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, lm=False, store=False)
    p.add_argument("--split", choices=["train", "val", "test", "all"], default="test", help="QA split")
    # dest "ks": the CLI's settings read a "k" as CRAG's own k
    p.add_argument(
        "--k", dest="ks", type=int, nargs="+", default=[5], help="passages retrieved (several: --k 5 10)"
    )
    p.add_argument(
        "--chroma-path",
        type=Path,
        help="embedded Chroma folder to ingest into and keep (default: a temporary folder, removed after)",
    )
    args = harness.parse(p, argv)
    store = args.chroma_path or Path(tempfile.mkdtemp(prefix="crag-recall-"))
    try:
        settings = harness.settings_for(args).model_copy(update={"chroma_path": store, "chroma_host": None})
        return run(args, settings, argv)
    finally:
        if args.chroma_path is None:
            shutil.rmtree(store, ignore_errors=True)


def run(args: argparse.Namespace, settings: Settings, argv: list[str] | None) -> int:
    domain = harness.domain_of(settings)
    qa = questions(domain, args.split)
    if not qa:
        raise SystemExit(f"no answerable questions in split {args.split!r} of {domain.root}")
    client, embedder = open_client(settings), Embedder(settings.embedding_model)
    kb = collection_names(domain.name)[0]
    start = time.perf_counter()
    report = ingest_documents(
        client, kb, domain.corpus, embedder, chunk_words=domain.config.chunk_words, source=domain.source("kb")
    )
    ingest_s = time.perf_counter() - start
    start = time.perf_counter()
    hybrid = HybridRetriever(client, kb, embedder, cache_dir=bm25_cache_root(settings))
    index_s = time.perf_counter() - start
    retrievers: dict[str, Retriever] = {"dense": ChromaRetriever(client, kb, embedder), "hybrid": hybrid}
    corpus_ids = {d.id for d in domain.corpus}
    results = [measure(retrievers, qa, corpus_ids, k) for k in args.ks]
    print(table(domain.name, args.split, results))
    print(
        f"{len(qa)} questions; {report.chunks} chunks of {report.documents} documents; ingest "
        f"{ingest_s:.1f} s; BM25 index {'built' if hybrid.built else 'loaded'} in {index_s:.2f} s"
    )
    summary = {
        "domain": domain.name,
        "domain_dir": str(domain.root),
        "split": args.split,
        "questions": len(qa),
        "chunks": report.chunks,
        "documents": report.documents,
        "ingest_seconds": round(ingest_s, 2),
        "bm25_index_seconds": round(index_s, 3),
        "by_k": results,
    }
    harness.write_result(harness.result_path(args, SCRIPT, domain.name), SCRIPT, argv, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
