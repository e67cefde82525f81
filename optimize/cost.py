"""The cost of a piece of work: LM usage, LM requests and tokens (cache hits included) and wall time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dspy.utils.callback import BaseCallback

from crag_dspy.trace import StageUsage

from .tokens import completion_tokens, prompt_tokens

__all__ = ["Cost", "RequestCounter"]


@dataclass(frozen=True)
class Cost:
    """LM usage and wall time of a piece of work.

    ``usage.calls`` counts requests the LM really served; ``requests`` counts every LM request,
    including those DSPy's disk cache answered (they cost ~0 s and no tokens now, but a run on a
    fresh cache pays for them). ``tokens`` counts the prompt and completion tokens of every one of those
    requests from their text (:mod:`optimize.tokens`), so it too is the same warm or cold.
    """

    usage: StageUsage = field(default_factory=StageUsage)
    seconds: float = 0.0
    requests: int = 0
    tokens: int = 0

    def plus(self, other: Cost) -> Cost:
        return Cost(
            self.usage.add(other.usage),
            self.seconds + other.seconds,
            self.requests + other.requests,
            self.tokens + other.tokens,
        )

    def minus(self, other: Cost) -> Cost:
        usage = StageUsage(
            **{k: getattr(self.usage, k) - getattr(other.usage, k) for k in StageUsage.model_fields}
        )
        return Cost(
            usage,
            max(0.0, self.seconds - other.seconds),
            self.requests - other.requests,
            self.tokens - other.tokens,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            **self.usage.model_dump(),
            "requests": self.requests,
            "tokens": self.tokens,
            "seconds": self.seconds,
        }

    @staticmethod
    def total(costs: Iterable[Cost]) -> Cost:
        result = Cost()
        for cost in costs:
            result = result.plus(cost)
        return result


class RequestCounter(BaseCallback):
    """Counts every LM request and its tokens, cache hits too (DSPy's usage tracker sees only the requests
    the LM served): ``count(requests, tokens)`` is called with (1, prompt tokens) as a request starts and
    (0, completion tokens) as it ends."""

    def __init__(self, count: Callable[[int, int], None]):
        self.count = count
        self._models: dict[str, str] = {}  # call id -> model, from a request's start to its end

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        model = str(getattr(instance, "model", "") or "")
        self._models[call_id] = model
        self.count(1, prompt_tokens(model, inputs))

    def on_lm_end(self, call_id: str, outputs: Any | None, exception: Exception | None = None) -> None:
        model = self._models.pop(call_id, "")
        if exception is None:
            self.count(0, completion_tokens(model, outputs))
