"""All configuration in one typed place.

Every field can be set by an environment variable ``CRAG_<FIELD>`` (e.g. ``CRAG_LM=openai/gpt-4o-mini``)
or a ``.env`` file; CLI flags override them. Secrets are never fields here: provider keys
(``OPENAI_API_KEY``, ``TAVILY_API_KEY``, ...) are read from the environment by the client that needs them,
so they cannot leak into traces, reports or saved programs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .focus import DEFAULT_TERM_WEIGHT
from .validation import DEFAULT_MAX_QUESTION_CHARS

__all__ = ["DEFAULT_DATA_DIR", "Settings", "default_cache_dir"]

# Bundled domains live in the repository's data/ folder; an installed wheel has no such folder, so
# users then point --domain-dir at their own copy.
DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "crag-dspy"


class Settings(BaseSettings):
    """Runtime configuration of crag-dspy (environment prefix ``CRAG_``)."""

    model_config = SettingsConfigDict(env_prefix="CRAG_", env_file=".env", extra="ignore")

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
        default_factory=lambda: os.cpu_count() or 2, ge=1, description="CPU threads."
    )
    embedded_ctx: int = Field(8192, ge=1024, description="Context window of the embedded model, in tokens.")
    lm_timeout_s: float = Field(120.0, gt=0, description="Seconds before an LM request is abandoned.")
    lm_retries: int = Field(
        2, ge=0, le=5, description="Extra attempts after an unparseable or failed LM output."
    )
    use_logprobs: bool = Field(
        True, description="Read grades from token probabilities when the LM returns them."
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
    embedding_model: str | None = Field(
        None, description="sentence-transformers model path or name (default: the bundled all-MiniLM-L6-v2)."
    )
    k: int = Field(5, ge=1, le=50, description="Documents retrieved per question.")
    max_question_chars: int = Field(
        DEFAULT_MAX_QUESTION_CHARS, ge=1, description="Longer questions are refused (not truncated)."
    )

    # --- CRAG -----------------------------------------------------------------------------------
    lower: float = Field(0.3, ge=0.0, le=1.0, description="Below this for every document: INCORRECT.")
    upper: float = Field(0.7, ge=0.0, le=1.0, description="Any document at or above this: CORRECT.")
    strip_threshold: float = Field(0.5, ge=0.0, le=1.0, description="Strips scoring below this are dropped.")
    grade_sentences: int = Field(
        1,
        ge=0,
        description="The grader reads a passage's title and this many of its sentences that best match "
        "the question (0: whole passages).",
    )
    grade_term_weight: float = Field(
        DEFAULT_TERM_WEIGHT,
        ge=0.0,
        allow_inf_nan=False,
        description="How much the question's words count, next to embedding similarity, in choosing "
        "the sentences the grader reads (0: similarity alone).",
    )
    grade_term_stems: bool = Field(
        True,
        description="Compare the question's words by their stems in choosing the sentences the grader "
        'reads ("chairs" finds "chair").',
    )
    answer_units: bool = Field(
        True, description='A bare-number answer gets the unit its context states ("260" -> "260 velds").'
    )
    max_strips: int = Field(5, ge=1, description="Most knowledge strips kept per source (paper: top 5).")
    fallback_web_strips: int = Field(
        1,
        ge=0,
        description="When no knowledge reaches strip_threshold on a route that searched the web, answer "
        'from this many of the best-scored web strips below it (0: answer "I don\'t know").',
    )
    internal_retries: int = Field(
        0,
        ge=0,
        le=5,
        description="On AMBIGUOUS or INCORRECT, search the internal store again with a rewritten query for "
        "at most this many rounds before the web, grading only new passages (0: off; a compiled program "
        "records its value).",
    )
    web_results: int = Field(3, ge=1, le=10, description="Web results requested per search.")
    web_timeout_s: float = Field(15.0, gt=0, description="Seconds before a web search is abandoned.")
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

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Settings:
        if self.lower > self.upper:
            raise ValueError(f"lower ({self.lower}) must not exceed upper ({self.upper})")
        return self

    @property
    def resolved_domain_dir(self) -> Path:
        return self.domain_dir if self.domain_dir is not None else DEFAULT_DATA_DIR / self.domain

    @property
    def resolved_chroma_path(self) -> Path:
        return self.chroma_path if self.chroma_path is not None else self.cache_dir / "chroma"
