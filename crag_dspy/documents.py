"""A CRAG over your own files, from Python: :func:`ingest` and :func:`from_documents`.

    >>> import crag_dspy
    >>> crag = crag_dspy.from_documents("~/handbooks")            # doctest: +SKIP
    >>> pred = crag(question="How many passengers may the MV Corvina carry?")  # doctest: +SKIP
    >>> pred.answer, [c.label for c in pred.citations]          # doctest: +SKIP
    ('412 passengers', ['fleet-handbook.pdf, p. 2'])

The files are read by :mod:`crag_dspy.loaders` (PDF, HTML, DOCX, Markdown, text), chunked with their
pages and sections, embedded with the bundled model and stored in the embedded Chroma store (or the
server :class:`~crag_dspy.settings.Settings` names), in a collection named after the folder and its
path, so two folders called ``docs`` never share one. Ingest is idempotent: a second call embeds
nothing new and a changed file replaces its own chunks only. Web search is off unless given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import dspy

from .app import app_lm, open_backends
from .config import CRAGConfig
from .domain import Domain, DomainConfig, DomainDataError
from .embeddings import Embedder
from .lm import build_lm
from .loaders import DEFAULT_MAX_DOCUMENT_MB, UnreadableDocumentError, load_document, load_folder
from .module import CRAG
from .protocols import WebSearch
from .settings import Settings
from .store import IngestReport, ingest_domain, open_client
from .web import NoWebSearch

__all__ = ["Ingested", "documents_domain", "from_documents", "ingest"]

Documents = str | Path | Sequence[str | Path]
"""A folder (read recursively), one file, or a list of files and folders."""


def _collection_name(paths: Sequence[Path]) -> str:
    """``<folder name>-<8 hex of the resolved paths>``: readable, and distinct for distinct folders."""
    stem = paths[0].name if len(paths) == 1 else "documents"
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem).strip("-_")[:30] or "documents"
    digest = hashlib.sha256("\n".join(sorted(str(p) for p in paths)).encode()).hexdigest()[:8]
    return f"{stem}-{digest}"


def documents_domain(
    documents: Documents,
    *,
    name: str | None = None,
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_MB * 2**20,
) -> Domain:
    """The files of ``documents`` read into an in-memory :class:`~crag_dspy.domain.Domain` (no QA, no
    web). A folder's document ids are paths relative to it; a file's id is its name. Unreadable files
    of a folder are skipped and listed in ``Domain.skipped``; a file named directly that cannot be read
    is an error, as is nothing readable at all; so is a file larger than ``max_document_bytes``, or whose
    text would unpack to more (in a folder: skipped)."""
    given = [documents] if isinstance(documents, (str, Path)) else list(documents)
    if not given:
        raise DomainDataError("no documents given: pass a folder, a file, or a list of them")
    paths = [Path(p).expanduser().resolve() for p in given]
    docs, skipped = [], []
    for path in paths:
        if path.is_dir():
            folder = load_folder(path, max_bytes=max_document_bytes)
            prefix = f"{path.name}/" if len(paths) > 1 else ""
            docs += [doc.model_copy(update={"id": prefix + doc.id}) for doc in folder.docs]
            skipped += folder.skipped
        elif path.is_file():
            # Raises, naming the file: the user asked for this one.
            docs.append(load_document(path, max_bytes=max_document_bytes))
        else:
            raise DomainDataError(f"{path}: no such file or folder")
    if not docs:
        why = f": every file was unreadable: {'; '.join(skipped)}" if skipped else " (no readable files)"
        raise UnreadableDocumentError(f"no documents to ingest in {', '.join(map(str, paths))}{why}")
    ids = [doc.id for doc in docs]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise DomainDataError(f"two documents have the id {duplicate!r}: give them in different folders")
    config = DomainConfig(name=name or _collection_name(paths))
    return Domain(None, config, docs, [], [], [], skipped)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Ingested:
    """What :func:`ingest` did: the collection's name, its report, and the files it skipped (why)."""

    name: str
    report: IngestReport
    skipped: list[str]


def ingest(
    documents: Documents,
    *,
    name: str | None = None,
    settings: Settings | None = None,
    progress: bool = True,
) -> Ingested:
    """Read, chunk, embed and store ``documents`` (a folder, a file, or a list of them) so that
    :func:`from_documents` with the same ``documents`` and ``name`` answers from them at once.

    ``settings`` names the store (``chroma_path`` or ``chroma_host``) and the embedding model; the
    defaults are the embedded store under ``~/.cache/crag-dspy`` and the bundled model.
    """
    settings = settings or Settings()
    domain = documents_domain(documents, name=name, max_document_bytes=settings.max_document_bytes)
    client = open_client(settings)
    (report,) = ingest_domain(client, domain, Embedder(settings.embedding_model), progress=progress)
    return Ingested(domain.name, report, list(domain.skipped))


def from_documents(
    documents: Documents,
    *,
    lm: dspy.BaseLM | str | None = None,
    name: str | None = None,
    web_search: WebSearch | None = None,
    config: CRAGConfig | None = None,
    settings: Settings | None = None,
    progress: bool = True,
) -> CRAG:
    """A CRAG that answers from ``documents`` (a folder, a file, or a list of them), ingesting what
    the store does not hold yet.

    ``lm`` is a DSPy LM, a LiteLLM model string (``"openai/gpt-4o-mini"``), or None: the LM given to
    ``dspy.configure``, else the embedded model. ``web_search`` is off unless given (e.g.
    ``crag_dspy.web.TavilyWebSearch(...)``): an INCORRECT route then answers from the internal knowledge
    the strip filter kept. ``config`` defaults to ``settings.config`` (the uncompiled defaults).
    """
    settings = settings or Settings()
    if isinstance(lm, str):  # named here, so built here, whatever dspy.configure holds
        lm = build_lm(settings.model_copy(update={"lm": lm}))
    domain = documents_domain(documents, name=name, max_document_bytes=settings.max_document_bytes)
    backends = open_backends(settings, domain=domain, progress=progress)
    web = web_search if web_search is not None else NoWebSearch("web search is off (from_documents)")
    return CRAG(backends.retriever(), web, config or settings.config, lm=app_lm(settings, lm))
