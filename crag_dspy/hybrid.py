"""Hybrid retrieval: the dense Chroma ranking fused with a BM25 ranking of the same chunks.

A small dense embedder (the bundled all-MiniLM-L6-v2) ranks chunks by meaning and is weak on the strings
users copy from their documents: option names (``usbhid.quirks``), flags (``--max-connections``), error
codes (``E0425``), version numbers (``3.11``). BM25 over tokens that keep those identifiers whole finds
them; reciprocal rank fusion (RRF, Cormack et al. 2009) merges the two rankings without having to make
their scores comparable.

The BM25 index (``bm25s``) is built from the collection's own stored chunks, so it needs no change to
ingest and works the same on the embedded store and a Chroma server. It is cached on disk under a key
that is the ingest manifest's content hash (:data:`~crag_dspy.store.MANIFEST_HASH`, the hash of the
chunk ids, which hash each chunk's content): a restart loads it, a changed collection gets a new key
and a new index. Chosen with ``Settings.retrieval = "hybrid"`` (``CRAG_RETRIEVAL=hybrid``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chromadb

from .embeddings import Embedder
from .protocols import Passage, passage_heading
from .settings import Settings
from .store import (
    MANIFEST_CHUNKS,
    MANIFEST_HASH,
    check_none_held,
    content_hash,
    open_retrievable,
    query_rows,
    reply_rows,
    store_errors,
    stored_pages,
    stored_passage,
)

__all__ = [
    "RRF_K",
    "TOKENIZER_VERSION",
    "HybridRetriever",
    "bm25_cache_root",
    "reciprocal_rank_fusion",
    "tokenize",
]

log = logging.getLogger(__name__)

RRF_K = 60
"""The usual RRF constant: a document's fused score is the sum of ``1 / (RRF_K + rank)`` over rankings."""

TOKENIZER_VERSION = 1
"""Part of the cache key: an index built by another tokenizer must not be loaded."""

# A small English stopword list: question words and function words that BM25 would otherwise match in
# every chunk. Kept short on purpose: content words (even common ones) can carry a question.
_STOPWORDS = frozenset(
    """a about after all also am an and any are as at be been before being but by can could did do does
    for from had has have he her him his how i if in into is it its me my no not of on or our she should
    so than that the their them then there these they this those to was we were what when where which
    while who whom whose why will with would you your""".split()  # noqa: SIM905 - a word list reads better
)

