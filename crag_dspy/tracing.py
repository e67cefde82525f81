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

``mlflow.dspy.autolog()`` reads the same callbacks and needs nothing from this module. The OpenTelemetry
API ships with chromadb; an exporter (``opentelemetry-sdk``, OTLP) is the ``tracing`` extra.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import dspy
from dspy.utils.callback import ACTIVE_CALL_ID, BaseCallback

from .module import CRAG
from .protocols import Passage
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
    """

    def __init__(self, tracer_provider: otel_trace.TracerProvider | None = None):
        self._tracer = otel_trace.get_tracer("crag_dspy", tracer_provider=tracer_provider)
        self._spans: dict[str, otel_trace.Span] = {}
        self._lock = threading.Lock()

    # -- DSPy's callback hooks ------------------------------------------------------------------
    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._start(call_id, span_name(instance), _input_attributes(inputs))

    def on_module_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        self._end(call_id, _output_attributes(outputs), exception)

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
            span.record_exception(exception)
            span.set_status(Status(StatusCode.ERROR, f"{type(exception).__name__}: {exception}"))
        span.end()


def _short(text: str) -> str:
    return text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "..."


def _input_attributes(inputs: Mapping[str, Any]) -> dict[str, Any]:
    # Module.__call__'s arguments arrive as {"args": (...), "kwargs": {...}}.
    kwargs = inputs.get("kwargs") if isinstance(inputs.get("kwargs"), Mapping) else inputs
    args = inputs.get("args") or ()
    if args and isinstance(args[0], str) and "question" not in kwargs:  # crag("question?")
        kwargs = {**kwargs, "question": args[0]}
    attributes: dict[str, Any] = {}
    for key in ("question", "query"):
        if isinstance(kwargs.get(key), str):
            attributes[f"crag.{key}"] = _short(kwargs[key])
    passage = kwargs.get("passage")
    if isinstance(passage, Passage):
        attributes.update({"crag.doc_id": passage.doc_id, "crag.rank": passage.rank})
    return attributes


def _output_attributes(value: Any) -> dict[str, Any]:
    """The attributes that say what a stage found: scores, counts, the action and the answer."""
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
            {"crag.error": value.error} if value.error else {}
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
