"""Knowledge: what refinement kept of each source, and which of it an action answers from."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..routing import Action
from ..run import QuestionRun
from ..strips import Strip
from ..trace import StripRecord

__all__ = ["Knowledge", "Refined", "knowledge_for", "note_reserve_used"]


@dataclass(frozen=True)
class Refined:
    """Knowledge strips after the strip filter: ``kept`` reached the strip threshold; ``reserve`` holds the
    best-scored strips below it (their best score ``reserve_score``); ``records`` are every strip as the
    trace shows it."""

    kept: list[Strip]
    reserve: list[Strip] = field(default_factory=list)
    records: list[StripRecord] = field(default_factory=list)
    reserve_score: float | None = None


@dataclass(frozen=True)
class Knowledge:
    """One source's refined knowledge: ``strips`` reached the strip threshold; ``reserve`` holds the
    best-scored judged strip below it (``reserve_score``), which an answer falls back to only when no
    knowledge of the sources its action reads survived."""

    strips: list[Strip]
    reserve: list[Strip] = field(default_factory=list)
    reserve_score: float | None = None

    @classmethod
    def of(cls, refined: Refined) -> Knowledge:
        return cls(refined.kept, refined.reserve, refined.reserve_score)


def knowledge_for(
    action: Action, internal: Knowledge, external: Knowledge | None
) -> tuple[list[Strip], list[Strip]]:
    """The (internal, external) strips an action answers from; ``external`` is None when web search
    produced nothing, and then INCORRECT falls back to internal knowledge.

    When no strip of the sources the action reads survived refinement, the best-scored reserve strip
    of a source the action trusts (internal first on a tie) is the context (``reserve_strips``): a
    small judge can score the strip that answers just under its threshold, and a route left with
    nothing answers "I don't know" unread. INCORRECT's fallback to internal knowledge takes no reserve:
    the grader judged every passage wrong. Next to surviving knowledge a reserve strip is left out: a
    doubtful strip can make a small model doubt an answer the kept strips give (docs/experiments.md).
    """
    nothing = Knowledge([])
    inside = internal if action.uses_internal or external is None else nothing
    outside = external if action.uses_web and external is not None else nothing
    if inside.strips or outside.strips:
        return inside.strips, outside.strips
    reserves = [k for k in (inside if action.uses_internal else nothing, outside) if k.reserve]
    if not reserves:
        return [], []
    best = max(reserves, key=lambda k: -1.0 if k.reserve_score is None else k.reserve_score)
    return (best.reserve, []) if best is inside else ([], best.reserve)


def note_reserve_used(reserve: list[Strip], run: QuestionRun, strip_threshold: float) -> None:
    """Mark the reserve strips an answer reads kept in the trace and say why it reads them."""
    # A web page can come back as several results under one URL, each starting at position 0.
    used = {(s.source, s.doc_id, s.position, s.text) for s in reserve}
    records = [
        r
        for r in [*run.trace.internal_strips, *run.trace.external_strips]
        if (r.source, r.doc_id, r.position, r.text) in used
    ]
    for record in records:
        record.kept = True
    source = reserve[0].source  # one source's reserve: knowledge_for never mixes them
    scores = ", ".join(f"{r.score:.2f}" for r in records if r.score is not None)
    run.fallback(
        f"no knowledge reached the strip threshold {strip_threshold}; answered from the "
        f"best-scored {source} strips below it ({scores})"
    )
