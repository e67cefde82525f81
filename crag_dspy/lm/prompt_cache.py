"""Which cached prompt a new prompt continues: the bookkeeping of a KV cache kept in several sequences.

A compile and a CRAG run alternate between a few prompt families (the grader's instructions, the strip
filter's, the rewriter's, the answerer's), each asked many times with the same instructions and
question before the part that changes. Keeping the latest prompt of each family in its own KV-cache
sequence lets every call re-evaluate only what its prompt does not share with one of them. The plan
is pure bookkeeping (no model), so it is tested exhaustively; :mod:`crag_dspy.lm.ik_engine` carries
it out with llama.cpp's sequence operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CachePlan", "PromptCache", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class CachePlan:
    """How to serve one prompt: empty the sequences in ``evict`` (least recently used first, so that
    the new tokens fit), drop sequence ``slot``'s cells from position ``start`` on, then evaluate
    ``prompt[start:]`` into it."""

    slot: int
    start: int
    evict: tuple[int, ...] = ()


@dataclass
class _Slot:
    tokens: list[int] = field(default_factory=list)
    used: int = 0  # logical clock of the last use; 0 = never


class PromptCache:
    """Tracks what each of ``slots`` KV-cache sequences holds, within ``capacity`` cells in all.

    :meth:`plan` chooses where a prompt goes, :meth:`commit` records what the sequence holds after it
    was evaluated (the prompt plus the generated tokens that were decoded). A prompt continues the
    sequence it shares the longest prefix with when that is at least ``min_shared`` tokens.
    """

    def __init__(self, slots: int, capacity: int, min_shared: int = 16):
        if slots < 1:
            raise ValueError("a prompt cache needs at least one slot")
        if capacity < 1:
            raise ValueError("a prompt cache needs a positive capacity")
        self.capacity = capacity
        self.min_shared = min_shared
        self._slots = [_Slot() for _ in range(slots)]
        self._clock = 0

    @property
    def slots(self) -> int:
        return len(self._slots)

    def tokens(self, slot: int) -> list[int]:
        return list(self._slots[slot].tokens)

    def used_cells(self) -> int:
        return sum(len(s.tokens) for s in self._slots)

    def plan(self, prompt: Sequence[int], reserve: int = 0) -> CachePlan:
        """Where ``prompt`` goes, what it reuses and what is dropped; ``reserve`` cells stay free for
        the tokens generated after it.

        At least the prompt's last token is always evaluated: its logits are the first answer token's.
        """
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + reserve > self.capacity:
            raise ValueError(
                f"prompt of {len(prompt)} tokens (+{reserve} to generate) exceeds the context of "
                f"{self.capacity} tokens"
            )
        limit = len(prompt) - 1
        shared = [min(common_prefix(s.tokens, prompt), limit) for s in self._slots]
        # The longest shared prefix; among equals, the most recently used sequence.
        best = max(range(self.slots), key=lambda i: (shared[i], self._slots[i].used))
        if shared[best] >= self.min_shared:
            # Continue it, cutting off what follows the shared prefix: within a family of prompts
            # that is the previous call's document or strip, which the next call does not reuse.
            slot = best
        else:
            # A prompt of another family shares no more than the chat template's first tokens with
            # any sequence: it takes the least recently used one and leaves the others' prefixes.
            slot = min(range(self.slots), key=lambda i: (self._slots[i].used, i))
        needed = len(prompt) + reserve
        used = needed + sum(len(s.tokens) for i, s in enumerate(self._slots) if i != slot)
        evict = []
        for i in sorted(range(self.slots), key=lambda i: (self._slots[i].used, i)):
            if used <= self.capacity:
                break
            if i != slot and self._slots[i].tokens:
                evict.append(i)
                used -= len(self._slots[i].tokens)
        return CachePlan(slot=slot, start=shared[slot], evict=tuple(evict))

    def commit(self, plan: CachePlan, held: Sequence[int]) -> None:
        """Record that sequence ``plan.slot`` now holds ``held`` and the evicted ones nothing."""
        for slot in plan.evict:
            self._slots[slot].tokens = []
        self._clock += 1
        target = self._slots[plan.slot]
        target.tokens = list(held)
        target.used = self._clock

    def clear(self, slot: int | None = None) -> None:
        """Forget one sequence (or all), e.g. after a failed evaluation left it in an unknown state."""
        for i, s in enumerate(self._slots):
            if slot is None or i == slot:
                s.tokens = []
