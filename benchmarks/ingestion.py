"""Ingestion throughput: passages per second into a fresh embedded Chroma (``ingest_documents``:
chunking, embedding, upserting) against the raw sentence-transformers encode rate on the same passage
texts, their ratio, and peak memory.

    python benchmarks/ingestion.py [--domain default] [--copies 4] [--rounds 3] [--out results.json]

Both sides use the same loaded model (loading it is not part of either rate) and alternate over
``--rounds`` so that load from other processes on the machine hits both alike; the best round of each
is reported. ``--copies`` repeats the domain's documents under new ids for a longer measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import chromadb
from chromadb.config import Settings as ChromaSettings

from crag_dspy.chunking import chunk_document
from crag_dspy.domain import CorpusDoc, load_domain
from crag_dspy.embeddings import Embedder
from crag_dspy.settings import DEFAULT_DATA_DIR
from crag_dspy.store import ingest_documents


def _documents(domain_name: str, copies: int) -> tuple[list[CorpusDoc], int]:
    domain = load_domain(DEFAULT_DATA_DIR / domain_name)
    originals = [*domain.corpus, *domain.web]
    docs = [
        CorpusDoc(id=f"{d.id}-copy{i}", title=d.title, text=d.text) for i in range(copies) for d in originals
    ]
    return docs, domain.config.chunk_words


def _passages(docs: list[CorpusDoc], chunk_words: int) -> list[str]:
    # Exactly what ingest_documents embeds: "title\nchunk text" for every chunk.
    return [f"{d.title}\n{c.text}" for d in docs for c in chunk_document(d.id, d.title, d.text, chunk_words)]


def _raw_encode(model, texts: list[str]) -> float:
    started = time.perf_counter()
    model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)  # sentence-transformers defaults
    return time.perf_counter() - started


def _ingest(embedder: Embedder, docs: list[CorpusDoc], chunk_words: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as folder:
        client = chromadb.PersistentClient(path=folder, settings=ChromaSettings(anonymized_telemetry=False))
        started = time.perf_counter()
        report = ingest_documents(client, "bench", docs, embedder, chunk_words=chunk_words, progress=False)
        seconds = time.perf_counter() - started
        assert report.added == report.chunks, report
        return seconds, report.chunks


def _peak_python_allocations(embedder: Embedder, docs: list[CorpusDoc], chunk_words: int) -> int:
    # A separate, untimed run: tracing every allocation slows Python code down.
    tracemalloc.start()
    try:
        _ingest(embedder, docs, chunk_words)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="default")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    docs, chunk_words = _documents(args.domain, args.copies)
    texts = _passages(docs, chunk_words)
    embedder = Embedder()
    model = embedder._load()  # the very model ingestion uses: loading is outside both measurements
    model.encode(texts[:64])  # warm-up
    raw, ingest = [], []
    for _ in range(args.rounds):
        raw.append(_raw_encode(model, texts))
        seconds, chunks = _ingest(embedder, docs, chunk_words)
        ingest.append(seconds)
    peak_python = _peak_python_allocations(embedder, docs, chunk_words)
    raw_rate, ingest_rate = len(texts) / min(raw), chunks / min(ingest)
    result = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "domain": args.domain,
        "copies": args.copies,
        "passages": len(texts),
        "raw_encode_passages_per_s": raw_rate,
        "ingest_passages_per_s": ingest_rate,
        "ratio": ingest_rate / raw_rate,
        "raw_seconds": raw,
        "ingest_seconds": ingest,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_python_alloc_during_ingest_mib": peak_python / 2**20,
    }
    print(f"{len(texts)} passages ({args.domain} corpus + web, {args.copies} copies), best of {args.rounds}")
    print(f"raw sentence-transformers encode: {raw_rate:8.1f} passages/s")
    print(f"ingest_documents into Chroma:     {ingest_rate:8.1f} passages/s")
    print(f"ratio ingest / raw encode:        {result['ratio']:8.2f}x  (goal >= 0.9x)")
    print(
        f"peak RSS of the process: {result['peak_rss_mib']:.0f} MiB; peak Python allocations while "
        f"ingesting: {result['peak_python_alloc_during_ingest_mib']:.1f} MiB"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
