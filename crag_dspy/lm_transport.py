"""Bounds on one LM HTTP call: a total deadline, a reply size cap, and only a final 2xx taken as a reply.

DSPy 3.4's transport (its vendored lm15, ``dspy<3.5`` is pinned) times each read, not the call: its read
timeout (``CRAG_LM_TIMEOUT_S``) bounds the wait for the NEXT byte, and no reply size is capped. A server
whose 200 body never ends grew memory to 13 GB in 45 s; one dripping a byte a second (in the body, the
headers or endless chunked trailers) held ``ask`` or a ``serve`` worker forever; a 5 KB reply gzipped
twice inflated to 2.4 GB; a redirect (an HTTP base URL answered ``301``) was read as a completion. DSPy
gives no setting for any of these, so :func:`patch_lm_transport` wraps the transports (idempotently):

- **One deadline per call.** The transports' ``stream`` (sync) and ``_do_stream`` (async) start a
  :class:`_Call` that every wait of the call consults: connecting, writing, the response head, the body
  and its trailers. Each wait is cut to the time left before ``CRAG_LM_TIMEOUT_S`` from the request's
  start; past it, the call fails with lm15's ``ReadTimeout``. Sync waits are socket operations (the
  connection's socket is wrapped, :class:`_DeadlineSocket`); async ones go through lm15's ``wait_for``,
  which is wrapped. The same :class:`_Call` counts the raw bytes received against
  :data:`MAX_LM_REPLY_BYTES` (lm15's ``ReadError`` past it).
- **Decoded size.** A compressed reply (lm15 asks for ``identity``, but gateways ignore that) is inflated
  at most :data:`MAX_LM_REPLY_BYTES` per coding layer, chunk by chunk (:class:`_BoundedInflater`), so
  memory stays bounded whatever the compression ratio.
- **Text.** A lone surrogate a reply's JSON escapes (``"\\ud800"``, in a full reply or a streamed delta) is
  U+FFFD (:func:`crag_dspy.validation.replace_surrogates`): decoded as is, it is text no response, log
  line or file can hold as UTF-8.
- **Status.** A final status that is neither 2xx nor an error (1xx, 3xx: lm15 follows no redirect, and
  must not read a redirect's body as the answer) raises lm15's ``ProviderError`` carrying the status,
  which DSPy does not retry and CRAG counts as a failed call (:func:`crag_dspy.faults.classify_lm_error`).
- **An empty completion.** A 2xx chat completion with no choice (``"choices": []``) or whose message has
  no content (``null``, ``""`` or whitespace, and no tool call or refusal), or content that is no text
  (a number, an object, parts that are not text parts), is read by lm15 as an empty answer, which DSPy's
  adapter then fails to parse on every call: an outage reported as "I don't know". It raises the
  ``TypeError`` lm15 raises for JSON that is no completion object (:func:`_empty_completion`), so it is the
  same failed call (an unreadable reply) to DSPy and CRAG.

lm15's errors reach DSPy, which maps and retries them (a timeout or size cap as a transport fault) and
CRAG counts the failed call. Private vendored modules are imported by name at run time: type checkers
following them lose track of the ``dspy`` package's own exports (mypy then reports ``dspy.BaseLM``
undefined in users' code).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Any, TypeVar

from .validation import replace_surrogates

__all__ = ["MAX_LM_REPLY_BYTES", "patch_lm_transport"]

MAX_LM_REPLY_BYTES = 16 * 1024 * 1024
"""The largest LM reply read (16 MB, as received and as decoded; a chat completion is a few KB). A longer
one is a failed call."""

_T = TypeVar("_T")


def _lm15(module: str) -> Any:
    """One of lm15's transport modules (``_sync``, ``_async``, ``_http11``, ``_exceptions``), by name."""
    return importlib.import_module(f"dspy._vendor.lm15.transports.{module}")


def _too_large(how: str = "") -> Exception:
    """lm15's ``ReadError`` for a reply past :data:`MAX_LM_REPLY_BYTES` (``how``: as received, or decoded)."""
    return _lm15("_exceptions").ReadError(f"the LM's reply exceeded {MAX_LM_REPLY_BYTES / 2**20:g} MB{how}")


