"""All configuration in one typed place.

Every field can be set by an environment variable ``CRAG_<FIELD>`` (e.g. ``CRAG_LM=openai/gpt-4o-mini``)
or a ``.env`` file, and the CRAG program's own settings (:class:`~crag_dspy.config.CRAGConfig`) by
``CRAG_CONFIG__<FIELD>`` (e.g. ``CRAG_CONFIG__K=8``); CLI flags override them. Secrets are never fields here: provider keys
(``OPENAI_API_KEY``, ``TAVILY_API_KEY``, ...) are read from the environment by the client that needs them,
so they cannot leak into traces, reports or saved programs. The one exception is the service's own
keys (``CRAG_API_KEYS``, ``CRAG_DEBUG_API_KEYS``): they are ``SecretStr`` (printed as ``**********``)
and the service logs only a short hash of a key.
"""

from __future__ import annotations

import logging
import os
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .config import CRAGConfig
from .domain import check_domain_name
from .loaders import DEFAULT_MAX_DOCUMENT_MB
from .validation import DEFAULT_MAX_QUESTION_CHARS

__all__ = ["DEFAULT_DATA_DIR", "LOOPBACK_HOSTS", "MOST_TIMEOUT_S", "Settings", "default_cache_dir"]

log = logging.getLogger(__name__)
_WARNED: set[tuple[str, ...]] = set()


def _bundled_data_dir() -> Path:
    """Where the bundled domains are: the package's ``bundled/`` in a wheel install (the build maps the
    repository's data/ there, see pyproject.toml), else the repository's data/ (a checkout or an
    editable install)."""
    packaged = Path(str(files("crag_dspy").joinpath("bundled")))
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "data"


