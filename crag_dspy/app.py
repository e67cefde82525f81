"""Assemble a ready CRAG program from :class:`~crag_dspy.settings.Settings` (the CLI and apps use this)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chromadb
import dspy

from .domain import Domain, DomainDataError, check_domain_name, load_domain
from .embeddings import Embedder
from .hybrid import HybridRetriever, bm25_cache_root
from .lm import build_lm
from .module import CRAG
from .program import ProgramError, apply_program, check_dataset, check_domain, read_program
from .protocols import Retriever, WebSearch, WebSearchError
from .settings import DEFAULT_DATA_DIR, Settings
from .store import (
    ChromaRetriever,
    StoreError,
    collection_names,
    ingest_domain,
    ingest_gaps,
    open_client,
    store_errors,
    stored_gap,
)
from .web import NoWebSearch, OfflineWebSearch, TavilyWebSearch, tavily_api_key

__all__ = [
    "Backends",
    "LoadedProgram",
    "app_lm",
    "assemble",
    "build_crag",
    "build_web_search",
    "check_web_search",
    "load_program",
    "open_backends",
    "open_program",
    "program_settings",
    "resolve_program",
]

log = logging.getLogger(__name__)


@dataclass
class Backends:
    """The storage side of a domain: Chroma client, embedder and the domain (its files read on use)."""

    settings: Settings
    domain: Domain
    client: chromadb.ClientAPI
    embedder: Embedder
    has_web: bool | None = None
    """Whether the store holds the domain's offline web collection (None: the domain has web documents)."""

    @property
    def web_available(self) -> bool:
        return self.domain.has_web if self.has_web is None else self.has_web

    def retriever(self, which: str = "kb") -> ChromaRetriever | HybridRetriever:
        """The retriever of the internal knowledge (``kb``, ranked as ``settings.retrieval`` says) or of
        the offline web stand-in (``web``: dense, as it stands in for a search engine's own ranking)."""
        kb, web = collection_names(self.domain.name)
        if which == "kb" and self.settings.retrieval == "hybrid":
            cache = bm25_cache_root(self.settings)
            return HybridRetriever(self.client, kb, self.embedder, cache_dir=cache)
        return ChromaRetriever(self.client, kb if which == "kb" else web, self.embedder)


def open_backends(
    settings: Settings,
    *,
    ingest_if_missing: bool = True,
    progress: bool = True,
    domain: Domain | None = None,
) -> Backends:
    """Open the domain (unless given, lazily from ``settings``) and Chroma; ingest the domain first
    unless its collections hold all its chunks by their ingest manifests (never ingested, an ingest that
    did not finish, changed data), and say so in one log line.

    The corpus is parsed only when the manifests do not settle it (:func:`~crag_dspy.store.ingest_gaps`).
    A domain folder without a corpus is served from the store alone, as ingested, when its collection's
    manifest says the ingest finished.
    """
    domain = domain or load_domain(
        settings.resolved_domain_dir, lazy=True, max_document_bytes=settings.max_document_bytes
    )
    client = open_client(settings)
    embedder = Embedder(settings.embedding_model)
    gaps = ingest_gaps(client, domain)
    if not domain.has_corpus:
        return _store_only(settings, domain, client, embedder, gaps)
    if gaps:
        if not ingest_if_missing:
            raise StoreError(
                f"Domain {domain.name!r} is not ingested completely ({'; '.join(gaps)}): "
                f"run `crag-dspy ingest --domain-dir {domain.root}`"
            )
        # Upserts are idempotent by chunk id: chunks already stored are kept, not embedded again.
        log.warning("domain %r: %s; ingesting it now", domain.name, "; ".join(gaps))
        ingest_domain(client, domain, embedder, progress=progress)
    return Backends(settings, domain, client, embedder)


def _store_only(
    settings: Settings, domain: Domain, client: chromadb.ClientAPI, embedder: Embedder, gaps: list[str]
) -> Backends:
    """Backends of a domain folder without a corpus: its collections as a finished ingest left them."""
    if gaps:
        raise StoreError(
            f"Domain {domain.name!r} has no corpus in {domain.root} (corpus.jsonl or corpus/), and the store "
            f"does not hold a finished ingest of it ({'; '.join(gaps)}): ingest it from a folder with the "
            "corpus, or point --chroma-host/--chroma-path at the store that holds it"
        )
    kb, web = collection_names(domain.name)
    with store_errors("listing the collections"):
        present = {c if isinstance(c, str) else c.name for c in client.list_collections()}
        has_web = domain.has_web or (
            web in present and stored_gap(client.get_collection(web, embedding_function=None)) is None
        )
    log.warning(
        "domain %r: no corpus in %s; answering from the store's collection %r as it was ingested%s",
        domain.name,
        domain.root,
        kb,
        f" (web: {web!r})" if has_web else "",
    )
    return Backends(settings, domain, client, embedder, has_web=has_web)


