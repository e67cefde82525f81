"""The domain data format (``data/<domain>/``) and its validating loader.

A domain is a directory holding ``corpus.jsonl`` (internal knowledge), ``web.jsonl`` (the offline web
stand-in), ``qa.jsonl``, ``relevance.jsonl`` and ``domain.toml``. Only ``corpus.jsonl`` (or a folder
``corpus/`` of PDF, HTML, DOCX, Markdown and text files, read by :mod:`crag_dspy.loaders`) is required to
ask questions; the rest feed compilation and evaluation. Every malformed line is reported with its file
and line number; an unreadable file of a corpus folder is skipped and named in ``Domain.skipped``.

``load_domain(root, lazy=True)`` reads only ``domain.toml``: each data file is read and validated when its
field is first used, so an app whose store is up to date (by :meth:`Domain.source`, a fingerprint of the
corpus files that needs no parse) starts without reading the corpus at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import CRAGConfig, describe_validation_error
from .files import not_regular
from .loaders import DEFAULT_MAX_DOCUMENT_MB, SUFFIXES, load_folder, shown_path, utf8_name
from .records import CorpusDoc, DomainDataError, Record

__all__ = [
    "CorpusDoc",
    "Domain",
    "DomainConfig",
    "DomainDataError",
    "QAPair",
    "RelevancePair",
    "SourceFiles",
    "WebDoc",
    "check_domain_name",
    "load_domain",
    "load_jsonl",
]

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{1,40}[a-zA-Z0-9]$")
# A domain *name* (--domain, CRAG_DOMAIN, a program's metadata) names a bundled folder under data/:
# never a path, so that neither a flag nor a program file can make the app read another folder.
_DOMAIN_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$")


def check_domain_name(name: object, what: str = "--domain") -> str:
    """``name`` when it is a domain name (letters, digits, '-' and '_'), else a DomainDataError that
    points to --domain-dir for folders."""
    if isinstance(name, str) and _DOMAIN_NAME.match(name):
        return name
    raise DomainDataError(
        f"{what} {name!r} is not a domain name (letters, digits, '-' and '_', at most 64): "
        "a domain folder is given with --domain-dir"
    )


class WebDoc(CorpusDoc):
    url: str = Field(min_length=1)


class QAPair(Record):
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1, description="gold aliases; ['I don't know'] marks unanswerable")
    split: Literal["train", "val", "test"]
    kind: Literal["kb", "web", "both", "none"] | None = None
    source: str | None = Field(None, description='"synthetic" when python -m optimize.synthesize wrote it')


class RelevancePair(Record):
    question: str = Field(min_length=1)
    passage: str = Field(min_length=1)
    label: Literal[0, 1]
    split: Literal["train", "val"]
    source: str | None = Field(None, description='"synthetic" when python -m optimize.synthesize wrote it')


class DomainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    k: int | None = Field(None, ge=1, le=50)
    chunk_words: int = Field(120, ge=20, le=1000, description="most words per indexed chunk")
    sentences_per_strip: int | None = Field(None, ge=1, le=10)

    def crag_config(self, config: CRAGConfig) -> CRAGConfig:
        """``config`` with the settings this domain fixes (``k``, ``sentences_per_strip``) applied."""
        fixed = {"k": self.k, "sentences_per_strip": self.sentences_per_strip}
        return config.replace(**{key: value for key, value in fixed.items() if value is not None})

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "must be 3-42 characters of letters, digits, '-' or '_' (it names Chroma collections)"
            )
        return value


log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)

# json and tomllib parse nested arrays/objects recursively: a line nested deeper than the interpreter's
# recursion limit raises RecursionError, which is the file's fault, not a bug.
_TOO_DEEP = "nested too deeply to parse (arrays or objects inside each other, past Python's recursion limit)"


def _read_text(path: Path) -> str:
    """``path`` as UTF-8 text; a missing or undecodable file is a :class:`DomainDataError` naming it."""
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark is no part of the text
    except FileNotFoundError:
        raise DomainDataError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise DomainDataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_jsonl(path: Path, model: type[R]) -> list[R]:
    """Parse and validate a JSON-lines file; blank lines are skipped, errors name file and line."""
    records: list[R] = []
    lines = _read_text(path).splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(model.model_validate(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DomainDataError(
                f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        except RecursionError:
            raise DomainDataError(f"{path}:{number}: {_TOO_DEEP}") from None
        except ValidationError as exc:
            raise DomainDataError(f"{path}:{number}: {describe_validation_error(exc, 'line')}") from None
    return records


def _unique_ids(path: Path, docs: list[CorpusDoc]) -> None:
    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            raise DomainDataError(f"{path}: duplicate document id {doc.id!r}")
        seen.add(doc.id)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:  # streamed: a large corpus is never held in memory for its hash
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class SourceFiles:
    """The files one collection is ingested from (``corpus.jsonl``, the files of ``corpus/``, or
    ``web.jsonl``), with two keys that tell whether they changed since an ingest, neither of which parses
    them: ``stat_key`` (sizes and modification times, no read at all) and ``sha256`` (their content).

    For a single file ``sha256`` is the file's own sha256, as in :meth:`Domain.file_hashes`.
    """

    name: str
    """``corpus.jsonl``, ``corpus/`` or ``web.jsonl``"""
    base: Path
    paths: tuple[Path, ...]
    max_bytes: int | None = None
    """Files of ``corpus/`` larger than this are skipped unread, so they are keyed by their size and this
    limit, not hashed: a 5 GB sparse file was hashed (13 s here) on every ingest for nothing."""

    def _content_key(self, path: Path) -> str:
        size = path.stat().st_size
        if self.max_bytes is not None and size > self.max_bytes:
            return f"{size} bytes, over {self.max_bytes}: not read"
        return _sha256(path)

    @cached_property
    def stat_key(self) -> str:
        stats = [(p.relative_to(self.base).as_posix(), p.stat()) for p in self.paths]
        return hashlib.sha256(
            "\n".join(f"{name}\t{st.st_size}\t{st.st_mtime_ns}" for name, st in stats).encode()
        ).hexdigest()

    @cached_property
    def sha256(self) -> str:
        if len(self.paths) == 1 and not self.name.endswith("/"):
            return _sha256(self.paths[0])
        return hashlib.sha256(
            "\n".join(
                f"{p.relative_to(self.base).as_posix()}\t{self._content_key(p)}" for p in self.paths
            ).encode()
        ).hexdigest()


_UNREAD = object()  # a lazily opened domain's field whose file is not read yet
_EMPTY = object()  # the default of a list field (a dataclass default must be hashable)


class _ReadOnUse:
    """A :class:`Domain` list field that a lazily opened domain reads from its file on first use.

    A value given to the constructor is kept as given (and then no :meth:`Domain.source` describes it).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_{name}"

    def __get__(self, domain: Domain | None, owner: type | None = None):
        if domain is None:
            return _EMPTY
        value = domain.__dict__.get(self.slot, _UNREAD)
        if value is _UNREAD:
            domain._read(self.name)
            value = domain.__dict__[self.slot]
        return value

    def __set__(self, domain: Domain, value) -> None:
        domain.__dict__[self.slot] = [] if value is _EMPTY else value


