"""Chroma storage: client selection (embedded or server), idempotent ingestion, and retrieval."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import chromadb
import httpx
from chromadb.api.client import Client as ChromaClient
from chromadb.config import Settings as ChromaSettings
from tqdm.auto import tqdm

from .chunking import chunk_document
from .domain import CorpusDoc, Domain, SourceFiles
from .embeddings import Embedder
from .protocols import Passage, passage_heading
from .settings import Settings
from .version import __version__

__all__ = [
    "ChromaRetriever",
    "IngestReport",
    "StoreError",
    "collection_names",
    "content_hash",
    "get_collection",
    "ingest_documents",
    "ingest_domain",
    "ingest_gap",
    "ingest_gaps",
    "open_client",
    "open_retrievable",
    "planned_chunks",
    "source_record",
    "store_errors",
    "stored_gap",
    "stored_passage",
]

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """Chroma is unreachable, or a collection is missing or was built with another embedding model."""


class _TimedHttpClient(ChromaClient):
    """``chromadb.HttpClient`` with a timeout on every request (connect, read, write, pool).

    chromadb's HTTP client sets ``httpx.Client(timeout=None)`` and has no setting for one: a server
    that accepts connections and never answers (hung, or stopped with SIGSTOP) held ``ask`` for ever
    and wedged every ``serve`` worker. The client makes its first request while it is being built
    (:meth:`get_user_identity`), so the timeout is set there, on the session all its requests share.
    """

    def __init__(self, settings: Settings) -> None:
        self._crag_timeout = httpx.Timeout(settings.store_timeout_s)
        chroma_settings = ChromaSettings(anonymized_telemetry=False)  # no telemetry from an offline machine
        # What chromadb.HttpClient sets (it offers no way to give the client another class).
        chroma_settings.chroma_api_impl = "chromadb.api.fastapi.FastAPI"
        chroma_settings.chroma_server_host = settings.chroma_host
        chroma_settings.chroma_server_http_port = settings.chroma_port
        super().__init__(settings=chroma_settings)

    def get_user_identity(self):
        session = getattr(self._server, "_session", None)
        if isinstance(session, httpx.Client):
            session.timeout = self._crag_timeout
        return super().get_user_identity()


def open_client(settings: Settings) -> chromadb.ClientAPI:
    """Embedded ``PersistentClient`` by default; an HTTP client when ``chroma_host`` is set, whose every
    request gives up after ``store_timeout_s`` (a hung server is a :class:`StoreError`, not a hang)."""
    chroma_settings = ChromaSettings(
        anonymized_telemetry=False
    )  # telemetry would call out of an offline machine
    try:
        if settings.chroma_host:
            client = _TimedHttpClient(settings)
            client.heartbeat()
            return client
        settings.resolved_chroma_path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(settings.resolved_chroma_path), settings=chroma_settings)
    except Exception as exc:  # every backend failure becomes one actionable error
        where = (
            f"server {settings.chroma_host}:{settings.chroma_port}"
            if settings.chroma_host
            else f"folder {settings.resolved_chroma_path}"
        )
        raise StoreError(f"Cannot open Chroma ({where}): {_reason(exc, settings)}") from exc


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, an HTTP timeout (chromadb re-raises some as others)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.TimeoutException):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _reason(exc: Exception, settings: Settings) -> str:
    # httpx says only "timed out": say what the limit was and which setting moves it.
    if _timed_out(exc):
        return f"no answer within {settings.store_timeout_s:g} s (CRAG_STORE_TIMEOUT_S)"
    return str(exc)


@contextmanager
def store_errors(what: str) -> Iterator[None]:
    """Turn any Chroma/transport failure inside the block into one :class:`StoreError` naming ``what``."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:  # chroma raises different types per backend and transport
        if _timed_out(exc):
            raise StoreError(
                f"Chroma failed while {what}: the server gave no answer within the store timeout "
                "(CRAG_STORE_TIMEOUT_S)"
            ) from exc
        raise StoreError(f"Chroma failed while {what}: {type(exc).__name__}: {exc}") from exc


def collection_names(domain_name: str) -> tuple[str, str]:
    """(internal knowledge, offline web) collection names of a domain."""
    return f"{domain_name}__kb", f"{domain_name}__web"


