"""Build the ``dspy.LM`` for a :class:`~crag_dspy.settings.Settings`: embedded or hosted, same code path."""

from __future__ import annotations

from urllib.parse import urlsplit

import dspy

from ..redaction import set_key_advice
from ..settings import Settings
from .embedded import start_embedded_server
from .server_key import ServerKeyedLM

__all__ = ["LMConfigError", "build_lm", "checked_api_base", "lm_identity"]

# Provider prefix -> the environment variable LiteLLM reads the key from. Checked up front so a missing
# key is reported by name before any work starts, not as a provider error mid-request.
_KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "groq": "GROQ_API_KEY",
    "mistral": "MISTRAL_API_KEY",
    "together_ai": "TOGETHERAI_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
}


class LMConfigError(ValueError):
    """The LM setting cannot work: unknown form or missing credentials (names the variable)."""


def _known_providers() -> set[str]:
    """LiteLLM's provider prefixes plus any declared to DSPy with ``dspy.lm15.register_provider``."""
    import litellm
    from dspy.lm15 import registered_providers

    known = {str(getattr(p, "value", p)) for p in litellm.provider_list}
    for registered in registered_providers():
        known.add(registered.id)
        known.update(getattr(registered.definition, "aliases", ()) or ())
    return known


def checked_api_base(url: str) -> str:
    """``url`` when an LM server can be reached at it; else :class:`LMConfigError` saying why and what to
    do, never repeating a password.

    LiteLLM sends neither a ``user:password@`` part (the host then resolves as ``user:password@host``,
    "Name or service not known" on every call), nor a query string in its place (the path is appended
    after it), nor anything but HTTP: a ``file://`` or scheme-less URL
    fails on every call, which would look like an LM that knows nothing rather than a setup error.
    """
    parts = urlsplit(url.strip())
    if "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        shown = f"{parts.scheme}://***@{host}{parts.path}" if parts.scheme else f"***@{host}{parts.path}"
        raise LMConfigError(
            f"LM base URL {shown} holds a user name and password, which are not sent to the server "
            "(the host would be read as 'user:password@host'): drop them from --lm-api-base / "
            "CRAG_LM_API_BASE; a server that wants a key gets it from OPENAI_API_KEY (sent as 'Authorization: "
            "Bearer'); one behind HTTP basic authentication needs a proxy in front of it that adds the header"
        )
    if parts.query or parts.fragment:
        # The client appends "/chat/completions" to the whole URL: "/v1?api-key=X/chat/completions", a 404
        # on every call, reported only as "the LM is down" (probe 7). The query may hold a key: not shown.
        raise LMConfigError(
            f"LM base URL {parts.scheme}://{parts.netloc}{parts.path}?*** holds a query string or fragment, "
            "which the client would put before the '/chat/completions' it appends: drop it from --lm-api-base / "
            "CRAG_LM_API_BASE; a key goes in OPENAI_API_KEY (sent as 'Authorization: Bearer')"
        )
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LMConfigError(
            f"LM base URL {url} is not an http:// or https:// URL: an LM server is reached over HTTP, e.g. "
            "--lm-api-base http://127.0.0.1:8000/v1"
        )
    return url


def lm_identity(settings: Settings) -> str:
    """The model string recorded in traces and program metadata (never a key or URL with credentials)."""
    return f"embedded/{settings.embedded_model}" if settings.lm == "embedded" else settings.lm


def build_lm(settings: Settings, **overrides) -> dspy.LM:
    """Return a ``dspy.LM`` for ``settings.lm``; starts the embedded server when needed.

    The embedded model is addressed as ``openai/<model name>`` (``+ik_llama`` appended when that engine
    serves it) so that DSPy's cache key names the exact model and engine (the port, being an
    ``api_base``, is left out of the key and may change between runs). A server the user names
    (``lm_api_base``) is part of the key (:class:`~crag_dspy.lm.server_key.ServerKeyedLM`): a wrong
    base URL is not answered from another server's cached replies.
    """
    kwargs = {
        "temperature": 0.0,
        "max_tokens": 512,
        "num_retries": settings.lm_retries,
        "timeout": settings.lm_timeout_s,
    }
    kwargs.update(overrides)
    if settings.lm == "embedded":
        server = start_embedded_server(
            settings.embedded_model,
            settings.cache_dir,
            n_threads=settings.embedded_threads,
            n_ctx=settings.embedded_ctx,
            engine=settings.embedded_engine,
        )
        return dspy.LM(
            f"openai/{server.served_name}", api_base=server.api_base, api_key=server.api_key, **kwargs
        )

    import os

    if "/" not in settings.lm:
        raise LMConfigError(
            f"LM {settings.lm!r} is not a LiteLLM model string: use 'provider/model', e.g. 'openai/gpt-4o-mini', "
            "'ollama_chat/qwen2.5:1.5b', or 'embedded'."
        )
    provider = settings.lm.split("/", 1)[0]
    if provider not in _known_providers():
        # Otherwise the mistake surfaces per call, as failed grades, instead of once, by name.
        raise LMConfigError(
            f"LM {settings.lm!r}: unknown provider {provider!r}; use a LiteLLM provider prefix such as "
            "openai/, anthropic/, ollama_chat/ or hosted_vllm/ (https://docs.litellm.ai/docs/providers)"
        )
    variable = _KEY_VARIABLES.get(provider)
    if variable and not settings.lm_api_base and not os.environ.get(variable):
        raise LMConfigError(f"LM {settings.lm!r} needs an API key: {set_key_advice(variable)}.")
    if settings.lm_api_base:
        kwargs["api_base"] = checked_api_base(settings.lm_api_base)
        # OpenAI-compatible servers (vLLM, llama.cpp) often need no key, but LiteLLM insists on one.
        if provider == "openai" and not os.environ.get("OPENAI_API_KEY"):
            kwargs["api_key"] = "not-needed"
        return ServerKeyedLM(settings.lm, **kwargs)
    return dspy.LM(settings.lm, **kwargs)
