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
import stat
from pathlib import Path

from .held_text import prefix_at_end
from .terminal import one_line, terminal_safe

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "StreamRedactor",
    "configure_logging",
    "dotenv_variables",
    "excerpt",
    "question_hash",
    "redact",
    "secret_values",
    "set_key_advice",
]

REDACTED = "***"

# Variables whose values are credentials: the providers' own (OPENAI_API_KEY, TAVILY_API_KEY, ...) and
# anything named like one, Chroma's client credentials too (CHROMA_CLIENT_AUTH_CREDENTIALS: a Chroma
# server that echoes its token in an error put it in clear in traces and logs, probe 6).
_SECRET_NAME = re.compile(
    r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY)", re.IGNORECASE
)
_SECRET_SHAPES = re.compile(
    r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"  # Authorization header values
    r"|\b(sk|tvly|gsk|xai|pk|rk)-[A-Za-z0-9_-]{8,}"  # OpenAI/Anthropic, Tavily, Groq, xAI-style keys
    r"|\bAIza[0-9A-Za-z_-]{20,}"  # Google API keys
    # user:password@host in URLs, with or without the scheme (LiteLLM's connection errors drop it). Only
    # a ":password" part is redacted, so e-mail addresses (and "mailto:") in answers stay as they are.
    r"|(?<![^\s/'\"(<\[=,;])(?!mailto:)[^\s/:@'\"<>()\[\]]+:[^\s/@'\"<>]+(?=@[\w\[])"
)
_MIN_SECRET_LENGTH = 6  # shorter values ("1", "true") would redact ordinary words
# A variable may hold a list of keys (CRAG_API_KEYS="key-a,key-b"): each item is a secret of its own, and
# an LM that echoes one key must not show it. Items are cut at commas and whitespace, and only those of a
# key's length count (CRAG refuses service keys under 16 characters), so the words of a passphrase held
# whole ("open sesame 42") are not redacted everywhere one by one.
_LIST_SEPARATORS = re.compile(r"[,\s]+")
_MIN_LIST_ITEM_LENGTH = 16


_DOTENV: list = [None, {}]  # (where and when ./.env was read, its variables)


def dotenv_variables() -> dict[str, str]:
    """The variables of ``.env`` in the working folder, which CRAG's settings and chromadb's read besides
    the environment: a credential kept there (``CHROMA_CLIENT_AUTH_CREDENTIALS``, ``CRAG_API_KEYS``) was
    used but not redacted (probe 8). Read again only when the file changes; a non-regular file (a pipe)
    is never opened."""
    path = Path(".env")
    try:
        status = path.stat()
    except OSError:
        return {}
    if not stat.S_ISREG(status.st_mode):
        return {}
    key = (str(path.resolve()), status.st_mtime_ns, status.st_size)
    if _DOTENV[0] != key:
        from dotenv import dotenv_values  # pydantic-settings' own reader of the same file

        _DOTENV[:] = [key, {name: value for name, value in dotenv_values(path).items() if value}]
    return _DOTENV[1]


def set_key_advice(variable: str) -> str:
    """What to do about the missing key ``variable``: set it in the environment; and when ``.env`` holds it,
    that it is not read from there (keys come from the environment only; ``.env`` gives ``CRAG_*``
    settings), as a key seen there and silently skipped looked like a bug (probe 9)."""
    advice = f"set the environment variable {variable}"
    if variable in dotenv_variables():
        advice += (
            f" (the .env file here holds {variable}, but keys are read from the environment only: export it)"
        )
    return advice


def secret_values() -> list[str]:
    """The credential values currently in the environment or in ``.env`` (:func:`dotenv_variables`),
    and the items of the list-valued ones (``_LIST_SEPARATORS``), longest first."""
    values: set[str] = set()
    for name, value in (*dotenv_variables().items(), *os.environ.items()):
        if not _SECRET_NAME.search(name):
            continue
        if len(value.strip()) >= _MIN_SECRET_LENGTH:
            values.add(value)
        values.update(i for i in _LIST_SEPARATORS.split(value) if len(i) >= _MIN_LIST_ITEM_LENGTH)
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


# The end of streamed text that a key-shaped string may still grow from: the last word, with a "Bearer "
# before it (every shape is one word but a header value's). Looked for in the last _MAX_HELD characters
# only, so a reply with no spaces streams in pieces instead of being held (and rescanned) whole.
_OPEN_TAIL = re.compile(r"(?i)(?:\b(?:bearer|basic)\s+)?\S*\Z")
_MAX_HELD = 512


class StreamRedactor:
    """Redacts text that arrives in pieces (an LM's streamed tokens), where a secret may span pieces.

    :meth:`feed` returns the text that can no longer be part of a secret, redacted, and keeps back the
    rest: a possible start of a secret value (:func:`~crag_dspy.held_text.prefix_at_end`, as a streamed
    completion keeps back a possible stop string), a value holding a space that reaches past the cut, and
    the last word (a key-shaped string may still grow). :meth:`flush` returns what is kept, redacted,
    once the text is complete. The pieces returned join to ``redact`` of the whole text."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> str:
        """The redacted text ``text`` lets out (maybe empty)."""
        self._pending += text
        cut = _safe_cut(self._pending, secret_values())
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return redact(ready)

    def flush(self) -> str:
        """The redacted rest: the text is complete."""
        rest, self._pending = self._pending, ""
        return redact(rest)


def _safe_cut(text: str, values: list[str]) -> int:
    """Where ``text`` may be cut so that no secret value or key-shaped string spans the cut."""
    tail = _OPEN_TAIL.search(text, max(0, len(text) - max(_MAX_HELD, *map(len, values), 0)))
    cut = min(tail.start() if tail else len(text), len(text) - prefix_at_end(text, values))
    moved = True
    while moved:  # a whole value holding a space may span the cut: the cut moves to its start
        moved = False
        for value in values:
            start = text.find(value, max(0, cut - len(value) + 1))
            if -1 < start < cut:
                cut, moved = start, True
    return cut


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
    escapes the characters that would act on a terminal, newlines too (:func:`~crag_dspy.terminal.one_line`):
    messages quote file names and documents ("skipped <file>: ..."), which are untrusted, and a record is one
    line, so a name holding "\\nERROR ..." cannot forge another. A traceback keeps its lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = one_line(redact(message))
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
