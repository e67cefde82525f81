"""A new domain's setup costs: ingesting its documents, and synthesizing its labelled data.

    python benchmarks/new_domain.py ingest
    python benchmarks/new_domain.py ingest --domain-dir ../shared/data/popqa-dev --copies 1 --rounds 2
    python benchmarks/new_domain.py synthesize --questions 200
    python benchmarks/new_domain.py synthesize --domain-dir ../shared/data/popqa-dev --questions 200

``ingest``: passages per second into a fresh embedded Chroma (``ingest_documents``: chunking,
embedding, upserting, ids and metadata) against the raw sentence-transformers encode rate of the same
passage texts with the same bundled model, their ratio, and peak memory. The domain's corpus and
offline web documents, ``--copies`` times under new ids for a longer measurement. Both sides load the
model before the clock starts and alternate over ``--rounds`` so that load from other processes hits
both alike; the best round of each is reported. Peak Python allocations are traced in a separate,
untimed ingestion (tracing slows Python code down). No LM. Writes results/ingestion_<domain>.json.

``synthesize``: ``python -m optimize.synthesize --accept-all`` on a copy of the domain that holds only its
documents (corpus, web.jsonl, domain.toml; its own questions and pairs hidden), in ``--workdir`` (default:
a fresh folder under the system's temp dir, kept for a compile on the synthetic labels). DSPy's cache is
off, so every LM call is made and timed; the store is ingested and the model started before the clock
starts (both reported apart). Prints the minutes for the questions asked (target: 200 in <= 15 min on
2 cores), the candidates by kind and rejection reason, and the paraphrase rate. Writes
results/synthesis_<domain>.json.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import chromadb
import harness
from chromadb.config import Settings as ChromaSettings
from tqdm.auto import tqdm

from crag_dspy.app import open_backends
from crag_dspy.chunking import chunk_document
from crag_dspy.domain import CorpusDoc, Domain, load_domain
from crag_dspy.embeddings import Embedder, bundled_model_path
from crag_dspy.store import ingest_documents
from optimize.compile import at_least
from optimize.synthesize import SynthesisReport, synthesize

INGEST, SYNTHESIS = "ingestion", "synthesis"
DOCUMENT_FILES = ("domain.toml", "corpus.jsonl", "corpus", "web.jsonl")
"""What a documents-only copy of a domain keeps: no qa.jsonl, relevance.jsonl or strips."""


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


def documents_only(domain_dir: Path, workdir: Path) -> Path:
    """A copy of the domain at ``domain_dir`` in ``workdir/<name>`` holding only its documents."""
    copy = workdir / domain_dir.resolve().name
    if copy.exists():
        raise FileExistsError(f"{copy} exists: a rerun would reuse its candidates; name a new --workdir")
    copy.mkdir(parents=True)
    for name in DOCUMENT_FILES:
        source = domain_dir / name
        if source.is_dir():
            shutil.copytree(source, copy / name)
        elif source.is_file():
            shutil.copy2(source, copy / name)
    return copy


def synthesis_summary(report: SynthesisReport, seconds: float, lm_calls: int) -> dict[str, Any]:
    """What a timed synthesis made: per kind asked/passed, rejection reasons, paraphrase rate."""
    made = report.candidates
    passed = [c for c in made if c.passed]
    kinds = sorted({c.kind for c in made})
    return {
        "seconds": seconds,
        "minutes": seconds / 60,
        "lm_calls": lm_calls,
        "seconds_per_lm_call": seconds / lm_calls if lm_calls else None,
        "questions_kept": len(passed),
        "seconds_per_question_kept": seconds / len(passed) if passed else None,
        "asked_by_kind": {k: sum(c.kind == k for c in made) for k in kinds},
        "kept_by_kind": {k: sum(c.kind == k for c in passed) for k in kinds},
        "rejected": dict(Counter(c.reason.value for c in made if c.reason).most_common()),
        "failed_calls": len(report.failed),
        "median_paraphrase_rate": statistics.median(1 - c.copied_share for c in passed) if passed else None,
    }


def run_synthesis(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    settings = harness.settings_for(args)
    source = harness.domain_of(settings)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"crag-synth-{source.name}-"))
    copy = documents_only(source.root, workdir)
    settings = settings.model_copy(update={"domain_dir": copy, "chroma_path": workdir / "chroma"})
    domain = load_domain(copy)
    started = time.perf_counter()
    backends = open_backends(settings, domain=domain)
    ingest_s = time.perf_counter() - started
    started = time.perf_counter()
    lm = harness.lm_for(settings, args, cache=False)
    lm("Say OK.", max_tokens=2)  # the model is up and its weights in memory before the clock starts
    start_s = time.perf_counter() - started
    stores = {"kb": backends.retriever("kb"), **({"web": backends.retriever("web")} if domain.web else {})}
    calls = len(lm.history)
    started = time.perf_counter()
    report = synthesize(
        settings,
        questions=args.questions,
        seed=args.seed,
        accept_all=True,
        lm=lm,
        retrievers=lambda d: stores,
    )
    r = synthesis_summary(report, time.perf_counter() - started, len(lm.history) - calls)
    r |= {"domain": source.name, "questions": args.questions, "ingest_seconds": ingest_s,
          "model_start_seconds": start_s, "workdir": str(copy)}  # fmt: skip
    print("\n".join(report.lines()))
    print(
        f"{args.questions} questions asked for: {r['questions_kept']} kept in {r['minutes']:.1f} min "
        f"(target 200 in <= 15 min), {r['lm_calls']} LM calls, {r['seconds_per_lm_call'] or 0:.1f} s per call; "
        f"ingest {ingest_s:.0f} s and model start {start_s:.0f} s before the clock"
    )
    print(f"synthetic domain: {copy}  (compile on it: python -m optimize.compile --domain-dir {copy})")
    harness.write_result(harness.result_path(args, SYNTHESIS, source.name), SYNTHESIS, argv, r, lm=lm)
    return 0


def run_ingest(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
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
    harness.write_result(harness.result_path(args, INGEST, domain.name), INGEST, argv, r)
    return 0


def main(argv: list[str] | None = None) -> int:
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    ingest = harness.parser(__doc__, lm=False, store=False, subparsers=commands, name="ingest")
    ingest.add_argument(
        "--copies", type=at_least(1), default=4, help="copies of the domain's documents (default 4)"
    )
    ingest.add_argument(
        "--rounds", type=at_least(1), default=3, help="alternating rounds, best of each side (default 3)"
    )
    synth = harness.parser(__doc__, cache_flag=False, store=False, subparsers=commands, name="synthesize")
    synth.add_argument("--questions", type=at_least(1), default=200, help="questions asked for (default 200)")
    synth.add_argument("--seed", type=int, default=0, help="passage sampling and document splits")
    synth.add_argument(
        "--workdir", type=Path, help="where the documents-only copy goes (default: a temp dir)"
    )
    args = harness.parse(top, argv)
    if args.command == "ingest":
        return run_ingest(args, argv)
    try:
        return run_synthesis(args, argv)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