@dataclass(repr=False)
class Domain:
    """A validated domain. ``qa`` and ``relevance`` are empty when their files are absent.

    From ``load_domain(root, lazy=True)`` the list fields are read from their files on first use.
    """

    root: Path
    config: DomainConfig
    corpus: list[CorpusDoc] = _ReadOnUse()
    web: list[WebDoc] = _ReadOnUse()
    qa: list[QAPair] = _ReadOnUse()
    relevance: list[RelevancePair] = _ReadOnUse()
    skipped: list[str] = _ReadOnUse()
    """Corpus-folder files that could not be read, each message naming its file (empty for corpus.jsonl)."""
    max_document_bytes: int = field(default=DEFAULT_MAX_DOCUMENT_MB * 2**20, kw_only=True, compare=False)
    """The largest corpus-folder file read, and the most its text may unpack to (setting max_document_mb)."""
    _read_from_files: set[str] = field(default_factory=set, init=False, compare=False)
    _sources: dict[str, SourceFiles | None] = field(default_factory=dict, init=False, compare=False)

    def __repr__(self) -> str:  # the dataclass repr would read every file of a lazy domain
        return f"Domain(root={self.root!r}, name={self.name!r})"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def corpus_path(self) -> Path | None:
        """``corpus.jsonl``, else the ``corpus/`` folder, else None (no corpus in the folder)."""
        if self.root is None:
            return None
        file, folder = _inside(self.root, "corpus.jsonl"), _inside(self.root, "corpus")
        return file if file.is_file() else folder if folder.is_dir() else None

    @property
    def has_corpus(self) -> bool:
        """Whether there is a corpus to ingest: given to the constructor, or a corpus file or folder."""
        return not self._unread("corpus") or self.corpus_path is not None

    @property
    def has_web(self) -> bool:
        """Whether the domain has web documents; an unread, non-empty web.jsonl is taken to hold some
        (:func:`crag_dspy.store.ingest_gaps` parses it before it calls a missing collection a gap)."""
        if not self._unread("web"):
            return bool(self.web)
        path = Path(self.root) / "web.jsonl"
        return path.is_file() and path.stat().st_size > 0

    def source(self, which: Literal["kb", "web"]) -> SourceFiles | None:
        """The files the ``kb`` (corpus) or ``web`` collection is ingested from, while the field is (or
        will be) read from them; None when its documents were given to the constructor or there is no
        such file. Taken once, before the files are parsed, so a file that changes meanwhile makes the
        next start re-check the content, never trust stale chunks."""
        if which not in self._sources:
            self._sources[which] = self._find_source(which)
        return self._sources[which]

    def _find_source(self, which: str) -> SourceFiles | None:
        name = "corpus" if which == "kb" else "web"
        if self.root is None or not (self._unread(name) or name in self._read_from_files):
            return None
        root = Path(self.root)
        if which == "web":
            path = root / "web.jsonl"
            return SourceFiles("web.jsonl", root, (path,)) if path.is_file() else None
        path = self.corpus_path
        if path is None:
            return None
        if path.is_file():
            return SourceFiles("corpus.jsonl", root, (path,))
        files = tuple(
            sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in SUFFIXES and utf8_name(p)  # as load_folder reads
            )
        )
        return SourceFiles("corpus/", root, files, self.max_document_bytes)

    def _unread(self, name: str) -> bool:
        return self.__dict__.get(f"_{name}", _UNREAD) is _UNREAD

    def _read(self, name: str) -> None:
        """Read and validate the file behind field ``name`` (corpus and skipped come together)."""
        root = Path(self.root)
        if name in ("corpus", "skipped"):
            source = self.source("kb")
            if source is not None:
                source.stat_key, source.sha256  # noqa: B018 - keyed before the parse (see source())
            self._read_from_files.update(("corpus", "skipped"))
            self.corpus, self.skipped = _read_corpus(root, self.max_document_bytes)
            log.debug("domain %r: read %d corpus documents", self.name, len(self.corpus))
        elif name == "web":
            source = self.source("web")
            if source is not None:
                source.stat_key, source.sha256  # noqa: B018
            self._read_from_files.add("web")
            self.web = _optional(root / "web.jsonl", WebDoc)
            _unique_ids(root / "web.jsonl", self.web)
        else:
            self._read_from_files.add(name)
            model = QAPair if name == "qa" else RelevancePair
            setattr(self, name, _optional(root / f"{name}.jsonl", model))

    def file_hashes(self) -> dict[str, str]:
        """sha256 of each data file present, so a compiled program can name the exact data it saw."""
        return {
            p.name: _sha256(p)
            for p in sorted(Path(self.root).iterdir())
            if p.is_file() and p.suffix in {".jsonl", ".toml"}
        }


