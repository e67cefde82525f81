"""Ingestion throughput: passages per second into a fresh embedded Chroma (``ingest_documents``: chunking,
embedding, upserting, ids and metadata) against the raw sentence-transformers encode rate of the same
passage texts with the same bundled model, their ratio, and peak memory.

    python benchmarks/ingestion.py
    python benchmarks/ingestion.py --domain-dir ../shared/data/popqa-dev --copies 1 --rounds 2

The domain's corpus and offline web documents, ``--copies`` times under new ids for a longer
measurement. Both sides load the model before the clock starts and alternate over ``--rounds`` so that
load from other processes hits both alike; the best round of each is reported. Peak Python allocations
are traced in a separate, untimed ingestion (tracing slows Python code down). No LM.
Writes benchmarks/results/ingestion_<domain>.json.
"""

from __future__ import annotations

import resource
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import chromadb
import harness
from chromadb.config import Settings as ChromaSettings
from tqdm.auto import tqdm

from crag_dspy.chunking import chunk_document
from crag_dspy.domain import CorpusDoc, Domain
from crag_dspy.embeddings import Embedder, bundled_model_path
from crag_dspy.store import ingest_documents

SCRIPT = "ingestion"


def documents(domain: Domain, copies: int) -> list[CorpusDoc]:
    """The domain's corpus and web documents, ``copies`` times under new ids."""
    originals = [*domain.corpus, *domain.web]
    return [
        CorpusDoc(id=f"{d.id}-copy{i}", title=d.title, text=d.text) for i in range(copies) for d in originals
    ]


def passages(docs: Sequence[CorpusDoc], chunk_words: int) -> list[str]:
    """Exactly what ``ingest_documents`` embeds: ``title\\nchunk text`` for every chunk."""
    return [f"{d.title}\n{c.text}" for d in docs for c in chunk_document(d.id, d.title, d.text, chunk_words)]


def raw_encoder():
    """The bundled model as a plain SentenceTransformer, loaded as the project's Embedder loads it."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(
        str(bundled_model_path()), device="cpu", local_files_only=True, model_kwargs={"use_safetensors": True}
    )


def raw_encode_seconds(model: Any, texts: list[str]) -> float:
    started = time.perf_counter()
    model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)  # the library's defaults otherwise
    return time.perf_counter() - started


def ingest_seconds(embedder: Embedder, docs: Sequence[CorpusDoc], chunk_words: int) -> tuple[float, int]:
    """Seconds to ingest ``docs`` into a fresh Chroma folder, and the chunks written."""
    with tempfile.TemporaryDirectory() as folder:
        client = chromadb.PersistentClient(path=folder, settings=ChromaSettings(anonymized_telemetry=False))
        started = time.perf_counter()
        report = ingest_documents(
            client, "bench", list(docs), embedder, chunk_words=chunk_words, progress=False
        )
        seconds = time.perf_counter() - started
        if report.added != report.chunks:
            raise RuntimeError(f"a fresh store must take every chunk: {report}")
        return seconds, report.chunks


def peak_python_allocations(embedder: Embedder, docs: Sequence[CorpusDoc], chunk_words: int) -> int:
    tracemalloc.start()
    try:
        ingest_seconds(embedder, docs, chunk_words)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(
    domain: Domain, copies: int, rounds: int, *, embedder: Embedder | None = None, model: Any = None
) -> dict[str, Any]:
    docs = documents(domain, copies)
    chunk_words = domain.config.chunk_words
    texts = passages(docs, chunk_words)
    embedder = embedder or Embedder()
    model = model or raw_encoder()
    embedder.encode(texts[:64])  # both models loaded and warm before either clock starts
    model.encode(texts[:64])
    raw, ingest = [], []
    for _ in tqdm(range(rounds), desc="rounds"):
        raw.append(raw_encode_seconds(model, texts))
        seconds, chunks = ingest_seconds(embedder, docs, chunk_words)
        ingest.append(seconds)
    peak_python = peak_python_allocations(embedder, docs, chunk_words)
    raw_rate, ingest_rate = len(texts) / min(raw), chunks / min(ingest)
    return {
        "domain": domain.name,
        "copies": copies,
        "passages": len(texts),
        "raw_encode_passages_per_s": raw_rate,
        "ingest_passages_per_s": ingest_rate,
        "ratio": ingest_rate / raw_rate,
        "raw_seconds": raw,
        "ingest_seconds": ingest,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_python_alloc_during_ingest_mib": peak_python / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, lm=False, store=False)
    p.add_argument("--copies", type=int, default=4, help="copies of the domain's documents (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds, best of each side (default 3)")
    args = harness.parse(p, argv)
    if args.copies < 1 or args.rounds < 1:
        p.error("--copies and --rounds must be at least 1")
    domain = harness.domain_of(harness.settings_for(args))
    r = measure(domain, args.copies, args.rounds)
    print(
        f"{r['passages']} passages ({domain.name} corpus + web, {args.copies} copies), best of {args.rounds}"
    )
    print(f"raw sentence-transformers encode: {r['raw_encode_passages_per_s']:8.1f} passages/s")
    print(f"ingest_documents into Chroma:     {r['ingest_passages_per_s']:8.1f} passages/s")
    print(f"ratio ingest / raw encode:        {r['ratio']:8.2f}x  (goal >= 0.9x)")
    print(
        f"peak RSS of the process: {r['peak_rss_mib']:.0f} MiB; peak Python allocations while ingesting: "
        f"{r['peak_python_alloc_during_ingest_mib']:.1f} MiB"
    )
    harness.write_result(harness.result_path(args, SCRIPT, domain.name), SCRIPT, argv, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