# A raw token: word characters and the joiners identifiers are written with. The comma, brackets,
# quotes and whitespace end a token, so "(usbhid.quirks=0x1:0x2)," yields "usbhid.quirks=0x1:0x2".
_RAW = re.compile(r"[\w.\-+#/:=@]+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # "1,240" is the number 1240, as normalize_answer reads it
_POSSESSIVE = re.compile(r"'s\b")
_TRAILING = ".,:;/=-@"  # sentence punctuation after a token; "+" and "#" stay ("C++", "C#")
_LEADING = ".-:/=+@#"
_PIECES = re.compile(r"[=:/@]")  # "option=value", "a:b", paths: each piece may be an identifier itself
_ATOMS = re.compile(r"[\W_]+")


def _keep(token: str) -> bool:
    # Single letters are mostly what splitting left of "e.g." or "don't"; single digits may be answers.
    return bool(token) and token not in _STOPWORDS and not (len(token) == 1 and token.isalpha())


def tokenize(text: str) -> list[str]:
    """BM25 tokens of ``text``: lower-cased words, with identifiers kept whole *and* split.

    ``--max-connections=10`` gives ``--max-connections=10``, ``max-connections=10``, ``max-connections``,
    ``max``, ``connections`` and ``10``; ``usbhid.quirks`` gives itself, ``usbhid`` and ``quirks``;
    ``Python 3.11.`` gives ``python``, ``3.11``, ``3`` and ``11``. A query that names an identifier
    exactly matches every form, one that names a part matches the part. Stopwords are dropped.
    """
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    text = _POSSESSIVE.sub("", _THOUSANDS.sub("", text))
    tokens: list[str] = []
    for raw in _RAW.findall(text):
        written = raw.rstrip(_TRAILING)
        bare = written.lstrip(_LEADING)
        if not bare:
            continue
        forms = [bare]
        if written != bare and written.startswith("-"):
            forms.insert(0, written)  # a command-line flag as written: the exact form counts more
            forms.append(_PIECES.split(written)[0].rstrip(_TRAILING))  # and without its "=value"
        if _PIECES.search(bare):
            forms += [p.strip(_TRAILING + _LEADING) for p in _PIECES.split(bare)]
        forms += _ATOMS.split(bare)
        tokens += [form for form in dict.fromkeys(forms) if _keep(form)]
    return tokens


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Ids of several rankings (best first) by fused score ``sum(1 / (k + rank))``, rank 1-based.

    Ties (the same score) go to the id with the better best rank, then to the earlier ranking (the
    first one given is preferred: here the dense one, whose similarity the graders read).
    """
    scores: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}
    for which, ranking in enumerate(rankings):
        for rank, item in enumerate(dict.fromkeys(ranking), start=1):  # a repeated id counts once
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
            best[item] = min(best.get(item, (rank, which)), (rank, which))
    return sorted(scores.items(), key=lambda pair: (-pair[1], best[pair[0]]))


def bm25_cache_root(settings: Settings) -> Path:
    """Where BM25 indexes of ``settings``' store are cached: ``<chroma_path>/bm25`` beside an embedded
    store (deleting the store deletes them), ``<cache_dir>/bm25/<host>-<port>`` for a Chroma server."""
    if settings.chroma_host:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", settings.chroma_host)
        return settings.cache_dir / "bm25" / f"{host}-{settings.chroma_port}"
    return settings.resolved_chroma_path / "bm25"


# --- the BM25 index ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Index:
    """A built BM25 index over a collection's chunks, and the content key it was built for."""

    key: str
    ids: tuple[str, ...]
    bm25: Any  # bm25s.BM25
    id_set: frozenset[str]

    def top(self, tokens: list[str], n: int) -> list[str]:
        """The ``n`` best-scoring chunk ids for the query ``tokens``; chunks sharing no token are left
        out (their BM25 score is 0, and ranking them would only add noise to the fusion)."""
        import numpy as np

        token_ids = self.bm25.get_tokens_ids(tokens)
        if not token_ids or not self.ids:
            return []
        scores = self.bm25.get_scores_from_ids(token_ids)
        n = min(n, len(self.ids))
        candidates = np.argpartition(-scores, n - 1)[:n]
        ordered = candidates[np.lexsort((candidates, -scores[candidates]))]  # ties by index: deterministic
        return [self.ids[i] for i in ordered if scores[i] > 0]


_IDS_FILE = "crag_ids.json"


def _bm25s():
    """The bm25s module, imported on first use (dense retrieval never pays for it)."""
    import bm25s

    # bm25s sets its own logger to DEBUG when imported, which would print its progress notes through
    # the application's log handlers; its warnings still get through.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


def _build(key: str, ids: list[str], texts: list[str]) -> _Index:
    bm25 = _bm25s().BM25()
    # Every chunk is indexed, even one without tokens (an empty list): positions must stay the ids'.
    bm25.index([tokenize(text) for text in texts], show_progress=False)
    return _Index(key, tuple(ids), bm25, frozenset(ids))


def _save(index: _Index, folder: Path) -> None:
    """Write ``index`` to ``folder`` atomically (a temporary sibling renamed into place), so a reader
    never sees half an index; another process that saved the same key first wins."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        index.bm25.save(str(tmp), show_progress=False)
        record = {"key": index.key, "tokenizer": TOKENIZER_VERSION, "ids": list(index.ids)}
        (tmp / _IDS_FILE).write_text(json.dumps(record))
        try:
            os.rename(tmp, folder)
        except OSError:  # the folder exists: the same key's index, saved by another process meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load(folder: Path, key: str) -> _Index | None:
    """The index saved in ``folder`` for ``key``, or None when there is none or it cannot be read (then
    it is rebuilt: a cache is never a reason to fail)."""
    if not (folder / _IDS_FILE).is_file():
        return None
    try:
        record = json.loads((folder / _IDS_FILE).read_text())
        if record.get("key") != key or record.get("tokenizer") != TOKENIZER_VERSION:
            return None
        bm25 = _bm25s().BM25.load(str(folder), show_progress=False)
        ids = tuple(record["ids"])
        if bm25.scores["num_docs"] != len(ids):
            return None
        return _Index(key, ids, bm25, frozenset(ids))
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache folder is rebuilt
        log.warning("BM25 cache %s is unreadable (%s); rebuilding it", folder, exc)
        return None


def _remove_stale(root: Path, collection: str, keep: Path) -> None:
    """Drop the indexes of older contents of ``collection``: each is as large as the index itself."""
    pattern = re.compile(rf"^{re.escape(collection)}-[0-9a-f]{{16}}$")
    for folder in root.iterdir() if root.is_dir() else ():
        if folder != keep and pattern.match(folder.name):
            shutil.rmtree(folder, ignore_errors=True)


# --- the retriever ----------------------------------------------------------------------------------


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


class HybridRetriever:
    """:class:`~crag_dspy.protocols.Retriever` over one Chroma collection: the dense (cosine) ranking
    and a BM25 ranking of the same chunks, fused by reciprocal rank.

    Each side proposes ``max(candidates, 4 * k)`` chunks; the ``k`` best by fused score are returned
    in that order, and each passage's ``similarity`` is still its dense cosine similarity to the query
    (computed from its stored embedding when only BM25 found it), since graders read it as a signal.

    ``cache_dir`` (see :func:`bm25_cache_root`) keeps built indexes across restarts, one folder per
    collection content; None keeps the index in memory only. Safe for concurrent :meth:`retrieve`
    calls: the index is immutable once built and replaced as a whole, under a lock, when the collection
    is found to have changed (a dense hit the index does not know).
    """

    def __init__(
        self,
        client: chromadb.ClientAPI,
        collection: str,
        embedder: Embedder,
        *,
        cache_dir: Path | None = None,
        rrf_k: int = RRF_K,
        candidates: int = 20,
        page_size: int | None = None,
    ):
        self.name = f"hybrid:{collection}"
        self.collection_name = collection
        self.rrf_k, self.candidates, self.page_size = rrf_k, candidates, page_size
        self.cache_dir = cache_dir
        self._client, self._embedder = client, embedder
        self._collection = open_retrievable(client, collection, embedder)
        self._lock = threading.Lock()
        self.built = False
        """Whether the current index was built here (False: loaded from the cache)."""
        with store_errors(f"indexing collection {collection!r} for BM25"):
            self._index = self._open_index(self._content_key())

    def count(self) -> int:
        return self._collection.count()

    # -- the index -----------------------------------------------------------------------------------

    def _content_key(self) -> str:
        """The collection's content hash: its manifest's when the manifest is complete, else the hash of
        the ids it holds (the same function, so a finished ingest gives the same key either way)."""
        # Fetched again, not self._collection.metadata: that is a snapshot taken when it was opened.
        collection = self._client.get_collection(self.collection_name, embedding_function=None)
        found = collection.metadata or {}
        if MANIFEST_HASH in found and found.get(MANIFEST_CHUNKS) == collection.count():
            return str(found[MANIFEST_HASH])
        return content_hash(cid for page in stored_pages(self._collection, include=[]) for cid in page["ids"])

    def _folder(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / f"{self.collection_name}-{key[:16]}"

    def _open_index(self, key: str) -> _Index:
        folder = self._folder(key)
        if folder is not None:
            index = _load(folder, key)
            if index is not None:
                self.built = False
                log.debug("BM25 index of %r loaded from %s", self.collection_name, folder)
                return index
        ids, texts = [], []
        for page in stored_pages(self._collection, ["documents", "metadatas"], self.page_size):
            for cid, text, meta in zip(page["ids"], page["documents"], page["metadatas"]):
                ids.append(cid)
                # What the dense side embeds (planned_chunks): the heading gives a chunk its subject.
                meta = meta or {}
                texts.append(
                    f"{passage_heading(str(meta.get('title') or ''), meta.get('section'))}\n{text or ''}"
                )
        # The key of what was read: a collection changed between the key and the read is saved under
        # the hash of what the index holds, and the next check sees the difference.
        index = _build(content_hash(ids), ids, texts)
        self.built = True
        log.info("BM25 index of %r built over %d chunks", self.collection_name, len(ids))
        folder = self._folder(index.key)
        if folder is not None and self.cache_dir is not None:
            try:
                _save(index, folder)
                _remove_stale(self.cache_dir, self.collection_name, folder)
            except OSError as exc:  # a read-only or full disk costs the next start a rebuild, nothing more
                log.warning("cannot cache the BM25 index in %s: %s", folder, exc)
        return index

    def refresh(self) -> bool:
        """Rebuild (or load) the index when the collection's content changed; whether it did."""
        with self._lock, store_errors(f"indexing collection {self.collection_name!r} for BM25"):
            key = self._content_key()
            if key == self._index.key:
                return False
            self._index = self._open_index(key)
            return True

    # -- retrieval -----------------------------------------------------------------------------------

    def retrieve(self, query: str, k: int) -> list[Passage]:
        if k < 1:
            return []
        n = max(self.candidates, 4 * k)
        vector = self._embedder.encode([query])[0]
        with store_errors(f"querying collection {self.collection_name!r}"), reply_rows(n):
            result = self._collection.query(
                query_embeddings=[vector], n_results=n, include=["documents", "metadatas", "distances"]
            )
        dense = {cid: (text, meta, sim) for cid, text, meta, sim in query_rows(self.collection_name, result)}
        if not dense:
            check_none_held(self._collection)
        index, tokens = self._index, tokenize(query)
        if not dense.keys() <= index.id_set and self.refresh():
            index = self._index  # chunks the index did not know: the collection changed under it
        fused = [cid for cid, _ in reciprocal_rank_fusion([list(dense), index.top(tokens, n)], self.rrf_k)]
        chosen, vanished = self._with_texts(fused, k, dense, vector)
        if vanished:
            self.refresh()  # chunks deleted since the index was built: the next question uses a fresh one
        return [
            stored_passage(cid, text, meta, rank, sim) for rank, (cid, text, meta, sim) in enumerate(chosen)
        ]

    def _with_texts(
        self, fused: list[str], k: int, dense: dict[str, tuple], vector: Sequence[float]
    ) -> tuple[list[tuple[str, str | None, dict | None, float]], bool]:
        """The first ``k`` of ``fused`` that the collection holds, with text, metadata and cosine
        similarity (dense hits have them; BM25-only hits are fetched with their embeddings), and whether
        some BM25 hit is gone from the collection."""
        chosen: list[tuple[str, str | None, dict | None, float]] = []
        start, vanished = 0, False
        while len(chosen) < k and start < len(fused):
            window = fused[start : start + k - len(chosen)]
            start += len(window)
            wanted = [cid for cid in window if cid not in dense]
            fetched: dict[str, tuple] = {}
            if wanted:
                with store_errors(f"reading collection {self.collection_name!r}"):
                    got = self._collection.get(ids=wanted, include=["documents", "metadatas", "embeddings"])
                for cid, text, meta, emb in zip(
                    got["ids"], got["documents"], got["metadatas"], got["embeddings"]
                ):
                    fetched[cid] = (text, meta, _cosine(vector, list(map(float, emb))))
            for cid in window:
                hit = dense.get(cid) or fetched.get(cid)
                if hit is not None:
                    chosen.append((cid, *hit))
                else:  # deleted since the index was built: the next one moves up
                    vanished = True
        return chosen, vanished