class _Call:
    """The bounds of one LM HTTP call, shared by the sync and async transports: its deadline
    (``limit_s`` seconds from its start) and the raw bytes received so far."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.deadline = time.monotonic() + limit_s
        self.received = 0

    def time_left(self) -> float:
        """Seconds left before the deadline; lm15's ``ReadTimeout`` once it has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _lm15("_exceptions").ReadTimeout(
                f"the LM's reply did not finish within {self.limit_s:g} s (CRAG_LM_TIMEOUT_S)"
            )
        return left

    def wait_s(self, timeout: float | None) -> float:
        """How long one wait of the call may take: lm15's own ``timeout`` for it, cut to the time left."""
        left = self.time_left()
        return left if timeout is None else min(timeout, left)

    def timed_out(self) -> None:
        """After a wait of the call timed out: the deadline's error when the deadline ended it and the reply
        had begun (the head or body dripping). A server silent from the start keeps lm15's own error, whose
        message CRAG words as "no reply for N s" (:func:`crag_dspy.faults.describe_error`)."""
        if self.received:
            self.time_left()

    def got(self, data: bytes) -> bytes:
        """Count ``data`` received; lm15's ``ReadError`` once the reply has grown past the cap."""
        self.received += len(data)
        if self.received > MAX_LM_REPLY_BYTES:
            raise _too_large()
        return data


_CALL: ContextVar[_Call | None] = ContextVar("crag_dspy_lm_call", default=None)
"""The LM call whose transport work runs in this context (thread or task), if any."""


@contextmanager
def _in_call(call: _Call) -> Iterator[None]:
    """Run the block's transport waits under ``call``'s bounds."""
    token = _CALL.set(call)
    try:
        yield
    finally:
        _CALL.reset(token)


