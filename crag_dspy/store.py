"""Chroma storage: client selection (embedded or server), idempotent ingestion, and retrieval."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import chromadb
import httpcore
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
    "MAX_STORE_REPLY_BYTES",
    "MAX_STORE_ROW_BYTES",
    "ChromaRetriever",
    "IngestReport",
    "StoreError",
    "check_none_held",
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
    "query_rows",
    "reply_rows",
    "source_record",
    "store_errors",
    "stored_gap",
    "stored_pages",
    "stored_passage",
]

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """Chroma is unreachable, or a collection is missing or was built with another embedding model."""


MAX_STORE_REPLY_BYTES = 16 * 1024 * 1024
"""The largest reply read from a Chroma server (16 MB), unless the request bounds it lower
(:func:`reply_rows`). Parsing a reply costs up to about 25 times its size (a 124 MB reply of tiny strings
took 3 GB, and crashed a capped process), so the cap is what bounds memory: 400 MB at worst. No real
reply comes near it: a collection's chunks are read in pages (:func:`stored_pages`), a query's k passages
are a few hundred KB. A larger reply fails as a :class:`StoreError` naming the server and the limit."""

MAX_STORE_ROW_BYTES = 128 * 1024
"""The most one stored chunk takes in a reply (128 KB): its text (at most 24,000 characters, the chunker's
bound at the largest ``chunk_words``, 4 bytes each in UTF-8), its metadata, id and distance. A query of
``k`` results, or a page of ``k`` chunks, reads at most ``k`` times this (:func:`reply_rows`)."""

_REPLY_ENVELOPE_BYTES = 64 * 1024
"""What a reply of rows holds besides the rows (the column names, the ``included`` list, framing)."""

ID_PAGE_ROWS = 50_000
"""Chunk ids listed a request (:func:`stored_pages` without documents): about 2 MB a reply."""

CHUNK_PAGE_ROWS = MAX_STORE_REPLY_BYTES // MAX_STORE_ROW_BYTES
"""Chunks read a request with their texts (:func:`stored_pages`): a page of the largest chunks fits in the
reply cap."""


class _ReplyTooSlow(httpcore.ReadTimeout):
    """A Chroma request that did not finish (connect, headers and body) within ``CRAG_STORE_TIMEOUT_S``."""


class _ReplyRefused(httpcore.ReadError):
    """A Chroma reply past :data:`MAX_STORE_REPLY_BYTES`, or compressed although none was asked for."""


def _reply_check(
    started: float,
    limit_s: float,
    max_bytes: int,
    too_big: Callable[[], Exception],
    too_slow: Callable[[], Exception],
) -> Callable[[bytes], None]:
    """A check of each chunk of one reply, in order: raises ``too_big()`` once the chunks seen have grown
    past ``max_bytes``, ``too_slow()`` once ``limit_s`` seconds have passed since ``started`` ."""
    size = 0

    def check(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > max_bytes:
            raise too_big()
        if time.monotonic() - started > limit_s:
            raise too_slow()

    return check


@dataclass
class _Deadline:
    """One Chroma request's limits: every byte of it within ``limit_s`` of its start, at most ``max_bytes``
    read (:data:`MAX_STORE_REPLY_BYTES`, or a lower bound the request set: :func:`reply_rows`). Messages
    name the server (``where``), the limit and the setting."""

    where: str
    limit_s: float
    started: float
    max_bytes: int
    bound: str

    def __post_init__(self) -> None:
        self.check = _reply_check(
            self.started,
            self.limit_s,
            self.max_bytes,
            lambda: _ReplyRefused(
                f"reply of the server {self.where} larger than {self.max_bytes / 2**20:.3g} MB ({self.bound})"
            ),
            self.too_slow,
        )

    def too_slow(self) -> _ReplyTooSlow:
        return _ReplyTooSlow(
            f"the server {self.where} gave no answer within {self.limit_s:g} s (CRAG_STORE_TIMEOUT_S)"
        )

    def left(self) -> float:
        return self.started + self.limit_s - time.monotonic()

    def clamp(self, timeout: float | None) -> float:
        """``timeout`` (one socket operation's) cut to the time this request has left; past it, fail."""
        left = self.left()
        if left <= 0:
            raise self.too_slow()
        return left if timeout is None else min(timeout, left)


_REPLY_BOUND: ContextVar[tuple[int, str] | None] = ContextVar("crag_dspy_store_reply_bound", default=None)
"""The reply size (bytes, and what sets it) of the Chroma requests made in this context, when lower than
:data:`MAX_STORE_REPLY_BYTES`."""


@contextmanager
def reply_rows(rows: int) -> Iterator[None]:
    """Bound the replies of the Chroma requests in the block to ``rows`` stored chunks
    (:data:`MAX_STORE_ROW_BYTES` each): a query of ``rows`` results, a page of ``rows`` chunks."""
    most = rows * MAX_STORE_ROW_BYTES + _REPLY_ENVELOPE_BYTES
    bound = f"{rows} results of {MAX_STORE_ROW_BYTES // 1024} KB: MAX_STORE_ROW_BYTES"
    token = _REPLY_BOUND.set((most, bound) if most < MAX_STORE_REPLY_BYTES else None)
    try:
        yield
    finally:
        _REPLY_BOUND.reset(token)


def _reply_bound() -> tuple[int, str]:
    """The most bytes a Chroma reply made now may have, and what sets it (the setting a message names)."""
    return _REPLY_BOUND.get() or (MAX_STORE_REPLY_BYTES, "MAX_STORE_REPLY_BYTES")


_DEADLINE: ContextVar[_Deadline | None] = ContextVar("crag_dspy_store_deadline", default=None)
"""The Chroma request whose bytes the socket operations in this context (thread or task) move."""


@contextmanager
def _within(deadline: _Deadline) -> Iterator[None]:
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _clamped(timeout: float | None) -> float | None:
    """``timeout`` (one socket operation's) cut to the time the current request has left (:class:`_Deadline`)."""
    deadline = _DEADLINE.get()
    return timeout if deadline is None else deadline.clamp(timeout)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection's socket whose every read and write is bounded by the request it serves now (a kept-alive
    connection serves several): the timeout httpcore passes is per operation, the request's is total."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        deadline = _DEADLINE.get()
        if deadline is None:
            return self._inner.read(max_bytes, timeout)
        try:
            data = self._inner.read(max_bytes, deadline.clamp(timeout))
        except httpcore.ReadTimeout as exc:
            if deadline.left() <= 0:  # the request's deadline, not the socket's own timeout: say which
                raise deadline.too_slow() from exc
            raise
        deadline.check(data)  # raw bytes: head, body, chunk framing and trailers all count
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamped(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None):
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with its connections' socket operations bounded (:class:`_DeadlineStream`)."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        connected = self._inner.connect_tcp(host, port, _clamped(timeout), local_address, socket_options)
        return _DeadlineStream(connected)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _clamped(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineBody(httpx.SyncByteStream):
    """A reply body read under its request's :class:`_Deadline` (httpx reads it after the transport returns)."""

    def __init__(self, inner: httpx.SyncByteStream, deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        while True:
            with _within(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _DeadlineTransport(httpx.BaseTransport):
    """An httpx transport whose every request, connect, headers and body together, ends within
    ``limit_s`` (:class:`_Deadline`), reads at most :func:`_reply_bound`, and is never compressed
    (the cap counts the bytes received: an inflated reply would escape it)."""

    def __init__(self, inner: httpx.BaseTransport, where: str, limit_s: float) -> None:
        self._inner, self._where, self._limit_s = inner, where, limit_s

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = _Deadline(self._where, self._limit_s, time.monotonic(), *_reply_bound())
        request.headers["Accept-Encoding"] = "identity"
        with _within(deadline):
            response = self._inner.handle_request(request)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            response.close()
            raise _ReplyRefused(
                f"reply of the server {self._where} compressed ({encoding}) although none was asked for"
            )
        assert isinstance(response.stream, httpx.SyncByteStream)  # a sync transport's reply
        response.stream = _DeadlineBody(response.stream, deadline)
        return response

    def close(self) -> None:
        self._inner.close()


def _bound_session(session: httpx.Client, where: str, limit_s: float) -> None:
    """Bound every request of chromadb's ``session`` (:class:`_DeadlineTransport`): its own transports, and
    the proxies' that httpx mounts from the environment, are wrapped, their connection pools' sockets too."""
    session._transport = _bound_transport(session._transport, where, limit_s)
    for pattern, transport in list(session._mounts.items()):
        if transport is not None:
            session._mounts[pattern] = _bound_transport(transport, where, limit_s)


def _bound_transport(transport: httpx.BaseTransport, where: str, limit_s: float) -> httpx.BaseTransport:
    if isinstance(transport, _DeadlineTransport):
        return transport
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is not None and not isinstance(backend, _DeadlineBackend):
        pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
    return _DeadlineTransport(transport, where, limit_s)


class _TimedHttpClient(ChromaClient):
    """``chromadb.HttpClient`` whose every request ends within ``store_timeout_s`` (connect, headers and
    body together) and reads at most :data:`MAX_STORE_REPLY_BYTES`.

    chromadb's HTTP client sets ``httpx.Client(timeout=None)`` and has no setting for one: a server
    that accepts connections and never answers (hung, or stopped with SIGSTOP) held ``ask`` for ever
    and wedged every ``serve`` worker. httpx's timeouts bound each socket operation, not the request: a
    reply dripped a byte every 2 s ran past a 6 s timeout for ever, and one that never ended grew memory
    to gigabytes. The client makes its first request while it is being built (:meth:`get_user_identity`),
    so the limits are set there, on the session all its requests share.
    """

    def __init__(self, settings: Settings) -> None:
        self._crag_timeout = httpx.Timeout(settings.store_timeout_s)
        self._crag_limit_s = settings.store_timeout_s
        self._crag_where = f"{settings.chroma_host}:{settings.chroma_port}"
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
            _bound_session(session, self._crag_where, self._crag_limit_s)
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


def _in_chain(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc``, or the exception it was raised from, that is one of ``kinds`` (chromadb re-raises some
    transport errors as others), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, an HTTP timeout."""
    return _in_chain(exc, (httpx.TimeoutException, httpcore.TimeoutException)) is not None


def _limit_hit(exc: BaseException) -> str | None:
    """What a request's own limits (:class:`_Deadline`) refused, in ``exc``'s chain, or None: it says
    which server, which limit and which setting, where httpx says only "timed out"."""
    found = _in_chain(exc, (_ReplyTooSlow, _ReplyRefused))
    return None if found is None else str(found)


def _reason(exc: Exception, settings: Settings) -> str:
    # httpx says only "timed out": say what the limit was and which setting moves it.
    limit = _limit_hit(exc)
    if limit is not None:
        return limit
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
        limit = _limit_hit(exc)
        if limit is not None:
            raise StoreError(f"Chroma failed while {what}: {limit}") from exc
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
    existing = {cid for page in stored_pages(collection, include=[]) for cid in page["ids"]}
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


def stored_pages(collection, include: list, rows: int | None = None) -> Iterator[dict]:
    """The collection's chunks (``include`` says what of them), a reply of ``rows`` at a time: one reply of
    a large collection would pass the reply cap (:data:`MAX_STORE_REPLY_BYTES`). By default, pages of
    :data:`ID_PAGE_ROWS` ids, or of :data:`CHUNK_PAGE_ROWS` chunks with their texts or metadata."""
    rows = rows or (CHUNK_PAGE_ROWS if include else ID_PAGE_ROWS)
    offset = 0
    while True:
        with reply_rows(rows) if include else nullcontext():
            page = collection.get(include=include, limit=rows, offset=offset)
        if not page["ids"]:
            return
        yield page
        offset += len(page["ids"])


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
        with store_errors(f"querying collection {self._collection.name!r}"), reply_rows(k):
            result = self._collection.query(
                query_embeddings=self._embedder.encode([query]),
                n_results=k,
                include=["documents", "metadatas", "distances"],
            )
        rows = query_rows(self._collection.name, result)
        if not rows:
            check_none_held(self._collection)
        return [
            stored_passage(cid, text, meta, rank, similarity)
            for rank, (cid, text, meta, similarity) in enumerate(rows)
        ]


def check_none_held(collection: Any) -> None:
    """After a query of ``collection`` found nothing: raise :class:`StoreError` unless it holds no chunk.
    A query returns ``min(k, count)`` rows, so none from a filled collection is the server failing (a broken
    index, a proxy answering for it), which was shown as an answered "I don't know", its trace saying every
    passage was graded low when none was retrieved (probe 7)."""
    with store_errors(f"counting collection {collection.name!r}"):
        held = collection.count()
    if held:
        raise StoreError(
            f"Chroma returned no passage from collection {collection.name!r}, which holds {held} chunks: its "
            "query failed on the server (a broken index, or a proxy answering for it?)"
        )


QueryRow = tuple[str, str, dict | None, float]
"""One result of a Chroma query: chunk id, text, metadata and cosine similarity (1 - distance)."""


def query_rows(collection: str, result: Any) -> list[QueryRow]:
    """The results of a Chroma query of one embedding, checked: every one with an id, a text, metadata (an
    object or null) and a finite distance, the columns of equal length. Anything else (a server, or a
    proxy in front of it, sending nulls, strings for numbers, columns cut short) is a :class:`StoreError`
    naming what is wrong: a passage with no text was graded, and a distance of ``"nan"`` ranked, as if
    the store had answered."""

    def malformed(why: str) -> StoreError:
        return StoreError(f"Chroma sent a malformed query result for collection {collection!r}: {why}")

    columns = []
    for key in ("ids", "documents", "metadatas", "distances"):
        value = result.get(key) if isinstance(result, dict) else None
        if not isinstance(value, list) or len(value) != 1 or not isinstance(value[0], list):
            raise malformed(f"{key} is not one list of results")
        columns.append(value[0])
    if len({len(column) for column in columns}) != 1:
        raise malformed(f"ids, documents, metadatas and distances hold {[len(c) for c in columns]} results")
    rows: list[QueryRow] = []
    for number, (cid, text, meta, distance) in enumerate(zip(*columns), start=1):
        if not isinstance(cid, str) or not cid:
            raise malformed(f"result {number} has no id ({_shown(cid)})")
        if not isinstance(text, str) or not text.strip():
            raise malformed(f"result {number} ({cid!r}) has no text ({_shown(text)})")
        if meta is not None and not isinstance(meta, dict):
            raise malformed(f"result {number} ({cid!r}) has metadata that is no object ({_shown(meta)})")
        if (
            isinstance(distance, bool)
            or not isinstance(distance, numbers.Real)
            or not math.isfinite(distance)
        ):
            raise malformed(
                f"result {number} ({cid!r}) has a distance that is no finite number ({_shown(distance)})"
            )
        rows.append((cid, text, meta, 1.0 - float(distance)))
    return rows


def _shown(value: object, limit: int = 60) -> str:
    """``value`` as a message shows it: its repr, cut (a store may send anything, of any size)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