DEFAULT_DATA_DIR = _bundled_data_dir()

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The Host names the service answers by default: a page on another site that rebinds its own name to
127.0.0.1 still sends its own name as Host, and is refused."""


MOST_TIMEOUT_S = 86_400.0
"""The longest timeout a setting takes (a day): ``inf`` or ``1e309`` passed "> 0" and then failed every
call of the client that got it (``ask`` answered "I don't know", exit 0)."""


def _seconds(default: float, description: str) -> Any:
    """A timeout setting: seconds, above 0 and finite, at most :data:`MOST_TIMEOUT_S`."""
    return Field(default, gt=0, le=MOST_TIMEOUT_S, allow_inf_nan=False, description=description)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "crag-dspy"


class Settings(BaseSettings):
    """Runtime configuration of crag-dspy (environment prefix ``CRAG_``)."""

    # "ignore": a .env file may hold other programs' variables. Unknown keyword arguments are an error
    # and unknown CRAG_ variables a warning (__init__), so a misspelt or moved setting is never silent.
    model_config = SettingsConfigDict(
        env_prefix="CRAG_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    def __init__(self, **values: Any):
        fields = type(self).model_fields
        unknown = sorted(key for key in values if key not in fields and not key.startswith("_"))
        if unknown:
            raise TypeError(f"unknown settings {unknown}{_moved_hint(unknown)}")
        stray = sorted(
            key
            for key in os.environ
            if key.startswith("CRAG_") and key[len("CRAG_") :].split("__")[0].lower() not in fields
        )
        if stray and tuple(stray) not in _WARNED:
            _WARNED.add(tuple(stray))
            names = [key[len("CRAG_") :].lower() for key in stray]
            log.warning("ignoring unknown environment variables %s%s", stray, _moved_hint(names))
        super().__init__(**values)

    # --- language model -------------------------------------------------------------------------
    lm: str = Field(
        "embedded",
        description="'embedded' for the in-process llama.cpp model, or any LiteLLM model string "
        "('openai/gpt-4o-mini', 'ollama_chat/qwen2.5', 'openai/<name>' with lm_api_base, ...).",
    )
    lm_api_base: str | None = Field(
        None, description="Base URL of an OpenAI-compatible server (vLLM, llama.cpp, ...)."
    )
    embedded_model: Literal["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"] = Field(
        "qwen2.5-coder-1.5b-instruct",
        description="Which embedded GGUF model to serve; the 0.5B is ~2.5x faster.",
    )
    embedded_engine: Literal["auto", "ik_llama", "xllamacpp"] = Field(
        "auto",
        description="llama.cpp engine of the embedded model: ik_llama (ik-llama-cpp-python, ~1.5x faster "
        "prompt evaluation on CPUs), xllamacpp, or auto (ik_llama when installed).",
    )
    embedded_threads: int = Field(
        default_factory=lambda: os.cpu_count() or 2, ge=1, le=1024, description="CPU threads."
    )
    embedded_ctx: int = Field(
        8192, ge=1024, le=1_048_576, description="Context window of the embedded model, in tokens."
    )
    lm_timeout_s: float = _seconds(
        120.0,
        "Seconds before an LM request is abandoned.",
    )
    lm_retries: int = Field(
        2, ge=0, le=5, description="Retries of a failed LM request, with backoff (DSPy's num_retries)."
    )

    on_flag: Literal["warn", "withhold"] = Field(
        "warn",
        description="An answer the grounding check flags because its sources disagree or instruct the "
        "model: 'warn' shows it with a warning, 'withhold' answers 'The sources disagree or instruct; not "
        "answered' and cites both sides (crag_dspy.flag_policy). `ask --on-flag`, `serve --on-flag`.",
    )

    # --- retrieval ------------------------------------------------------------------------------
    domain: str = Field("default", description="Name of a bundled domain under data/.")
    domain_dir: Path | None = Field(
        None, description="Any directory in the domain format (overrides domain)."
    )
    chroma_path: Path | None = Field(
        None, description="Embedded Chroma folder (default: <cache_dir>/chroma)."
    )
    chroma_host: str | None = Field(None, description="Chroma server host; when set, HttpClient is used.")
    chroma_port: int = Field(8000, ge=1, le=65535, description="Chroma server port.")
    store_timeout_s: float = _seconds(
        30.0,
        "Seconds a Chroma server request may take in all (connect, headers and the whole reply) "
        "before it fails (StoreError, 503 store), instead of hanging on a hung or dripping server.",
    )
    embedding_model: str | None = Field(
        None, description="sentence-transformers model path or name (default: the bundled all-MiniLM-L6-v2)."
    )
    retrieval: Literal["dense", "hybrid"] = Field(
        "dense",
        description="How the internal knowledge is ranked: 'dense' (embedding cosine similarity), or "
        "'hybrid' (dense and BM25 over the same chunks fused by reciprocal rank, crag_dspy.hybrid: finds "
        "identifiers such as option names, error codes and versions that the embedder ranks poorly).",
    )
    max_document_mb: float = Field(
        DEFAULT_MAX_DOCUMENT_MB,
        gt=0,
        allow_inf_nan=False,
        description="The largest corpus-folder file read, in MB (2**20 bytes), and the most its text or a "
        ".docx's parts may unpack to: a larger one is skipped by name, as an unreadable file is, so a file "
        "from an upload or archive (a 5 GB log, a 3 MB zip bomb) cannot fill memory.",
    )
    max_question_chars: int = Field(
        DEFAULT_MAX_QUESTION_CHARS,
        ge=1,
        le=1_000_000,
        description="Longer questions are refused (not truncated).",
    )

    # --- CRAG -----------------------------------------------------------------------------------
    config: CRAGConfig = Field(
        default_factory=CRAGConfig,
        description="The CRAG program's settings (environment CRAG_CONFIG__K, CRAG_CONFIG__UPPER, "
        "CRAG_CONFIG__GRADER_VIEW__SENTENCES, ...); a compiled program brings its own.",
    )
    web_timeout_s: float = _seconds(
        15.0,
        "Seconds before a web search is abandoned.",
    )
    web_domains: list[str] = Field(
        default_factory=list,
        description="Domains Tavily should prefer, e.g. ['wikipedia.org'] (paper's choice).",
    )
    web_search: Literal["auto", "tavily", "offline", "none"] = Field(
        "auto", description="'auto' uses Tavily when TAVILY_API_KEY is set, else the offline stand-in."
    )

    cache_dir: Path = Field(
        default_factory=default_cache_dir, description="Joined model weights and Chroma data."
    )

    @field_validator("domain")
    @classmethod
    def _domain_is_a_name(cls, value: str) -> str:
        return check_domain_name(value, "domain")

    # --- serving (python -m crag_dspy.serve) ------------------------------------------------------
    # Lists of these are comma-separated in the environment (NoDecode: not JSON), as operators write them.
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (),
        description="Keys a client of the service must present (Authorization: Bearer <key> or X-API-Key), "
        "comma-separated; required when the service listens beyond loopback.",
    )
    debug_api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (),
        description="Keys that may also ask for the full trace (POST /ask?debug=1), comma-separated; "
        "they are valid keys too.",
    )
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        LOOPBACK_HOSTS,
        description="Host headers the service answers (Starlette's TrustedHostMiddleware), comma-separated; "
        "'*.example.com' matches subdomains. The host serve listens on is added.",
    )
    max_body_bytes: int = Field(
        65536,
        ge=1024,
        le=1 << 30,
        description="Larger request bodies are refused with 413 before they are parsed.",
    )
    rate_limit: str = Field(
        "60/minute",
        description="Requests per API key (per client address without keys) in the `limits` notation, "
        "e.g. '60/minute' or '10/second;500/hour'; 'none' turns it off.",
    )
    request_timeout_s: float = _seconds(
        300.0,
        "Seconds a request may take in all, queueing included, before a 504.",
    )
    serve_workers: int = Field(4, ge=1, le=1024, description="Questions the service runs at once.")
    serve_queue: int = Field(
        16, ge=1, le=100_000, description="Questions running or waiting at most; more are refused with 503."
    )
    forwarded_allow_ips: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Addresses (or networks, or '*') of reverse proxies whose X-Forwarded-For / "
        "X-Forwarded-Proto the service believes, comma-separated; by default none: the client address is "
        "the connection's, so a forged header cannot change who a rate limit counts.",
    )
    serve_header_timeout_s: float = _seconds(
        10.0,
        "Seconds a connection may take to send a request's headers, counted from its opening "
        "or its previous response; then it is closed (uvicorn has no such limit).",
    )
    serve_body_timeout_s: float = _seconds(
        30.0,
        "Seconds a request's whole body may take to arrive after its headers; then it is "
        "answered 408 and the connection closed (uvicorn has no such limit: a body that stops held the "
        "connection forever).",
    )
    serve_max_header_bytes: int = Field(
        65536,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Bytes a request's line and headers may take; a longer head is answered 431 and the "
        "connection closed (uvicorn's httptools protocol has no such limit: a header streamed for the "
        "whole header timeout was buffered whole).",
    )
    serve_max_waiting_connections: int = Field(
        100,
        ge=1,
        le=100_000,
        description="Connections that may wait for a request's headers or body at once (per worker "
        "process); past it the one waiting longest is closed, so half-open connections cannot lock "
        "/health out.",
    )

    @field_validator("api_keys", "debug_api_keys", "allowed_hosts", "forwarded_allow_ips", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit_notation(cls, value: str) -> str:
        try:
            from limits import parse_many
        except ImportError:  # the serve extra brings it; only the service reads this setting
            return value
        if value.strip().lower() not in ("", "none"):
            try:
                parse_many(value)
            except ValueError as exc:
                raise ValueError(
                    f"{value!r} is not a rate in the limits notation such as '60/minute'"
                ) from exc
        return value

    @field_validator("lm_api_base")
    @classmethod
    def _base_url_needs_a_served_model(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Ignoring it would answer from the embedded model while the user believes their server does.
        if value is not None and info.data.get("lm") == "embedded":
            raise ValueError(
                "a base URL is for a served model, and the LM is the embedded one: name the served "
                "model too (--lm openai/<model name>, or CRAG_LM), or drop the base URL"
            )
        return value

    @field_validator("chroma_host")
    @classmethod
    def _one_chroma(cls, host: str | None, info: ValidationInfo) -> str | None:
        # Ignoring the folder would read and write the server's collections while the user believes
        # their folder is used.
        if host is not None and info.data.get("chroma_path") is not None:
            raise ValueError(
                "a Chroma server and an embedded Chroma folder (chroma_path) were both given: "
                "keep one (--chroma-host for the server, --chroma-path for the folder)"
            )
        return host

    @field_validator("serve_queue")
    @classmethod
    def _queue_holds_the_workers(cls, queue: int, info: ValidationInfo) -> int:
        workers = info.data.get("serve_workers", queue)
        if queue < workers:
            raise ValueError(
                f"must be at least serve_workers ({workers}): running questions are in the queue"
            )
        return queue

    @property
    def resolved_domain_dir(self) -> Path:
        return self.domain_dir if self.domain_dir is not None else DEFAULT_DATA_DIR / self.domain

    @property
    def max_document_bytes(self) -> int:
        """:attr:`max_document_mb` in bytes, as the loaders take it."""
        return int(self.max_document_mb * 2**20)

    @property
    def resolved_chroma_path(self) -> Path:
        return self.chroma_path if self.chroma_path is not None else self.cache_dir / "chroma"


def _moved_hint(names: list[str]) -> str:
    moved = [name for name in names if name in CRAGConfig.model_fields]
    if not moved:
        return ""
    examples = ", ".join(f"CRAG_CONFIG__{name.upper()}" for name in moved)
    return f"; CRAG's own settings are Settings(config=CRAGConfig(...)), in the environment {examples}"
