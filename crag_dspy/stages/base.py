"""The stage base class: one hook that caches every stage's result, keyed without a hand-made list.

A stage's key is its name, its inputs, the state of the parts of the program it ``uses`` (predictors,
judges, the grade source, the retriever, the web search) and the values of the config fields it
``reads``. Adding a setting a stage reads means adding it to ``reads``, and the key changes with it:
nothing else lists config fields for caching. A run caches into its own memo; threshold tuning and the
evaluation give many runs one shared cache (:class:`~crag_dspy.run.StageCache`).

A stage writes the trace in two ways: :meth:`Stage.record` writes its value (replayed for every run
that reads a cached value), and the entries it appends while it computes (errors, fallbacks, grades,
defused notes) are kept with the value and copied into a run that reuses it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import reduce
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import dspy
from pydantic import BaseModel

from ..config import CRAGConfig
from ..judges.fusion import Grading
from ..judges.llm import BinaryJudge
from ..protocols import Retriever, WebSearch
from ..run import QuestionRun
from ..trace import CRAGTrace

__all__ = ["Computed", "Program", "Stage", "config_value", "pieces_of", "state_key"]

T = TypeVar("T")
TRACED_LISTS = ("errors", "fallbacks", "defused", "documents")
"""The trace's lists a stage appends to while it computes (its value's records are set by ``record``)."""


class Program(Protocol):
    """What stages read of the program they run in (:class:`~crag_dspy.module.CRAG` is one): its
    config, backends, grade source, judges and predictors."""

    config: CRAGConfig
    retriever: Retriever
    web_search: WebSearch
    grading: Grading
    grader: BinaryJudge
    strip_filter: BinaryJudge
    condenser: dspy.Predict
    rewriter: dspy.Predict
    reviser: dspy.Predict
    answerer: dspy.Predict


def state_key(*parts: Any) -> str:
    """A short, stable hash of JSON-able state (predictor demos and instructions, config values)."""
    blob = json.dumps(parts, sort_keys=True, default=repr, ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:16]


def config_value(config: BaseModel, path: str) -> Any:
    """The value of a config field by its dotted path (``"lm_calls.retries"``), JSON-able."""
    value = reduce(getattr, path.split("."), config)
    return value.model_dump() if isinstance(value, BaseModel) else value


def part_state(part: Any) -> Any:
    """What identifies a part of the program in a cache key: its ``cache_state()`` (judges, the grade
    source), else its DSPy state (predictors), else its name (retriever, web search, embedder)."""
    if callable(getattr(part, "cache_state", None)):
        return part.cache_state()
    if callable(getattr(part, "dump_state", None)):
        return part.dump_state()
    return getattr(part, "name", type(part).__name__)


@dataclass(frozen=True)
class Computed(Generic[T]):
    """A stage's cached value, with the trace entries its computation appended (by list name) and the
    run that computed it."""

    value: T
    run_id: int
    appended: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def errors(self) -> list[str]:
        """The errors the computation recorded (the evaluation reports them per variant)."""
        return list(self.appended.get("errors", []))

    def replay(self, trace: CRAGTrace) -> None:
        """Append the computation's entries to another run's ``trace``."""
        for name, entries in self.appended.items():
            target = getattr(trace, name)
            for entry in entries:
                copied = entry.model_copy() if isinstance(entry, BaseModel) else entry
                if name != "defused" or copied not in target:  # a page is defused once per trace
                    target.append(copied)


class Stage(dspy.Module, Generic[T]):
    """One stage of a question's run, a DSPy module so that callbacks (spans) see it.

    Subclasses implement ``compute(**inputs)`` and may override :meth:`record`. A stage with a ``name``
    is timed and its LM usage counted under that name (``trace.timings``, ``trace.lm_usage``) and its
    value is cached; a stage without one runs inside a named stage, uncached, and counts there.
    ``uses`` names the program's attributes whose state the value depends on, ``reads`` the config
    fields (dotted paths) whose values it depends on.

    Stages are made per call (they hold the question's run) and are never attributes of the program,
    so they add nothing to a program's state.
    """

    name: ClassVar[str | None] = None
    uses: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()

    def __init__(self, program: Program, run: QuestionRun):
        super().__init__()
        self.program = program
        self.run = run

    def compute(self, **inputs: Any) -> T:
        raise NotImplementedError

    def key(self, inputs: dict[str, Any]) -> Hashable:
        """The cache key of this stage's value for ``inputs`` in this program."""
        states = self.run.states
        for part in self.uses:
            if part not in states:
                states[part] = state_key(part_state(getattr(self.program, part)))
        config = self.program.config
        return (
            self.name,
            type(self).__name__,  # two stages may share a name (the internal retry's query and search)
            state_key(sorted(inputs.items())),
            tuple(states[part] for part in self.uses),
            state_key([config_value(config, path) for path in self.reads]),
        )

    def forward(self, **inputs: Any) -> T:
        run = self.run
        run.before_stage(self.name or type(self).__name__)
        if self.name is None:
            value = self.compute(**inputs)
        else:
            computed = run.cache.get(self.key(inputs), lambda: self._computed(inputs))
            if computed.run_id != run.id:
                computed.replay(run.trace)
            value = computed.value
        self.record(value, run)
        return value

    def _computed(self, inputs: dict[str, Any]) -> Computed[T]:
        trace = self.run.trace
        sizes = {name: len(getattr(trace, name)) for name in TRACED_LISTS}
        with self.run.stage(self.name) if self.name else nullcontext():
            value = self.compute(**inputs)
        appended = {name: list(getattr(trace, name)[n:]) for name, n in sizes.items()}
        return Computed(value, self.run.id, {name: new for name, new in appended.items() if new})

    def record(self, value: T, run: QuestionRun) -> None:
        """Write ``value`` into the run (its trace); most stages' values reach the trace through the route."""


def pieces_of(keys: Iterable[Hashable], stage: type[Stage]) -> int:
    """How many of the cache ``keys`` are pieces of ``stage`` (its class names its keys:
    :meth:`Stage.key`), e.g. the web searches among the pieces a consumer of shared work used."""
    return sum(isinstance(key, tuple) and len(key) > 1 and key[1] == stage.__name__ for key in keys)