def check_web_search(settings: Settings) -> None:
    """Refuse a web search asked for by name that cannot run (Tavily without its key), before any work.

    Running on without it would change every answer behind a warning. A missing key is set-up, refused
    as an LM's missing key is; a search that fails later, per question, degrades and the trace says so.
    """
    if settings.web_search == "tavily":
        try:
            tavily_api_key()
        except WebSearchError as exc:
            raise ValueError(
                f"web search 'tavily': {exc}, or choose another (--web-search offline or none, "
                "CRAG_WEB_SEARCH)"
            ) from None


def build_web_search(settings: Settings, backends: Backends) -> WebSearch:
    choice = settings.web_search
    if choice == "auto":
        choice = (
            "tavily"
            if os.environ.get("TAVILY_API_KEY")
            else ("offline" if backends.web_available else "none")
        )
    if choice == "tavily":
        check_web_search(settings)
        return TavilyWebSearch(timeout_s=settings.web_timeout_s, prefer_domains=settings.web_domains)
    if choice == "offline":
        if not backends.web_available:
            raise StoreError(f"Domain {backends.domain.name!r} has no web.jsonl for the offline web search")
        return OfflineWebSearch(backends.retriever("web"))
    return NoWebSearch()


def app_lm(settings: Settings, lm: dspy.BaseLM | None = None) -> dspy.BaseLM | None:
    """The LM an app's CRAG runs with: ``lm`` when given; None (CRAG then uses ``dspy.settings.lm``
    at call time, as every DSPy module does) when the caller configured one with ``dspy.configure``;
    otherwise the one ``settings`` name, built now, so that the embedded model is never started
    behind the back of a caller who configured an LM."""
    if lm is not None:
        return lm
    if dspy.settings.lm is not None:
        return None
    return build_lm(settings)


def resolve_program(path: str | Path) -> Path:
    """``path``, or for a bundled domain's name (``--program default``) the program JSON that domain
    ships (``data/<name>/program.json``, compiled and kept current with the domain's data)."""
    path = Path(path)
    if path.exists() or path.suffix or len(path.parts) != 1:
        return path
    try:
        name = check_domain_name(str(path))
    except DomainDataError:
        return path  # not a name: read_program reports the missing file
    shipped = DEFAULT_DATA_DIR / name / "program.json"
    if not shipped.is_file():
        raise ProgramError(
            f"{path}: no such program file, and no bundled domain {name!r} ships a program: compile one "
            f"with crag-dspy compile --domain {name}"
        )
    return shipped


def assemble(
    settings: Settings,
    lm: dspy.BaseLM | None = None,
    progress: bool = True,
    *,
    domain: Domain | None = None,
) -> tuple[CRAG, Backends]:
    """Build CRAG and return it with its storage backends (compile and evaluation need both); pass
    ``domain`` when it is loaded already."""
    # The domain first: opening it starts nothing (its data files are read when an ingest needs them),
    # while the embedded LM takes seconds and 1.8 GB. Then the LM: a bad model string or a missing key
    # fails before any indexing.
    domain = domain or load_domain(
        settings.resolved_domain_dir, lazy=True, max_document_bytes=settings.max_document_bytes
    )
    if not _store_may_hold_it(settings):
        # Nothing can be ingested yet: the corpus will be read for the ingest anyway, so a bad file is
        # reported now, before the LM starts and before a store folder is made.
        domain.corpus, domain.web  # noqa: B018 - read and validate now
    check_web_search(settings)
    lm = app_lm(settings, lm)
    backends = open_backends(settings, progress=progress, domain=domain)
    crag = CRAG(
        backends.retriever("kb"),
        build_web_search(settings, backends),
        backends.domain.config.crag_config(settings.config),
        lm=lm,
        embedder=backends.embedder,
    )
    return crag, backends


def _store_may_hold_it(settings: Settings) -> bool:
    """Whether a store may already hold the domain: a server, or an embedded store folder that exists."""
    return settings.chroma_host is not None or settings.resolved_chroma_path.exists()