class _DeadlineSocket:
    """A sync transport's socket whose receives and sends end at the deadline of the call in progress.

    lm15 sets a per-operation timeout (:meth:`settimeout`) before each loop of ``recv`` calls; each
    operation here waits at most the smaller of that and the call's time left. Everything else is the
    socket's own (``fileno`` for lm15's staleness check, ``close``)."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout: float | None = sock.gettimeout()

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self._sock.settimeout(timeout)

    def _bounded(self, operation: Callable[[Any], _T], arg: Any) -> _T:
        call = _CALL.get()
        if call is None:
            return operation(arg)
        self._sock.settimeout(call.wait_s(self._timeout))
        try:
            return operation(arg)
        except TimeoutError:
            call.timed_out()
            raise

    def recv(self, size: int) -> bytes:
        data = self._bounded(self._sock.recv, size)
        call = _CALL.get()
        return call.got(data) if call is not None else data

    def sendall(self, data: bytes) -> None:
        self._bounded(self._sock.sendall, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _deadline_wait_for(original: Callable[..., Awaitable[_T]]) -> Callable[..., Awaitable[_T]]:
    """lm15's async ``wait_for`` (every wait of its async transport goes through it), cut to the deadline
    of the call in progress; the bytes it returns (socket reads) count towards the size cap."""

    async def wait_for(awaitable: Awaitable[_T], timeout: float | None, **kwargs: Any) -> _T:
        call = _CALL.get()
        if call is None:
            return await original(awaitable, timeout, **kwargs)
        try:
            bounded = call.wait_s(timeout)
        except BaseException:
            getattr(awaitable, "close", lambda: None)()  # never started: no "never awaited" warning
            raise
        try:
            result = await original(awaitable, bounded, **kwargs)
        except TimeoutError:
            call.timed_out()
            raise
        if isinstance(result, bytes):
            call.got(result)
        return result

    return wait_for


def _bounded_inflater(base: type) -> type:
    """lm15's ``_Inflater`` (one content coding of a reply), inflating at most :data:`MAX_LM_REPLY_BYTES`.

    lm15 inflates each received chunk whole (``decompressobj().decompress(data)``), so one 5 KB chunk of a
    gzip bomb became 2.4 GB before any size check could see it. Here every zlib object the inflater uses
    (it makes a new one per gzip member) is wrapped to decompress with ``max_length``: the output of one
    layer never exceeds the cap by more than a byte, and past it the reply fails with lm15's ``ReadError``.
    """
    slot = base.__dict__["_obj"]  # lm15 keeps its zlib object in this slot and replaces it per gzip member

    class BoundedZlib:
        """A zlib decompress object whose outputs, added up for its inflater, stop at the cap."""

        def __init__(self, obj: Any, owner: Any) -> None:
            self._obj = obj
            self._owner = owner

        def _count(self, out: bytes) -> bytes:
            self._owner._left -= len(out)
            if self._owner._left < 0:
                raise _too_large(" once decompressed (Content-Encoding)")
            return out

        def decompress(self, data: bytes) -> bytes:
            return self._count(self._obj.decompress(data, self._owner._left + 1))

        def flush(self) -> bytes:  # only at the end of the stream, when nothing is held back
            return self._count(self._obj.flush())

        def __getattr__(self, name: str) -> Any:  # eof, unused_data
            return getattr(self._obj, name)

    class BoundedInflater(base):  # type: ignore[misc, valid-type]
        __slots__ = ("_left",)

        def __init__(self, coding: str) -> None:
            self._left = MAX_LM_REPLY_BYTES
            super().__init__(coding)

        @property
        def _obj(self) -> Any:
            return slot.__get__(self)

        @_obj.setter
        def _obj(self, obj: Any) -> None:
            slot.__set__(self, obj if obj is None else BoundedZlib(obj, self))

    BoundedInflater.__name__ = BoundedInflater.__qualname__ = "_BoundedInflater"
    return BoundedInflater


def _refusal(response: Any) -> Exception | None:
    """lm15's ``ProviderError`` (carrying the status) for a final status that is neither 2xx nor an
    error lm15 handles itself (>= 400): a 1xx, or a 3xx whose body (an HTML page, or even a completion
    from the wrong server) must not be read as the answer. Redirects are not followed: the base URL is
    wrong, and the message says where it points to."""
    status = response.status
    if 200 <= status < 300 or status >= 400:
        return None
    if status < 200:
        why = "an informational status, and no final one"
    else:
        location = response.header("location")
        where = f" (to {location[:200]}: set the LM's base URL to the final address)" if location else ""
        why = f"a redirect, which is not followed{where}"
    return importlib.import_module("dspy._vendor.lm15.errors").ProviderError(
        f"the LM server answered HTTP {status} {response.reason[:80]}: {why}", status=status
    )


def _empty_completion(data: Any, choice: int | None) -> str | None:
    """Why the chat completion ``data`` holds no answer at all (no choice, or a message without content,
    tool call or refusal, or whose content is neither text nor OpenAI's text parts), or None. Error bodies and other shapes are left to lm15's own checks."""
    if not isinstance(data, dict) or data.get("error") or not isinstance(data.get("choices", []), list):
        return None
    choices = data.get("choices") or []
    if not choices:
        return "the LM's reply is a chat completion without any choice"
    chosen = choices[choice or 0] if (choice or 0) < len(choices) else None
    message = chosen.get("message") if isinstance(chosen, dict) else None
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, list):
        # OpenAI's content parts: text parts are the answer, a refusal part is the LM's (see the docs).
        if any(_part_type(part) == "refusal" for part in content):
            return None
        texts = [part.get("text") for part in content if _part_type(part) == "text"]
        if not all(isinstance(text, str) for text in texts) or len(texts) < len(content):
            return "the LM's reply is a chat completion whose message content holds parts that are not text"
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        # 42 or {"text": ...}: lm15 reads no text from it, and DSPy's adapter fails on every call.
        return f"the LM's reply is a chat completion whose message content is no text (a {type(content).__name__})"
    # Servers differ in how they send an empty message (OpenAI null, others ""); whitespace is no answer
    # either, and a reasoning model that spent max_tokens thinking sends "" too: all the same failed call.
    empty = content is None or (isinstance(content, str) and not content.strip())
    if empty and not message.get("tool_calls") and not message.get("refusal"):
        shown = "null" if content is None else "empty" if not content else "only whitespace"
        return f"the LM's reply is a chat completion whose message has no content ({shown})"
    return None


def _without_bad_usage(data: Any) -> Any:
    """``data`` without its ``usage`` when lm15 cannot read it (a negative or non-numeric count): token
    counts are bookkeeping, and lm15 refused the whole completion over them, so a server reporting odd
    counts failed every call, reported as "no chat completion" (probe 6)."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not usage:
        return data
    chat = importlib.import_module("dspy._vendor.lm15.providers.openai_chat")
    try:
        chat._usage_from_chat(usage)
    except (TypeError, ValueError, AttributeError, OverflowError):
        data["usage"] = {}
    return data


def _refusal_parts_as_refusal(data: Any, choice: int | None) -> Any:
    """``data`` with a message whose content is only refusal parts (``[{"type": "refusal", "refusal":
    ...}]``) given as OpenAI's ``refusal`` field instead, which lm15 reads (it drops refusal parts), so
    that CRAG names the refusal (:data:`crag_dspy.adapters.REFUSAL`) rather than reading no text."""
    try:
        message = data["choices"][choice or 0]["message"]
        parts = message["content"]
    except (KeyError, IndexError, TypeError):
        return data
    if not isinstance(parts, list) or not parts or any(_part_type(part) != "refusal" for part in parts):
        return data
    said = " ".join(str(part.get("refusal") or "") for part in parts).strip()
    message.update(content=None, refusal=said or message.get("refusal") or "(no reason given)")
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (one of a pair, or a lone one)."""


def _valid_event(raw_event: Any) -> Any:
    """A streamed reply's server-sent event whose JSON ``data`` escapes a lone surrogate, with each one
    made U+FFFD (:func:`crag_dspy.validation.replace_surrogates`); other events as they are."""
    data = raw_event.data
    if not isinstance(data, str) or not _SURROGATE_ESCAPE.search(data):
        return raw_event
    try:
        payload = json.loads(data)
    except ValueError:
        return raw_event  # lm15 reports it as it does any malformed event
    return dataclasses.replace(raw_event, data=json.dumps(replace_surrogates(payload)))


def _part_type(part: Any) -> Any:
    """The ``type`` of one content part of a chat completion's message (None when it is no object)."""
    return part.get("type") if isinstance(part, dict) else None


def _drop(response: Any) -> None:
    """Close a sync ``response`` whose body is not wanted. lm15 frees the call's connection slot when its
    body generator ends, which a generator that never started does not do: it is started (one chunk
    read, under the call's bounds) before it is closed."""
    try:
        with suppress(Exception):
            next(response._chunks, None)
        response._chunks.close()
    finally:
        response.close()


def _bounded_body(call: _Call, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` (a reply body), each read under ``call``'s bounds."""
    try:
        while True:
            with _in_call(call):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk
    finally:
        getattr(chunks, "close", lambda: None)()  # lm15's body generator releases its connection slot


async def _abounded_body(call: _Call, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """:func:`_bounded_body` for the async transport."""
    try:
        while True:
            with _in_call(call):
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            yield chunk
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def patch_lm_transport() -> None:
    """Bound every LM HTTP call of this process (see the module's docstring); idempotent."""
    sync, asynchronous, http11 = _lm15("_sync"), _lm15("_async"), _lm15("_http11")
    transport = sync.StdlibTransport
    original = transport.stream
    if getattr(original, "_crag_bounded", False):
        return
    original_async = asynchronous.StdlibAsyncTransport._do_stream
    original_open = transport._open

    def stream(self: Any, request: Any) -> Any:
        call = _Call(request.read_timeout or self._read_timeout)
        with _in_call(call):
            response = original(self, request)
        response._chunks = _bounded_body(call, response._chunks)
        refusal = _refusal(response)
        if refusal is not None:
            _drop(response)
            raise refusal
        return response

    async def do_stream(self: Any, request: Any) -> Any:
        call = _Call(request.read_timeout or self._read_timeout)
        with _in_call(call):
            response = await original_async(self, request)
        refusal = _refusal(response)
        if refusal is not None:
            await response.aclose()  # the async transport frees the connection slot on close
            raise refusal
        response._chunks = _abounded_body(call, response._chunks)
        return response

    def open_connection(self: Any, *args: Any, connect_timeout: float, **kwargs: Any) -> Any:
        call = _CALL.get()
        if call is not None:
            connect_timeout = call.wait_s(connect_timeout)
        conn = original_open(self, *args, connect_timeout=connect_timeout, **kwargs)
        conn.sock = _DeadlineSocket(conn.sock)
        return conn

    chat = importlib.import_module("dspy._vendor.lm15.providers.openai_chat")
    original_read = chat._response_from_chat_body

    def read_chat_body(provider: str, data: Any, *args: Any, choice: int | None, **kwargs: Any) -> Any:
        data = _without_bad_usage(_refusal_parts_as_refusal(replace_surrogates(data), choice))
        empty = _empty_completion(data, choice)
        if empty is not None:
            raise TypeError(empty)  # as lm15 does for "choices must be an array": an unreadable reply
        return original_read(provider, data, *args, choice=choice, **kwargs)

    original_events = chat.OpenAIChatLM.parse_stream_events

    def parse_stream_events(self: Any, request: Any, raw_event: Any) -> Any:
        return original_events(self, request, _valid_event(raw_event))

    chat._response_from_chat_body = read_chat_body
    chat.OpenAIChatLM.parse_stream_events = parse_stream_events
    stream._crag_bounded = True  # type: ignore[attr-defined]
    transport.stream = stream
    transport._open = open_connection
    asynchronous.StdlibAsyncTransport._do_stream = do_stream
    asynchronous.wait_for = _deadline_wait_for(asynchronous.wait_for)
    http11._Inflater = _bounded_inflater(http11._Inflater)