def _optional(path: Path, model: type[R]) -> list[R]:
    path = _inside(path.parent, path.name)
    return load_jsonl(path, model) if path.is_file() else []


DOMAIN_FILES = ("domain.toml", "corpus.jsonl", "corpus", "web.jsonl", "qa.jsonl", "relevance.jsonl")
"""The files and folder a domain is read from: none may be a link that leads out of the domain folder."""


def _inside(root: Path | str, name: str) -> Path:
    """``root / name``, refused when it is a symbolic link that leads out of the domain folder: domain
    folders come from uploads and archives, and a ``corpus -> /`` link would make the whole file system
    the corpus (its files answered, quoted and cited), as a link inside ``corpus/`` would a file."""
    path = Path(root) / name
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(Path(root).resolve()):
            what = "folder" if target.is_dir() else "file"
            raise DomainDataError(
                f"{path}: a link to a {what} outside the domain folder ({target}): not read; copy the "
                f"{what} into the domain folder instead of linking to it"
            )
    return path


def _read_corpus(root: Path, max_document_bytes: int) -> tuple[list[CorpusDoc], list[str]]:
    corpus_path, corpus_dir = _inside(root, "corpus.jsonl"), _inside(root, "corpus")
    skipped: list[str] = []
    if corpus_path.is_file():
        corpus = load_jsonl(corpus_path, CorpusDoc)
    elif corpus_dir.is_dir():
        folder = load_folder(corpus_dir, max_bytes=max_document_bytes)
        corpus, skipped = folder.docs, folder.skipped
    else:
        raise DomainDataError(
            f"{root}: no corpus.jsonl (or corpus/ folder of .pdf, .html, .docx, .md or .txt files)"
        )
    if not corpus:
        unreadable = f"; every file was unreadable: {'; '.join(skipped)}" if skipped else ""
        raise DomainDataError(
            f"{corpus_path if corpus_path.is_file() else corpus_dir}: the corpus is empty{unreadable}"
        )
    _unique_ids(corpus_path, corpus)
    return corpus, skipped


