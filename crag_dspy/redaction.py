"""Keep API keys out of everything CRAG writes: traces, CLI output, logs, reports.

Keys are never settings (see ``settings.py``) and never saved with programs, but providers and
gateways do echo them in error messages (``Incorrect API key provided: Bearer sk-...``), and those
messages are recorded in traces and printed. :func:`redact` removes the values of the credential
variables present in the environment and anything shaped like a bearer token or a provider key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

from .terminal import terminal_safe

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "configure_logging",
    "excerpt",
    "question_hash",
    "redact",
    "secret_values",
]

REDACTED = "***"

# Variables whose values are credentials: the providers' own (OPENAI_API_KEY, TAVILY_API_KEY, ...) and
# anything named like one.
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|ACCESS_KEY)", re.IGNORECASE)
_SECRET_SHAPES = re.compile(
    r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"  # Authorization header values
    r"|\b(sk|tvly|gsk|xai|pk|rk)-[A-Za-z0-9_-]{8,}"  # OpenAI/Anthropic, Tavily, Groq, xAI-style keys
    r"|\bAIza[0-9A-Za-z_-]{20,}"  # Google API keys
    # user:password@host in URLs, with or without the scheme (LiteLLM's connection errors drop it). Only
    # a ":password" part is redacted, so e-mail addresses (and "mailto:") in answers stay as they are.
    r"|(?<![^\s/'\"(<\[=,;])(?!mailto:)[^\s/:@'\"<>()\[\]]+:[^\s/@'\"<>]+(?=@[\w\[])"
)
_MIN_SECRET_LENGTH = 6  # shorter values ("1", "true") would redact ordinary words


def secret_values() -> list[str]:
    """The credential values currently in the environment, longest first."""
    values = {
        value
        for name, value in os.environ.items()
        if _SECRET_NAME.search(name) and len(value.strip()) >= _MIN_SECRET_LENGTH
    }
    return sorted(values, key=len, reverse=True)


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with environment credentials, ``extra`` secrets and key-shaped strings replaced by ***."""
    for value in (*extra, *secret_values()):
        if value and len(value) >= _MIN_SECRET_LENGTH:
            text = text.replace(value, REDACTED)
    return _SECRET_SHAPES.sub(
        lambda m: f"{m.group(1)} {REDACTED}" if m.group(1) else REDACTED,
        text,
    )


def excerpt(text: str, most: int = 200) -> str:
    """``text`` redacted (:func:`redact`), then cut to its first ``most`` characters and "…": how a trace
    or an error quotes text of any length (an LM reply, a list of names). Redacted before it is cut, so
    that a key cut in two cannot escape the key shapes."""
    text = redact(text)
    return text if len(text) <= most else f"{text[:most]}…"


def question_hash(question: str) -> str:
    """A short, stable hash of a question: enough to count repeats of one question or to match a span
    with an access-log line, without writing the question (which may hold personal data) anywhere."""
    return hashlib.sha256(question.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]


class RedactingFilter(logging.Filter):
    """A logging filter for handlers: formats each record once and redacts the final message. It also
    escapes the characters that would act on a terminal (:func:`~crag_dspy.terminal.terminal_safe`):
    messages quote file names and documents ("skipped <file>: ..."), which are untrusted."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = terminal_safe(redact(message))
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            # Tracebacks carry the exception message; render and redact them here, once.
            record.exc_text = terminal_safe(redact(logging.Formatter().formatException(record.exc_info)))
            record.exc_info = None
        return True


def configure_logging(verbose: bool) -> None:
    """The CLIs' logging: INFO with ``verbose`` else WARNING, every handler behind :class:`RedactingFilter`."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