# The ingest manifest, in the collection's own metadata (the same code path on the embedded store and
# a Chroma server): the hash of the chunks the collection must hold and their count, written last, after
# every upsert and delete, and removed when an ingest starts changing the collection. A collection
# without a matching manifest is an ingest that did not finish (or stale data), never a complete one.
# An ingest of a domain's files also records them (MANIFEST_SOURCE, see source_record), so that an app
# can tell its store is up to date from the files' sizes and times or hashes, without parsing them.
MANIFEST_HASH, MANIFEST_CHUNKS, MANIFEST_SOURCE = "ingest_sha256", "ingest_chunks", "ingest_source"
_MANIFEST_KEYS = (MANIFEST_HASH, MANIFEST_CHUNKS, MANIFEST_SOURCE)

Planned = dict[str, tuple[str, str, dict]]
"""chunk id -> (text embedded, text stored, chunk metadata)"""


def planned_chunks(docs: Sequence[CorpusDoc], chunk_words: int) -> Planned:
    """The chunks a collection of ``docs`` must hold, by id (ids hash document id, title and text)."""
    planned: Planned = {}
    for doc in docs:
        for chunk in chunk_document(doc.id, doc.title, doc.text, chunk_words, doc.parts):
            metadata = {"doc_id": doc.id, "title": doc.title, "chunk_index": chunk.index}
            for key in ("source", "url"):
                if getattr(doc, key, None):
                    metadata[key] = getattr(doc, key)
            # Chroma metadata holds no None: a location is stored only where the document has one.
            if chunk.page is not None:
                metadata["page"] = chunk.page
            if chunk.section:
                metadata["section"] = chunk.section
            heading = passage_heading(doc.title, chunk.section)
            planned[chunk.id] = (f"{heading}\n{chunk.text}", chunk.text, metadata)
    return planned


def content_hash(chunk_ids: Iterable[str]) -> str:
    """The manifest's content hash: of the sorted chunk ids, which hash each chunk's document and text."""
    return hashlib.sha256("\n".join(sorted(chunk_ids)).encode()).hexdigest()


def source_record(source: SourceFiles, chunk_words: int) -> str:
    """What the manifest records of the files a collection was ingested from (JSON: Chroma metadata
    values are scalars). The package version is part of it: another version may chunk differently, so
    its first start compares the chunks themselves once."""
    return json.dumps(
        {
            "files": source.name,
            "stat": source.stat_key,
            "sha256": source.sha256,
            "chunk_words": chunk_words,
            "version": __version__,
        },
        sort_keys=True,
    )


def _manifest(planned: Planned, source: str | None = None) -> dict[str, str | int]:
    manifest: dict[str, str | int] = {MANIFEST_HASH: content_hash(planned), MANIFEST_CHUNKS: len(planned)}
    return {**manifest, MANIFEST_SOURCE: source} if source else manifest


def _write_manifest(collection, manifest: dict[str, str | int] | None) -> None:
    """Set (or with None remove) the collection's manifest; Chroma replaces metadata as a whole."""
    kept = {k: v for k, v in (collection.metadata or {}).items() if k not in _MANIFEST_KEYS}
    collection.modify(metadata={**kept, **(manifest or {})})


def _source_is_current(collection, source: SourceFiles | None, chunk_words: int) -> bool:
    """Whether the collection's manifest records exactly ``source``'s files, and it holds the count it
    records: sizes and times first (no read), else the files' hashes (a read, no parse)."""
    found = collection.metadata or {}
    if source is None or MANIFEST_SOURCE not in found or MANIFEST_HASH not in found:
        return False
    try:
        recorded = json.loads(found[MANIFEST_SOURCE])
    except (TypeError, ValueError):
        return False  # not ours to trust: the chunks are compared instead
    same_kind = recorded.get("files") == source.name and recorded.get("chunk_words") == chunk_words
    if not same_kind or recorded.get("version") != __version__:
        return False
    if collection.count() != found.get(MANIFEST_CHUNKS):
        return False
    return recorded.get("stat") == source.stat_key or recorded.get("sha256") == source.sha256


def ingest_gap(collection, planned: Planned) -> str | None:
    """Why ``collection`` does not hold exactly the ``planned`` chunks by its manifest, or None."""
    name, count = collection.name, collection.count()
    found = collection.metadata or {}
    if MANIFEST_HASH not in found:
        return (
            f"collection {name!r} holds {count} of {len(planned)} chunks and no ingest manifest "
            "(an ingest that did not finish, or one made before ingest manifests)"
        )
    if found[MANIFEST_HASH] != content_hash(planned):
        return f"collection {name!r} was ingested from other content than the domain holds now"
    if count != found.get(MANIFEST_CHUNKS) or count != len(planned):
        return f"collection {name!r} holds {count} of {len(planned)} chunks"
    return None