def build_crag(
    settings: Settings | None = None, *, lm: dspy.BaseLM | None = None, progress: bool = True
) -> CRAG:
    """A CRAG program for ``settings`` with real backends: Chroma, the bundled embeddings, web search, LM."""
    return assemble(settings or Settings(), lm, progress)[0]


def load_program(
    path: str | Path,
    *,
    settings: Settings | None = None,
    lm: dspy.BaseLM | None = None,
    retriever: Retriever | None = None,
    web_search: WebSearch | None = None,
    progress: bool = True,
    force: bool = False,
) -> CRAG:
    """Rebuild CRAG and apply a compiled program JSON (demos, instructions, thresholds, config).

    With ``retriever`` and ``web_search`` given, no store is opened (bring your own backends). Otherwise
    the program's own (bundled) domain is used unless ``settings`` names one, and a program compiled
    for another domain, or on other data than the domain holds now (unless ``force``), is refused:
    thresholds and demos tuned on one domain's data must not transfer silently (a program saved with
    ``crag.save`` names no domain: it runs on the domain ``settings`` name, with a warning). Giving
    only one of the two is an error rather than a backend silently replaced by the domain's store.
    """
    if (retriever is None) != (web_search is None):
        given, missing = ("retriever", "web_search") if web_search is None else ("web_search", "retriever")
        raise ValueError(
            f"load_program got a {given} but no {missing}: give both to bring your own backends "
            "(crag_dspy.web.NoWebSearch() is a web search that is off), or neither to use the domain's"
        )
    if retriever is not None and web_search is not None:
        path = resolve_program(path)
        document = read_program(path)
        settings = settings or Settings()
        crag = CRAG(retriever, web_search, settings.config, lm=app_lm(settings, lm))
        return apply_program(crag, document, Path(path).parent)
    return open_program(
        path, settings, domain_from_program=settings is None, lm=lm, progress=progress, force=force
    ).crag


@dataclass
class LoadedProgram:
    """A ready CRAG and where it came from; ``document`` is None for the uncompiled default program."""

    crag: CRAG
    domain: str
    path: Path | None = None
    document: dict[str, Any] | None = None

    @property
    def compiled(self) -> bool:
        return self.document is not None


def open_program(
    path: str | Path | None,
    settings: Settings | None = None,
    *,
    domain_from_program: bool = True,
    lm: dspy.BaseLM | None = None,
    progress: bool = True,
    force: bool = False,
) -> LoadedProgram:
    """The program an app serves: the compiled program JSON at ``path``, or without one the uncompiled
    default program built from ``settings``.

    With ``domain_from_program`` the program's recorded domain *name* replaces the domain in
    ``settings`` (:func:`program_settings`); every other setting (store, LM, web search) is kept. The
    JSON is read and validated, and the domain opened and checked against it (name, dataset hashes
    unless ``force``: the files' sha256, not a parse), before any model or store is started.
    """
    settings = settings or Settings()
    if path is None:
        crag, backends = assemble(settings, lm, progress)
        return LoadedProgram(crag, backends.domain.name)
    path = resolve_program(path)
    document = read_program(path)
    if domain_from_program:
        settings = program_settings(document, settings, path)
    domain = load_domain(
        settings.resolved_domain_dir, lazy=True, max_document_bytes=settings.max_document_bytes
    )
    check_domain(document, domain.name, path)
    check_dataset(document, domain.file_hashes(), path, force=force)
    crag, backends = assemble(settings, lm, progress, domain=domain)
    return LoadedProgram(
        apply_program(crag, document, Path(path).parent), backends.domain.name, Path(path), document
    )


def program_settings(document: dict[str, Any], settings: Settings, path: str | Path) -> Settings:
    """``settings`` on the bundled domain a (validated) program was compiled for; ``settings`` as they
    are for a program that names no domain (written by ``crag.save``): it runs on the domain they name
    (``--domain``/``--domain-dir``, ``CRAG_DOMAIN``, else the bundled default), and
    :func:`~crag_dspy.program.check_domain` says it was not checked.

    Only the domain's *name* is taken from the program, never a folder: a program file must not decide
    which folder is read and indexed (a domain elsewhere is named by the caller, with --domain-dir).
    """
    name = document["metadata"].get("domain")
    if name is None:
        return settings
    chosen = settings.model_copy(update={"domain": name, "domain_dir": None})
    if not chosen.resolved_domain_dir.is_dir():
        raise ProgramError(
            f"{path}: program was compiled for domain {name!r}, which is not a bundled domain (no folder "
            f"{chosen.resolved_domain_dir}); give its folder with --domain-dir"
        )
    return chosen
