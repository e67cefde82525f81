"""One question's run: its trace, the health of its LM calls, its stage cache and its cancel event."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from .events import EventCallback, EventKind, StageEvent, make_event, send_to_dspy_stream
from .faults import LMHealth, RunCancelled
from .trace import CRAGTrace, TraceRecorder

__all__ = ["QuestionRun", "RunMemo", "StageCache"]

T = TypeVar("T")
_run_ids = itertools.count(1)


class StageCache(Protocol):
    """Where stage results are kept (:meth:`crag_dspy.stages.Stage.forward`), keyed by the stage's
    name, inputs, the state of what it uses and the config fields it reads. ``get`` returns the value
    kept under ``key``, calling ``compute()`` for it the first time only.

    A run keeps its own (:class:`RunMemo`): a text a judge is shown twice in one question is judged
    once. Threshold tuning and the evaluation pass one shared cache to many runs
    (:class:`optimize.shared_work.SharedWork`), so that every variant of a question computes each
    stage once."""

    def get(self, key: Hashable, compute: Callable[[], T]) -> T: ...


class RunMemo:
    """The :class:`StageCache` of one run. Its entries may be asked for from several threads at once
    (``lm_calls.concurrency``): the first computes, the others wait for its value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[Hashable, Future[Any]] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            kept = self._kept.get(key)
            mine = kept is None
            if mine:
                kept = self._kept[key] = Future()
        if mine:
            try:
                kept.set_result(compute())
            except BaseException as exc:
                kept.set_exception(exc)
                raise
        return kept.result()


class QuestionRun(TraceRecorder):
    """One question's trace recorder, the health of its LM calls (:class:`~crag_dspy.faults.LMHealth`),
    its stage cache (its own unless one is given) and ``cancel``: once that event is set, the run raises
    :class:`~crag_dspy.faults.RunCancelled` as its next stage starts. ``web_queries`` are the queries
    web search answered; ``web_failed`` is set when a search failed. ``id`` tells this run's cached
    results from those another run computed (whose trace entries a stage then copies into this one).
    ``on_event`` gets each :class:`~crag_dspy.events.StageEvent` the run emits, in the run's thread."""

    def __init__(
        self,
        trace: CRAGTrace,
        cache: StageCache | None = None,
        cancel: threading.Event | None = None,
        on_event: EventCallback | None = None,
    ):
        super().__init__(trace)
        self.on_event = on_event
        self._began = time.perf_counter()
        self.id = next(_run_ids)
        self.lm = LMHealth(trace)
        self.cache = cache if cache is not None else RunMemo()
        self.cancel = cancel if cancel is not None else threading.Event()
        self.web_queries: set[str] = set()
        self.web_failed = False
        self.states: dict[str, str] = {}
        """The state keys of what the run's stages use, by attribute name, computed once per run."""

    def before_stage(self, name: str) -> None:
        if self.cancel.is_set():
            self.error(f"cancelled before stage {name!r}: the caller stopped waiting")
            raise RunCancelled(self.trace.errors[-1], self.trace)

    def emit(self, kind: EventKind, **data: Any) -> StageEvent:
        """Tell the caller what the run just did: to ``on_event``, and into ``dspy.streamify``'s stream
        when the run is inside one. Call it from the run's own thread (a route, a stage's ``record``).
        An exception the callback raises stops the run: a caller that cannot take events is a bug."""
        event = make_event(kind, time.perf_counter() - self._began, **data)
        if self.on_event is not None:
            self.on_event(event)
        send_to_dspy_stream(event)
        return event
