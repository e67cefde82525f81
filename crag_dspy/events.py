"""Stage events: what a question's run has done so far, told as it happens.

A run (:class:`~crag_dspy.run.QuestionRun`) emits one :class:`StageEvent` as each stage's value is
recorded: the passages retrieved, their grades, the action, the web query, the strips kept, the
answer and its citations. They reach a caller two ways, both fed by the same emission:

- ``CRAG(...)(question, on_event=callback)``: the callback gets each event in the run's thread (the
  CLI prints them, the server's ``POST /ask/stream`` sends them as server-sent events);
- ``dspy.streamify(crag, ...)``: each event is a :class:`StageStatus` (DSPy's ``StatusMessage``, its
  ``message`` formatted by a :class:`StageMessages` provider when one is given), next to the answer's
  tokens when an :func:`answer_listener` is on the answer field. :func:`run_with_tokens` drives that
  from plain code: the events to ``on_event``, the answer's tokens to a callback.

Events carry counts, titles, ids, scores, the web query, the answer and its citations: never passage
or web page contents, and every string passes :func:`~crag_dspy.redaction.redact`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import dspy
from dspy.streaming.messages import (
    StatusMessage,
    StatusMessageProvider,
    StatusStreamingCallback,
    StreamResponse,
    sync_send_to_stream,
)
from dspy.streaming.streaming_listener import StreamListener
from pydantic import BaseModel, Field, computed_field

from .adapters import TextAdapter
from .redaction import StreamRedactor, redact

__all__ = [
    "EventKind",
    "StageEvent",
    "StageMessages",
    "StageStatus",
    "answer_listener",
    "describe",
    "run_with_tokens",
    "send_to_dspy_stream",
]

EventKind = Literal[
    "standalone", "retrieved", "graded", "action", "web_query", "strips_kept", "answer", "citations"
]
EventCallback = Callable[["StageEvent"], None]
TokenCallback = Callable[[str], None]


class StageEvent(BaseModel):
    """One thing a run did: ``kind`` says what, ``data`` holds its JSON-able details (see
    :func:`describe` for each kind's fields), ``seconds`` is the time since the run began."""

    kind: EventKind
    data: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0

    @computed_field  # in the JSON too: the page and SSE clients show the line `ask` prints
    @property
    def message(self) -> str:
        """The event as one line of text (``describe``)."""
        return describe(self)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    return value


def make_event(kind: EventKind, seconds: float, **data: Any) -> StageEvent:
    """A :class:`StageEvent` with every string in ``data`` redacted (web queries and answers are LM
    output, which may echo what a provider put in an error)."""
    return StageEvent(kind=kind, data=_redacted(data), seconds=round(seconds, 3))


def _scores(scores: list[float | None]) -> str:
    return ", ".join("?" if s is None else f"{s:.2f}" for s in scores)


def describe(event: StageEvent) -> str:
    """One line saying what ``event`` tells, e.g. ``graded 3 passages: 0.91, 0.40, ?``."""
    d = event.data
    match event.kind:
        case "standalone":
            return f"standalone question: {d['question']}"
        case "retrieved":
            return f"retrieved {len(d['titles'])} passages" + (
                f": {'; '.join(d['titles'])}" if d["titles"] else ""
            )
        case "graded":
            return f"graded {len(d['scores'])} passages: {_scores(d['scores'])}"
        case "action":
            return f"action {d['action']} (thresholds {d['lower']:.2f} / {d['upper']:.2f})"
        case "web_query":
            return f"searched the web for {d['query']!r}: {d['results']} results"
        case "strips_kept":
            return f"kept {d['kept']} of {d['strips']} {d['source']} strips"
        case "answer":
            return f"answer: {d['answer']}"
        case "citations":
            sources = [c["label"] for c in d["citations"]]
            return f"cited {len(sources)}: {'; '.join(sources)}" if sources else "no citations"
    raise ValueError(f"unknown stage event kind {event.kind!r}")


class StageStatus(StatusMessage):
    """A stage event as DSPy's status message: ``dspy.streamify(crag)`` yields it like any other
    ``StatusMessage`` (``message``: the text), with the structured ``event`` kept."""

    def __init__(self, message: str, event: StageEvent):
        super().__init__(message)
        self.event = event

    def __repr__(self) -> str:
        return f"StageStatus(message={self.message!r}, kind={self.event.kind!r})"


class StageMessages(StatusMessageProvider):
    """The status messages of ``dspy.streamify(crag, status_message_provider=StageMessages())``.

    Override :meth:`stage_message` to word the stage events otherwise, or return None to leave one out;
    the other hooks are DSPy's (by default silent for modules and LM calls, so the stream holds the
    stages, not each of the judges' many LM calls). Without this provider, events stream with the
    :func:`describe` text."""

    def stage_message(self, event: StageEvent) -> str | None:
        """The text of ``event``'s status message; None streams nothing for it."""
        return describe(event)


def _provider() -> StatusMessageProvider | None:
    """The status message provider streamify installed in this context, if any."""
    for callback in dspy.settings.callbacks or ():
        if isinstance(callback, StatusStreamingCallback):
            return callback.status_message_provider
    return None


def send_to_dspy_stream(event: StageEvent) -> None:
    """Send ``event`` into the stream of ``dspy.streamify`` when the run is inside one (else nothing).

    Called from the run's own thread (the one streamify's ``asyncify`` started), never from the
    threads of concurrent judge calls: DSPy's ``sync_send_to_stream`` reaches the event loop from there."""
    stream = dspy.settings.send_stream
    if stream is None:
        return
    provider = _provider()
    formatter = getattr(provider, "stage_message", None)
    message = formatter(event) if callable(formatter) else describe(event)
    if message:
        sync_send_to_stream(stream, StageStatus(message, event))


class _BareAnswerListener(StreamListener):
    """DSPy's :class:`~dspy.streaming.StreamListener` that also reads the answerer's bare reply.

    The answerer replies in :class:`~crag_dspy.adapters.TextAdapter`'s format: the reply is the answer
    itself, with no ``[[ ## answer ## ]]`` header for DSPy's listener to wait for, so each content
    chunk is a token of the answer. With another adapter configured (ChatAdapter, JSON, XML), DSPy's
    own parsing applies. The tokens are the LM's draft: the final answer (event ``answer``, the
    prediction) may add a unit or be "I don't know" when no kept strip states it."""

    def receive(self, chunk: Any) -> StreamResponse | None:
        adapter = dspy.settings.adapter
        if adapter is not None and not isinstance(adapter, TextAdapter):
            return super().receive(chunk)
        try:
            choice = chunk.choices[0]
            text = choice.delta.content
        except (AttributeError, IndexError):
            return None  # a usage or role-only chunk: no text
        # The reply's last chunk says why it ended: the draft's end is told then, not once the whole run
        # is over (DSPy's finalize), so text kept back until then (run_with_tokens) comes before the
        # answer stage's event.
        ended = getattr(choice, "finish_reason", None) is not None
        if not text and not ended:
            return None
        self.stream_start = self.stream_start or bool(text)
        return StreamResponse(self.predict_name, self.signature_field_name, text or "", is_last_chunk=ended)

    def finalize(self) -> StreamResponse | None:
        adapter = dspy.settings.adapter
        if adapter is not None and not isinstance(adapter, TextAdapter):
            return super().finalize()
        if not self.stream_start:
            return None
        self.stream_end = True
        return StreamResponse(self.predict_name, self.signature_field_name, "", is_last_chunk=True)


def answer_listener(crag: Any) -> StreamListener:
    """A listener on ``crag``'s answer for ``dspy.streamify(crag, stream_listeners=[...])``: the
    answerer's tokens as DSPy ``StreamResponse`` chunks, when the LM streams (a hosted LM through
    LiteLLM does; an LM that cannot stream gives the final prediction only). ``allow_reuse``: the
    answerer may be asked again after an unusable reply."""
    return _BareAnswerListener("answer", predict=crag.answerer, predict_name="answerer", allow_reuse=True)


def run_with_tokens(crag: Any, on_token: TokenCallback, **inputs: Any) -> dspy.Prediction:
    """``crag(**inputs)``, handing the answerer's tokens to ``on_token`` as the LM writes them.

    It runs inside ``dspy.streamify`` with an :func:`answer_listener` (a synchronous stream, so it
    suits a worker thread such as a server's); pass ``on_event`` in ``inputs`` for the stages. The LM is
    then called with ``stream=True`` for the answer only: a hosted model or the embedded server send
    tokens, an LM that cannot stream (or an answer from DSPy's cache) sends none and the prediction
    comes all the same. The tokens are the LM's draft, the prediction's answer is final (see
    :func:`answer_listener`); they are redacted as the answer is, a word or a possible secret's start kept
    back until the next token shows it is not one (:class:`~crag_dspy.redaction.StreamRedactor`). The run's exceptions are raised as ``crag(**inputs)`` raises them."""
    stream = dspy.streamify(crag, stream_listeners=[answer_listener(crag)], async_streaming=False)
    prediction = None
    # Redacted as every answer is: an LM (or gateway) echoing a key must not send it out token by token.
    redactor = StreamRedactor()
    for item in stream(**inputs):
        if isinstance(item, StreamResponse):
            text = redactor.feed(item.chunk) + (redactor.flush() if item.is_last_chunk else "")
            if text:
                on_token(text)
        elif isinstance(item, dspy.Prediction):
            prediction = item
            if rest := redactor.flush():  # an answer whose stream never said it ended
                on_token(rest)
    if prediction is None:  # streamify always ends with the prediction unless the run raised
        raise RuntimeError("the streamed run ended without a prediction")
    return prediction
