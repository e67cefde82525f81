"""Work shared between program variants: each piece computed once, with the cost it took when it was.

Every variant the evaluation and threshold tuning compare is a call of ``CRAG.forward`` whose stages are
pieces of one :class:`SharedWork`, the stage cache the calls share (:class:`~crag_dspy.run.StageCache`):
each computed once with the LM usage and time it took, so a variant costs, *standalone*, the sum of the
pieces it used, and the whole comparison only the distinct pieces.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import dspy

from crag_dspy.faults import raise_if_lm_down
from crag_dspy.stages import Computed
from crag_dspy.trace import usage_from_tracker

from .cost import Cost, RequestCounter

__all__ = ["SharedWork"]

T = TypeVar("T")


@dataclass
class _Entry:
    """A computed piece: its value (or the error it raised), own cost, owner and the pieces it used."""

    value: Any
    cost: Cost
    owner: str | None
    error: Exception | None = None
    deps: set[Hashable] = field(default_factory=set)


@dataclass(eq=False)
class _Frame:
    """A piece being computed: the pieces it used and what those computed inside it cost."""

    key: Hashable = None
    children: Cost = field(default_factory=Cost)
    deps: set[Hashable] = field(default_factory=set)
    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class _Scope:
    """One thread's pieces being computed (innermost last), its consumer and the keys that one uses."""

    frames: tuple[_Frame, ...] = ()
    consumer: str | None = None
    used: set[Hashable] | None = None


_IDLE = _Scope()


class SharedWork:
    """A memo of named pieces of work, each with the *own* cost measured when it was computed.

    A piece computed inside another (a judgement inside grading) is charged to itself only and is a
    dependency of the outer one. ``with work.consumer(name) as used:`` collects the keys a consumer
    used, computed or reused, with their dependencies; a piece's owner is the consumer that computed it.
    Thread-safe: each thread has its own pieces being computed and consumer (a context variable, which
    threads of :func:`optimize.parallel.map_questions` inherit); a piece is computed by one thread while
    the others wait, and belongs to whichever got there first (its cost, bar seconds, is the same).
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._pending: dict[Hashable, threading.Event] = {}  # set once the piece is computed
        self._lock = threading.Lock()
        # One per instance: two works keep separate scopes.
        self._scope = contextvars.ContextVar[_Scope](f"work_{id(self):x}", default=_IDLE)
        self._counter = RequestCounter(self._count_request)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @contextmanager
    def consumer(self, name: str) -> Iterator[set[Hashable]]:
        used: set[Hashable] = set()
        token = self._scope.set(replace(self._scope.get(), consumer=name, used=used))
        try:
            yield used
        finally:
            self._scope.reset(token)

    @contextmanager
    def collecting(self) -> Iterator[set[Hashable]]:
        """The keys used inside, as :meth:`consumer` collects them, without naming a new consumer: the
        pieces computed inside still belong to the current one (whose keys get these too)."""
        outer = self._scope.get().used
        used: set[Hashable] = set()
        token = self._scope.set(replace(self._scope.get(), used=used))
        try:
            yield used
        finally:
            self._scope.reset(token)
            if outer is not None:
                outer |= used

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The piece ``key``, computed with ``compute()`` the first time only. A piece whose computation
        raised raises the same error again: a flaky backend must not give variants different inputs. In a
        batch (:func:`~crag_dspy.faults.watch_lm`) an LM that counts as down stops it here."""
        raise_if_lm_down()
        scope = self._scope.get()
        if scope.frames:
            with self._lock:
                scope.frames[-1].deps.add(key)
        entry = self._entry(key, compute, scope)
        if scope.used is not None:  # the key and, transitively, the pieces it was made of
            with self._lock:
                pending = [key]
                while pending:
                    if (k := pending.pop()) not in scope.used:
                        scope.used.add(k)
                        pending.extend(self._entries[k].deps if k in self._entries else ())
        if entry.error is not None:
            raise entry.error
        return entry.value

    def _entry(self, key: Hashable, compute: Callable[[], Any], scope: _Scope) -> _Entry:
        """The entry of ``key``: memoized, waited for while another thread computes it, or computed."""
        while True:
            with self._lock:
                if (entry := self._entries.get(key)) is not None:
                    return entry
                if (pending := self._pending.get(key)) is None:
                    pending = self._pending[key] = threading.Event()
                    break
            if any(frame.key == key for frame in scope.frames):
                # Waiting would never end (the piece waits for itself); sequentially it would recurse.
                raise RuntimeError(f"shared piece {key!r} needs itself")
            pending.wait()  # then memoized, or its computation was interrupted: look again
        try:
            entry = self._compute(key, compute, scope)
            with self._lock:
                self._entries[key] = entry
            return entry
        finally:
            with self._lock:
                del self._pending[key]
            pending.set()

    def _count_request(self, requests: int, tokens: int) -> None:
        if frames := self._scope.get().frames:
            with self._lock:
                frames[-1].requests += requests
                frames[-1].tokens += tokens

    def _compute(self, key: Hashable, compute: Callable[[], Any], scope: _Scope) -> _Entry:
        frame = _Frame(key)
        token = self._scope.set(replace(scope, frames=(*scope.frames, frame)))
        callbacks = dspy.settings.callbacks or []
        started = time.perf_counter()
        value, error = None, None
        try:
            with (
                dspy.context(callbacks=[*callbacks, self._counter])
                if self._counter not in callbacks
                else nullcontext(),
                dspy.track_usage() as tracker,
            ):
                try:
                    value = compute()
                except Exception as exc:  # noqa: BLE001 - memoized and re-raised to every user of the piece
                    error = exc
        finally:
            self._scope.reset(token)
        # Usage and time are inclusive (nested pieces' too) and made exclusive here; requests and their
        # tokens are counted by the innermost piece only, so they are exclusive already.
        inclusive = Cost(
            usage_from_tracker(tracker), time.perf_counter() - started, frame.requests, frame.tokens
        )
        with self._lock:
            if parent := scope.frames[-1] if scope.frames else None:
                parent.children = parent.children.plus(Cost(inclusive.usage, inclusive.seconds))
            return _Entry(value, inclusive.minus(frame.children), scope.consumer, error, set(frame.deps))

    def cost(self, keys: Iterable[Hashable]) -> Cost:
        """What the pieces ``keys`` cost together: a consumer's standalone cost."""
        with self._lock:
            return Cost.total(self._entries[k].cost for k in keys if k in self._entries)

    def notes(self, keys: Iterable[Hashable]) -> list[str]:
        """The errors the stages among ``keys`` recorded as they computed (LM errors they degraded around)."""
        with self._lock:
            values = [self._entries[k].value for k in keys if k in self._entries]
        return [error for value in values if isinstance(value, Computed) for error in value.errors]

    def owned(self) -> dict[str | None, Cost]:
        """The cost of the pieces each consumer computed first (its marginal cost)."""
        owners: dict[str | None, Cost] = {}
        with self._lock:
            for entry in self._entries.values():
                owners[entry.owner] = owners.get(entry.owner, Cost()).plus(entry.cost)
        return owners

    def total(self) -> Cost:
        """What everything computed so far actually cost."""
        with self._lock:
            return Cost.total(e.cost for e in self._entries.values())
