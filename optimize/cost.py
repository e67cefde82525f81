"""The cost of a piece of work: LM usage, LM requests (cache hits included) and wall time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dspy.utils.callback import BaseCallback

from crag_dspy.trace import StageUsage

__all__ = ["Cost", "RequestCounter"]


@dataclass(frozen=True)
class Cost:
    """LM usage and wall time of a piece of work.

    ``usage.calls`` counts requests the LM really served; ``requests`` counts every LM request,
    including those DSPy's disk cache answered (they cost ~0 s and no tokens now, but a run on a
    fresh cache pays for them).
    """

    usage: StageUsage = field(default_factory=StageUsage)
    seconds: float = 0.0
    requests: int = 0

    def plus(self, other: Cost) -> Cost:
        return Cost(self.usage.add(other.usage), self.seconds + other.seconds, self.requests + other.requests)

    def minus(self, other: Cost) -> Cost:
        usage = StageUsage(
            **{k: getattr(self.usage, k) - getattr(other.usage, k) for k in StageUsage.model_fields}
        )
        return Cost(usage, max(0.0, self.seconds - other.seconds), self.requests - other.requests)

    def as_dict(self) -> dict[str, float]:
        return {**self.usage.model_dump(), "requests": self.requests, "seconds": self.seconds}

    @staticmethod
    def total(costs: Iterable[Cost]) -> Cost:
        result = Cost()
        for cost in costs:
            result = result.plus(cost)
        return result


class RequestCounter(BaseCallback):
    """Counts every LM request, cache hits too (DSPy's usage tracker sees only the requests the LM served)."""

    def __init__(self, count: Callable[[], None]):
        self.count = count

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.count()
