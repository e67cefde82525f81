"""A bounded queue in front of the model, and the per-request deadline.

At most ``size`` questions are admitted (running or waiting), ``workers`` of them run at once on
threads. A request over the deadline is answered at once and its question is told to stop
(``on_timeout``): CRAG ends it as its next stage starts, since an LM call under way cannot be
interrupted. It keeps its place until it ends: questions abandoned by their clients can never pile up
beyond the bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["DeadlineExceeded", "ModelQueue", "QueueFull", "retry_after_s"]

T = TypeVar("T")

_FIRST_GUESS_S = 10.0  # mean seconds per question before one has been timed
_MAX_RETRY_AFTER_S = 120


class QueueFull(RuntimeError):
    """Every place is taken; ``retry_after`` is when one is likely free again."""

    def __init__(self, size: int, retry_after: int):
        super().__init__(f"the service is busy: {size} questions are running or waiting; retry later")
        self.retry_after = retry_after


class DeadlineExceeded(TimeoutError):
    """No answer within the deadline; ``started`` says whether the question had left the queue."""

    def __init__(self, seconds: float, started: bool):
        where = "the answer took" if started else "the question waited in the queue for"
        super().__init__(
            f"no answer within the {seconds:g} s deadline: {where} longer (setting CRAG_REQUEST_TIMEOUT_S)"
        )
        self.started = started


def retry_after_s(workers: int, mean_run_s: float) -> int:
    """Seconds until a place is likely free when every place is taken: one of ``workers`` questions
    running side by side ends about every ``mean_run_s / workers`` seconds."""
    return max(1, min(_MAX_RETRY_AFTER_S, math.ceil(mean_run_s / workers)))


class ModelQueue:
    """Runs functions on ``workers`` threads with at most ``size`` admitted at a time."""

    def __init__(self, workers: int, size: int):
        if size < workers:
            raise ValueError(f"the queue ({size}) must hold at least the workers ({workers})")
        self.workers, self.size = workers, size
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="crag-ask")
        self._lock = threading.Lock()
        self._admitted = 0
        self._mean_s = _FIRST_GUESS_S

    @property
    def admitted(self) -> int:
        """Questions running or waiting now, abandoned ones included."""
        return self._admitted

    def submit(self, fn: Callable[[], T]) -> tuple[Future[T], threading.Event]:
        """Admit ``fn`` or raise :class:`QueueFull`; the event is set once ``fn`` has started."""
        with self._lock:
            if self._admitted >= self.size:
                raise QueueFull(self.size, retry_after_s(self.workers, self._mean_s))
            self._admitted += 1
        started = threading.Event()
        context = contextvars.copy_context()  # as FastAPI's own thread pool: the request's context

        def timed() -> T:
            started.set()
            began = time.perf_counter()
            try:
                return context.run(fn)
            finally:
                self._record(time.perf_counter() - began)

        future = self._executor.submit(timed)
        future.add_done_callback(self._release)  # also on cancel: a question that never ran
        return future, started

    async def run(
        self, fn: Callable[[], T], timeout_s: float, *, on_timeout: Callable[[], None] | None = None
    ) -> T:
        """``fn``'s result, or :class:`DeadlineExceeded` after ``timeout_s`` (queueing included), when
        ``on_timeout`` is called to stop ``fn`` if it has started."""
        future, started = self.submit(fn)
        return await self.wait(future, started, timeout_s, on_timeout=on_timeout)

    async def wait(
        self,
        future: Future[T],
        started: threading.Event,
        timeout_s: float,
        *,
        on_timeout: Callable[[], None] | None = None,
    ) -> T:
        """The result of a function :meth:`submit` admitted, as :meth:`run` gives it (a streaming answer
        submits first, so that a full queue is a 503 before its stream begins)."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            future.cancel()  # succeeds only while it waits: then it never runs
            if on_timeout is not None:
                on_timeout()
            raise DeadlineExceeded(timeout_s, started.is_set()) from None

    def _record(self, seconds: float) -> None:
        with self._lock:
            self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    def _release(self, _future: Future) -> None:
        with self._lock:
            self._admitted -= 1

    def close(self) -> None:
        """Drop the waiting questions; running ones end in their threads."""
        self._executor.shutdown(wait=False, cancel_futures=True)