@dataclass
class IngestReport:
    collection: str
    documents: int
    chunks: int
    added: int
    unchanged: int
    removed: int


def get_collection(client: chromadb.ClientAPI, name: str, embedder: Embedder, create: bool):
    """Collection ``name`` (created when ``create``); a missing one, or one embedded with another model,
    is a :class:`StoreError` that says what to do."""
    metadata = {"embedding_model": embedder.name}
    if create:
        # embedding_function=None: we embed ourselves, so Chroma never fetches its default model.
        collection = client.get_or_create_collection(
            name, configuration={"hnsw": {"space": "cosine"}}, metadata=metadata, embedding_function=None
        )
    else:
        try:
            collection = client.get_collection(name, embedding_function=None)
        except Exception as exc:  # chroma raises different types per backend
            if _timed_out(exc):  # a hung server is not a missing collection: store_errors says so
                raise
            raise StoreError(
                f"Collection {name!r} not found: run `crag-dspy ingest --domain-dir <domain dir>` first"
            ) from exc
    found = (collection.metadata or {}).get("embedding_model")
    if found != embedder.name:
        raise StoreError(
            f"Collection {name!r} was built with embedding model {found!r}, not {embedder.name!r}: "
            "re-ingest into a fresh Chroma folder or use the same model"
        )
    return collection


def ingest_documents(
    client: chromadb.ClientAPI,
    name: str,
    docs: Sequence[CorpusDoc],
    embedder: Embedder,
    *,
    chunk_words: int,
    progress: bool = True,
    source: SourceFiles | None = None,
) -> IngestReport:
    """Make collection ``name`` hold exactly the chunks of ``docs``: add new, keep unchanged, drop stale.

    Ids hash the chunk content, so an interrupted run simply resumes (present chunks are skipped, not
    re-embedded), a changed document's old chunks are removed, and a rerun changes nothing. A store
    failure raises :class:`StoreError`; rerunning after it completes the job without duplicates.
    ``source`` (the files ``docs`` were read from, keyed before they were read) goes into the manifest, so
    that :func:`ingest_gaps` needs no parse while the files stay the same.
    """
    record = source_record(source, chunk_words) if source is not None else None
    with store_errors(f"ingesting collection {name!r} (rerun ingest to resume; nothing is duplicated)"):
        return _ingest(
            client, name, docs, embedder, chunk_words=chunk_words, progress=progress, source=record
        )


def _ingest(
    client: chromadb.ClientAPI,
    name: str,
    docs: Sequence[CorpusDoc],
    embedder: Embedder,
    *,
    chunk_words: int,
    progress: bool,
    source: str | None,
) -> IngestReport:
    collection = get_collection(client, name, embedder, create=True)
    wanted = planned_chunks(docs, chunk_words)
    existing = set(collection.get(include=[])["ids"])
    stale = sorted(existing - wanted.keys())
    new_ids = [cid for cid in wanted if cid not in existing]
    if new_ids or stale:
        _write_manifest(collection, None)  # changing: incomplete until the manifest is written again
    batch = 64
    with tqdm(
        total=len(new_ids), desc=f"ingest {name}", unit="chunk", disable=not progress or not new_ids
    ) as bar:
        for start in range(0, len(new_ids), batch):
            ids = new_ids[start : start + batch]
            vectors = embedder.encode([wanted[i][0] for i in ids])
            collection.upsert(
                ids=ids,
                embeddings=vectors,
                documents=[wanted[i][1] for i in ids],
                metadatas=[wanted[i][2] for i in ids],
            )
            bar.update(len(ids))
    # Stale chunks go only after the new ones are in, so an interruption never leaves a document absent.
    for start in range(0, len(stale), 500):
        collection.delete(ids=stale[start : start + 500])
    manifest = _manifest(wanted, source)
    if (
        ingest_gap(collection, wanted) is not None
        or (collection.metadata or {}).get(MANIFEST_SOURCE) != source
    ):
        _write_manifest(collection, manifest)  # last: every chunk is in
    return IngestReport(name, len(docs), len(wanted), len(new_ids), len(wanted) - len(new_ids), len(stale))


def ingest_domain(
    client: chromadb.ClientAPI,
    domain: Domain,
    embedder: Embedder,
    *,
    progress: bool = True,
) -> list[IngestReport]:
    kb_name, web_name = collection_names(domain.name)
    sides = [(kb_name, domain.corpus, "kb"), *([(web_name, domain.web, "web")] if domain.web else [])]
    return [
        ingest_documents(
            client,
            name,
            docs,
            embedder,
            chunk_words=domain.config.chunk_words,
            progress=progress,
            source=domain.source(which),
        )
        for name, docs, which in sides
    ]


