"""Map a function over questions on N threads: results in input order, DSPy settings kept, errors raised.

Worth it only when the LM serves requests concurrently (a hosted API, a vLLM or llama.cpp server with
several slots): the threads then wait for the LM together. The embedded llama.cpp model serves one
request at a time, so more threads gain nothing there.

Each task runs in a copy of the caller's :mod:`contextvars` context, as it was when the tasks were
submitted, so ``dspy.context(lm=...)`` overrides (DSPy keeps them in a context variable), DSPy's
callback ancestry and :class:`~optimize.shared_work.SharedWork`'s current consumer all reach the
worker threads; a setting a task changes stays in its own copy. DSPy's own ``ParallelExecutor`` is not
used: it logs and swallows a task's exception (returning None in its place) and resubmits a task
running longer than its straggler timeout, which would run a question twice.

LM usage: when the caller tracks usage (``dspy.track_usage()``), each task records into a tracker of
its own and the caller's tracker receives them in input order once all tasks are done, exactly what a
sequential run records (a shared tracker would be appended to from several threads at once).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from typing import TypeVar

import dspy
from dspy.utils.usage_tracker import UsageTracker
from tqdm.auto import tqdm

__all__ = ["check_num_threads", "map_questions"]

T = TypeVar("T")
R = TypeVar("R")


def check_num_threads(num_threads: int, flag: str = "num_threads") -> int:
    """``num_threads`` when it is a whole number >= 1, else a ValueError naming ``flag``."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"{flag} must be a whole number of at least 1, got {num_threads!r}")
    return num_threads


def map_questions(
    fn: Callable[[T], R],
    items: Iterable[T],
    *,
    num_threads: int = 1,
    desc: str | None = None,
    progress: bool = True,
    unit: str = "question",
) -> list[R]:
    """``[fn(item) for item in items]`` on ``num_threads`` threads, with a tqdm progress bar.

    Results keep the input order whatever order the tasks finish in. With one thread (or one item)
    everything runs in the calling thread, as a plain loop would. When a task raises, tasks not yet
    started are cancelled, those running are waited for, and the exception of the earliest failed item
    (in input order) is raised; a KeyboardInterrupt does not wait for the running tasks.
    """
    check_num_threads(num_threads)
    items = list(items)
    with tqdm(total=len(items), desc=desc, unit=unit, disable=not progress) as bar:
        if num_threads == 1 or len(items) <= 1:
            results = []
            for item in items:
                results.append(fn(item))
                bar.update()
            return results
        return _map_threads(fn, items, num_threads, bar)


def _map_threads(fn: Callable[[T], R], items: list[T], num_threads: int, bar: tqdm) -> list[R]:
    parent = dspy.settings.usage_tracker

    def task(item: T) -> tuple[R, UsageTracker | None]:
        tracker = UsageTracker() if parent is not None else None
        with dspy.context(usage_tracker=tracker) if tracker is not None else nullcontext():
            return fn(item), tracker

    pool = ThreadPoolExecutor(max_workers=min(num_threads, len(items)), thread_name_prefix="map_questions")
    futures: list[Future] = []
    try:
        # One context copy per task, taken now: the caller's dspy.context(...) overrides included.
        futures = [pool.submit(contextvars.copy_context().run, task, item) for item in items]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            bar.update(len(done))
            if any(f.exception() is not None for f in done):
                break
    except BaseException:  # KeyboardInterrupt: stop submitting, leave running tasks behind
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True, cancel_futures=True)  # after a failure: no task still runs once we raise
    failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
    if failed:
        raise failed[0].exception()
    results = []
    for future in futures:
        value, tracker = future.result()
        if tracker is not None:
            for lm, entries in tracker.usage_data.items():
                parent.usage_data[lm].extend(entries)
        results.append(value)
    return results
