"""OpenTelemetry spans for CRAG runs, through DSPy's callbacks.

Every stage of a question is a DSPy module (:mod:`crag_dspy.stages`), so a DSPy callback sees it start
and end with its inputs and the value it returned. :class:`OpenTelemetryCallback` turns those calls into
one span tree per question: ``CRAG`` > ``retrieve``, ``grade`` > ``grade_passage`` (one per passage,
with its score), ``rewrite``, ``search_web``, ``refine_internal`` / ``refine_external``, ``answer``, and
the LM calls under the stage that made them. The root span carries the action and the answer.

Install it once, for every program in the process::

    import dspy
    from crag_dspy.tracing import OpenTelemetryCallback

    dspy.configure(callbacks=[OpenTelemetryCallback()])  # spans go to the global tracer provider

Spans go to a tracing backend, often another team's, so they hold no secrets and, by default, no text a
user wrote or was answered: the question appears as the access log's hash (``crag.question_hash``), and
questions, queries and answers in clear need ``OpenTelemetryCallback(record_text=True)`` (a developer's
machine). A failed call's error is recorded redacted (:func:`~crag_dspy.redaction.redact`), as in
CRAG's own trace: providers echo keys in their error messages.

``mlflow.dspy.autolog()`` reads the same callbacks and needs nothing from this module. The OpenTelemetry
API ships with chromadb; an exporter (``opentelemetry-sdk``, OTLP) is the ``tracing`` extra.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Mapping
from typing import Any

import dspy
from dspy.utils.callback import ACTIVE_CALL_ID, BaseCallback

from .module import CRAG
from .protocols import Passage
from .redaction import question_hash, redact
from .stages import Answered, PassageGraded, Refined, RetryRound, Stage, WebSearched
from .trace import DocumentGrade

try:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as exc:  # pragma: no cover - chromadb depends on the API, so it is there
    raise ImportError("crag_dspy.tracing needs OpenTelemetry: pip install 'crag-dspy[tracing]'") from exc

__all__ = ["OpenTelemetryCallback", "span_name"]

_TEXT_LIMIT = 500  # characters of a question, query or answer kept on a span


def span_name(instance: Any) -> str:
    """A span's name: a stage's class in snake case (``grade_passage``), ``CRAG`` for the program, and
    the class name of any other module (``BinaryJudge``, ``Predict``)."""
    if isinstance(instance, Stage):
        name = type(instance).__name__
        return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    if isinstance(instance, CRAG):
        return "CRAG"
    return type(instance).__name__


class OpenTelemetryCallback(BaseCallback):
    """Spans for DSPy module and LM calls, nested as the calls were (DSPy's active call id), with CRAG's
    stage values as attributes. Thread-safe: one instance serves every thread of a server or batch.

    Args:
        tracer_provider: where spans go (default: the global provider, as configured by the app).
        record_text: also record questions, queries, answers and stage values in clear (redacted, cut at
            500 characters). Off by default: questions may hold personal data, and spans leave the
            service for a tracing backend; the question's hash (as in the access log) is always there.
    """

    def __init__(
        self, tracer_provider: otel_trace.TracerProvider | None = None, *, record_text: bool = False
    ):
        self._tracer = otel_trace.get_tracer("crag_dspy", tracer_provider=tracer_provider)
        self.record_text = record_text
        self._spans: dict[str, otel_trace.Span] = {}
        self._lock = threading.Lock()

    # -- DSPy's callback hooks ------------------------------------------------------------------
    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._start(call_id, span_name(instance), _input_attributes(inputs, self.record_text))

    def on_module_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        self._end(call_id, _output_attributes(outputs, self.record_text), exception)

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._start(call_id, "lm", {"lm.model": str(getattr(instance, "model", type(instance).__name__))})

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        self._end(call_id, {}, exception)

    # -- spans ----------------------------------------------------------------------------------
    def _start(self, call_id: str, name: str, attributes: Mapping[str, Any]) -> None:
        # DSPy sets the active call id after the start callbacks: here it is still the caller's.
        with self._lock:
            parent = self._spans.get(ACTIVE_CALL_ID.get() or "")
        context = otel_trace.set_span_in_context(parent) if parent is not None else None
        span = self._tracer.start_span(name, context=context, attributes=dict(attributes))
        with self._lock:
            self._spans[call_id] = span

    def _end(self, call_id: str, attributes: Mapping[str, Any], exception: BaseException | None) -> None:
        with self._lock:
            span = self._spans.pop(call_id, None)
        if span is None:
            return
        span.set_attributes(dict(attributes))
        if exception is not None:
            _record_error(span, exception)
        span.end()


def _record_error(span: otel_trace.Span, exception: BaseException) -> None:
    """``span.record_exception`` and an error status, with the message and traceback redacted: a
    provider's 401 may echo the key, and the span is exported as is."""
    kind = type(exception)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    stack = "".join(traceback.format_exception(kind, exception, exception.__traceback__))
    span.add_event(
        "exception",
        {
            "exception.type": name,
            "exception.message": redact(str(exception)),
            "exception.stacktrace": redact(stack),
            "exception.escaped": "False",
        },
    )
    span.set_status(Status(StatusCode.ERROR, redact(f"{kind.__name__}: {exception}")))


def _short(text: str) -> str:
    text = redact(text)
    return text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "..."


def _input_attributes(inputs: Mapping[str, Any], record_text: bool) -> dict[str, Any]:
    # Module.__call__'s arguments arrive as {"args": (...), "kwargs": {...}}.
    kwargs = inputs.get("kwargs") if isinstance(inputs.get("kwargs"), Mapping) else inputs
    args = inputs.get("args") or ()
    if args and isinstance(args[0], str) and "question" not in kwargs:  # crag("question?")
        kwargs = {**kwargs, "question": args[0]}
    attributes: dict[str, Any] = {}
    if isinstance(kwargs.get("question"), str):
        attributes["crag.question_hash"] = question_hash(kwargs["question"])
    for key in ("question", "query") if record_text else ():
        if isinstance(kwargs.get(key), str):
            attributes[f"crag.{key}"] = _short(kwargs[key])
    passage = kwargs.get("passage")
    if isinstance(passage, Passage):
        attributes.update({"crag.doc_id": passage.doc_id, "crag.rank": passage.rank})
    return attributes


def _output_attributes(value: Any, record_text: bool) -> dict[str, Any]:
    """The attributes that say what a stage found: scores, counts, the action, and with ``record_text``
    the queries and the answer."""
    attributes = _found(value)
    if record_text:
        return attributes
    return {k: v for k, v in attributes.items() if k not in _TEXT_ATTRIBUTES}


_TEXT_ATTRIBUTES = {"crag.query", "crag.answer", "crag.value"}  # what a user wrote or was told


def _found(value: Any) -> dict[str, Any]:
    if isinstance(value, PassageGraded):
        grade = value.grade
        attributes = {"crag.doc_id": grade.doc_id, "crag.score_source": grade.score_source}
        return attributes | ({"crag.score": grade.score} if grade.score is not None else {})
    if isinstance(value, Refined):
        return {"crag.strips": len(value.records), "crag.kept": len(value.kept)}
    if isinstance(value, WebSearched):
        return {"crag.query": _short(value.query), "crag.results": len(value.results)}
    if isinstance(value, Answered):
        return {"crag.answer": _short(value.answer), "crag.context_chars": len(value.context)}
    if isinstance(value, RetryRound):
        return {"crag.query": _short(value.query), "crag.passages": len(value.passages)} | (
            {"crag.error": redact(value.error)} if value.error else {}
        )
    if isinstance(value, list) and value and all(isinstance(g, DocumentGrade) for g in value):
        scores = [g.score for g in value if g.score is not None]
        return {"crag.graded": len(value), "crag.unknown": len(value) - len(scores)} | (
            {"crag.best_score": max(scores)} if scores else {}
        )
    if isinstance(value, list) and all(isinstance(p, Passage) for p in value):
        return {"crag.passages": len(value), "crag.passage_ids": [p.id for p in value]}
    if isinstance(value, str):
        return {"crag.value": _short(value)}
    if isinstance(value, dspy.Prediction) and "trace" in value:
        trace = value.trace
        usage = trace.total_usage
        return {
            "crag.action": trace.action or "",
            "crag.answer": _short(trace.answer or ""),
            "crag.lm_calls": usage.calls,
            "crag.fallbacks": len(trace.fallbacks),
            "crag.errors": len(trace.errors),
        }
    return {}