def ingest_gaps(client: chromadb.ClientAPI, domain: Domain) -> list[str]:
    """What is missing from the domain's collections by their ingest manifests (empty: complete).

    A collection whose manifest records the domain's files as they are now (:func:`source_record`) is
    complete without the files being parsed; otherwise its chunks are planned from the parsed documents
    and compared, and when they match, the manifest learns the files' new keys (a file touched or
    rewritten with the same content costs one parse, not one per start). A domain without a corpus
    (:attr:`Domain.has_corpus`) is checked by the manifest alone: there is nothing to compare with.
    """
    kb_name, web_name = collection_names(domain.name)
    words = domain.config.chunk_words
    with store_errors("checking the ingest manifests"):
        present = {c if isinstance(c, str) else c.name for c in client.list_collections()}
        gaps = []
        for name, which in ((kb_name, "kb"), (web_name, "web")):
            if which == "web" and not domain.has_web:
                continue
            if name not in present:
                # An unread web.jsonl of blank lines would be a gap no ingest can fill: read it to know.
                if which == "kb" or domain.web:
                    gaps.append(f"collection {name!r} does not exist")
                continue
            collection = client.get_collection(name, embedding_function=None)
            if which == "kb" and not domain.has_corpus:
                gap = stored_gap(collection)
                if gap is not None:
                    gaps.append(gap)
                continue
            source = domain.source(which)
            if _source_is_current(collection, source, words):
                continue
            planned = planned_chunks(domain.corpus if which == "kb" else domain.web, words)
            gap = ingest_gap(collection, planned)
            if gap is not None:
                gaps.append(gap)
            elif source is not None:
                _write_manifest(collection, _manifest(planned, source_record(source, words)))
    return gaps


def stored_gap(collection) -> str | None:
    """Why ``collection`` is not complete by its manifest alone (no documents to compare with), or None."""
    found, count = collection.metadata or {}, collection.count()
    if MANIFEST_HASH not in found:
        return (
            f"collection {collection.name!r} holds {count} chunks and no ingest manifest "
            "(an ingest that did not finish, or one made before ingest manifests)"
        )
    if count != found.get(MANIFEST_CHUNKS):
        return f"collection {collection.name!r} holds {count} of {found.get(MANIFEST_CHUNKS)} chunks"
    return None


def stored_passage(cid: str, text: str | None, meta: dict | None, rank: int, similarity: float) -> Passage:
    """A stored chunk (its id, text and metadata as :func:`planned_chunks` wrote them) as a
    :class:`~crag_dspy.protocols.Passage` at ``rank``, with the given cosine ``similarity``."""
    meta = meta or {}
    return Passage(
        id=cid,
        doc_id=str(meta.get("doc_id", cid)),
        title=str(meta.get("title", "")),
        text=text or "",
        rank=rank,
        similarity=similarity,
        source=meta.get("source"),
        url=meta.get("url"),
        page=int(meta["page"]) if meta.get("page") is not None else None,
        section=meta.get("section"),
    )


def open_retrievable(client: chromadb.ClientAPI, collection: str, embedder: Embedder):
    """Collection ``collection`` to retrieve from: a :class:`StoreError` when it is missing, was
    embedded with another model, or is empty (each says what to run)."""
    with store_errors(f"opening collection {collection!r}"):
        found = get_collection(client, collection, embedder, create=False)
        empty = found.count() == 0
    if empty:
        raise StoreError(
            f"Collection {collection!r} is empty: run `crag-dspy ingest --domain-dir <domain dir>` first"
        )
    return found


class ChromaRetriever:
    """:class:`~crag_dspy.protocols.Retriever` over one Chroma collection (cosine similarity)."""

    def __init__(self, client: chromadb.ClientAPI, collection: str, embedder: Embedder):
        self.name = f"chroma:{collection}"
        self._collection = open_retrievable(client, collection, embedder)
        self._embedder = embedder

    def count(self) -> int:
        return self._collection.count()

    def retrieve(self, query: str, k: int) -> list[Passage]:
        if k < 1:
            return []
        result = self._collection.query(
            query_embeddings=self._embedder.encode([query]),
            n_results=k,
            include=["documents", "metadatas", "distances"],
        )
        found = zip(result["ids"][0], result["documents"][0], result["metadatas"][0], result["distances"][0])
        return [
            stored_passage(cid, text, meta, rank, 1.0 - float(distance))
            for rank, (cid, text, meta, distance) in enumerate(found)
        ]
