"""The domain data format (``data/<domain>/``) and its validating loader.

A domain is a directory holding ``corpus.jsonl`` (internal knowledge), ``web.jsonl`` (the offline web
stand-in), ``qa.jsonl``, ``relevance.jsonl`` and ``domain.toml``. Only ``corpus.jsonl`` (or a folder
``corpus/`` of .md/.txt files) is required to ask questions; the rest feed compilation and evaluation.
Every malformed line is reported with its file and line number.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .config import CRAGConfig

__all__ = [
    "CorpusDoc",
    "Domain",
    "DomainConfig",
    "DomainDataError",
    "QAPair",
    "RelevancePair",
    "WebDoc",
    "check_domain_name",
    "load_domain",
    "load_jsonl",
]

_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{1,40}[a-zA-Z0-9]$")
# A domain *name* (--domain, CRAG_DOMAIN, a program's metadata) names a bundled folder under data/:
# never a path, so that neither a flag nor a program file can make the app read another folder.
_DOMAIN_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$")


class DomainDataError(ValueError):
    """A domain file is missing or malformed; the message names the file and line."""


def check_domain_name(name: object, what: str = "--domain") -> str:
    """``name`` when it is a domain name (letters, digits, '-' and '_'), else a DomainDataError that
    points to --domain-dir for folders."""
    if isinstance(name, str) and _DOMAIN_NAME.match(name):
        return name
    raise DomainDataError(
        f"{what} {name!r} is not a domain name (letters, digits, '-' and '_', at most 64): "
        "a domain folder is given with --domain-dir"
    )


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", str_strip_whitespace=True)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class CorpusDoc(_Record):
    id: str = Field(min_length=1)
    title: str = Field(min_length=1)
    text: str = Field(min_length=1)
    source: str | None = None

    _blank = field_validator("id", "title", "text")(_not_blank)


class WebDoc(CorpusDoc):
    url: str = Field(min_length=1)


class QAPair(_Record):
    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1, description="gold aliases; ['I don't know'] marks unanswerable")
    split: Literal["train", "val", "test"]
    kind: Literal["kb", "web", "both", "none"] | None = None
    source: str | None = Field(None, description='"synthetic" when python -m optimize.synthesize wrote it')


class RelevancePair(_Record):
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


R = TypeVar("R", bound=BaseModel)

# json and tomllib parse nested arrays/objects recursively: a line nested deeper than the interpreter's
# recursion limit raises RecursionError, which is the file's fault, not a bug.
_TOO_DEEP = "nested too deeply to parse (arrays or objects inside each other, past Python's recursion limit)"


def _read_text(path: Path) -> str:
    """``path`` as UTF-8 text; a missing or undecodable file is a :class:`DomainDataError` naming it."""
    try:
        return path.read_text(encoding="utf-8")
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
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors()
            )
            raise DomainDataError(f"{path}:{number}: {problems}") from None
    return records


def _load_text_folder(folder: Path) -> list[CorpusDoc]:
    docs = []
    for path in sorted([*folder.rglob("*.md"), *folder.rglob("*.txt")]):
        text = _read_text(path).strip()
        if not text:
            continue
        first = text.splitlines()[0].lstrip("# ").strip()
        docs.append(
            CorpusDoc(id=str(path.relative_to(folder)), title=first or path.stem, text=text, source=str(path))
        )
    return docs


def _unique_ids(path: Path, docs: list[CorpusDoc]) -> None:
    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            raise DomainDataError(f"{path}: duplicate document id {doc.id!r}")
        seen.add(doc.id)


@dataclass
class Domain:
    """A loaded, validated domain. ``qa`` and ``relevance`` are empty when their files are absent."""

    root: Path
    config: DomainConfig
    corpus: list[CorpusDoc]
    web: list[WebDoc] = field(default_factory=list)
    qa: list[QAPair] = field(default_factory=list)
    relevance: list[RelevancePair] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.config.name

    def file_hashes(self) -> dict[str, str]:
        """sha256 of each data file present, so a compiled program can name the exact data it saw."""
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(self.root.iterdir())
            if p.is_file() and p.suffix in {".jsonl", ".toml"}
        }


def load_domain(root: Path | str) -> Domain:
    """Load and validate a domain directory; raise :class:`DomainDataError` naming what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise DomainDataError(f"{root}: domain directory not found")
    toml_path = root / "domain.toml"
    if toml_path.is_file():
        try:
            config = DomainConfig.model_validate(tomllib.loads(_read_text(toml_path)))
        except (tomllib.TOMLDecodeError, ValidationError) as exc:
            raise DomainDataError(f"{toml_path}: {exc}") from None
        except RecursionError:
            raise DomainDataError(f"{toml_path}: {_TOO_DEEP}") from None
    else:
        config = DomainConfig(name=re.sub(r"[^a-zA-Z0-9_-]", "-", root.name).strip("-_")[:42] or "domain")

    corpus_path, corpus_dir = root / "corpus.jsonl", root / "corpus"
    if corpus_path.is_file():
        corpus = load_jsonl(corpus_path, CorpusDoc)
    elif corpus_dir.is_dir():
        corpus = _load_text_folder(corpus_dir)
    else:
        raise DomainDataError(f"{root}: no corpus.jsonl (or corpus/ folder of .md/.txt files)")
    if not corpus:
        raise DomainDataError(f"{corpus_path if corpus_path.is_file() else corpus_dir}: the corpus is empty")
    _unique_ids(corpus_path, corpus)

    def optional(name: str, model: type[R]) -> list[R]:
        path = root / name
        return load_jsonl(path, model) if path.is_file() else []

    web = optional("web.jsonl", WebDoc)
    _unique_ids(root / "web.jsonl", web)
    return Domain(
        root, config, corpus, web, optional("qa.jsonl", QAPair), optional("relevance.jsonl", RelevancePair)
    )
