"""Per-caller rate limits over the ``limits`` library (moving window, in this process's memory)."""

from __future__ import annotations

import math
import time

from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

__all__ = ["RateLimiter"]


class RateLimiter:
    """``spec`` in the limits notation ('60/minute', '10/second;500/hour'); every rate applies."""

    def __init__(self, spec: str):
        self.spec = spec
        self._rates = parse_many(spec)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def wait(self, identity: str) -> int | None:
        """The seconds until a request of ``identity`` would be allowed; None when it is now. Counts nothing."""
        blocked = [rate for rate in self._rates if not self._limiter.test(rate, identity)]
        if not blocked:
            return None
        now = time.time()
        reset = max(self._limiter.get_window_stats(rate, identity).reset_time for rate in blocked)
        return max(1, math.ceil(reset - now))

    def hit(self, identity: str) -> int | None:
        """Count a request of ``identity``: None when it is allowed, else the seconds until it would be.

        A refused request is not counted, so a client that keeps retrying is let in as soon as the
        window allows rather than never.
        """
        wait = self.wait(identity)
        if wait is None:
            for rate in self._rates:
                self._limiter.hit(rate, identity)
        return wait