def _name_from_folder(folder: str) -> str:
    """A domain name (3-42 letters, digits, '-' or '_') for a folder without a domain.toml."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "-", folder).strip("-_")[:42]
    return name if len(name) >= 3 else f"domain-{name}".strip("-")


def load_domain(
    root: Path | str, *, lazy: bool = False, max_document_bytes: int = DEFAULT_MAX_DOCUMENT_MB * 2**20
) -> Domain:
    """Load and validate a domain directory; raise :class:`DomainDataError` naming what is wrong.

    With ``lazy`` only ``domain.toml`` is read now; each data file is read and validated when its field
    is first used (a missing corpus is then reported there), which is what an app on an up-to-date
    store wants: it never needs the corpus. A corpus-folder file larger than ``max_document_bytes``, or
    whose text would unpack to more, is skipped (``Settings.max_document_bytes``).
    """
    root = Path(root)
    if not root.is_dir():
        raise DomainDataError(f"{root}: domain directory not found")
    for name in DOMAIN_FILES:  # checked before anything is read, lazily or not
        # A FIFO or device is never opened, and is named: passed over as absent, a domain.toml was the
        # defaults without a word, and a corpus.jsonl was "no corpus.jsonl".
        irregular = not_regular(_inside(root, name))
        if irregular is not None:
            raise DomainDataError(irregular)
    if (root / "corpus.jsonl").is_file() and (root / "corpus").is_dir():
        log.warning(
            "%s: both corpus.jsonl and corpus/ are present: corpus.jsonl is read and corpus/ is not; "
            "remove or rename the one you do not mean",
            shown_path(root),
        )
    toml_path = root / "domain.toml"
    if toml_path.is_file():
        try:
            config = DomainConfig.model_validate(tomllib.loads(_read_text(toml_path)))
        except tomllib.TOMLDecodeError as exc:
            raise DomainDataError(f"{toml_path}: {exc}") from None
        except ValidationError as exc:
            raise DomainDataError(f"{toml_path}: {describe_validation_error(exc, 'file')}") from None
        except RecursionError:
            raise DomainDataError(f"{toml_path}: {_TOO_DEEP}") from None
    else:
        config = DomainConfig(name=_name_from_folder(root.name))
    domain = Domain(
        root, config, _UNREAD, _UNREAD, _UNREAD, _UNREAD, _UNREAD, max_document_bytes=max_document_bytes
    )
    if not lazy:
        domain.corpus, domain.web, domain.qa, domain.relevance  # noqa: B018 - read and validate all now
    return domain
