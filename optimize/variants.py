"""The programs the evaluation compares, as configuration over shared pieces: baselines, CRAG, and the
paper's ablations of CRAG (Yan et al., 2024, section 5.4).

A variant computes nothing itself: it chooses which already-computed pieces of a question
(:class:`~optimize.shared_work.CRAGPieces`) to combine, so that all variants share grades, web
results and answers to identical contexts.

Ablations, as in the paper:

- w/o Correct: questions that would take CORRECT take AMBIGUOUS instead.
- w/o Incorrect: questions that would take INCORRECT take AMBIGUOUS instead.
- w/o Ambiguous: one threshold instead of two, so every question is CORRECT or INCORRECT; the paper
  does not say where the single threshold lies, so an AMBIGUOUS question goes to the action whose
  threshold its best grade is nearer to: CORRECT when it is >= (lower + upper) / 2, else INCORRECT
  (also when no grade is known).
- w/o refinement: internal knowledge is the raw retrieved passages (no decompose, filter, recompose).
- w/o rewriting: web search with the original question instead of the rewritten query.
- w/o external-knowledge selection: every web strip is used, none judged or dropped.

Beyond the paper, "CRAG + internal retry" is the program with two rewrite-and-retry rounds on the
internal store before the web (``CRAGConfig(internal_retries=2)``, :mod:`crag_dspy.retry`): it shares the
program's grades, web query and web knowledge, and adds only the rounds' retrievals and grades, the
revised query of round 2, and the refinement and answers of the contexts that change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from crag_dspy.baselines import passage_strips
from crag_dspy.routing import Action, decide_action

from .shared_work import CRAGPieces

__all__ = [
    "INTERNAL_RETRY_ROUNDS",
    "ROW_SETS",
    "Outcome",
    "Variant",
    "ablated_action",
    "run_variant",
    "table_variants",
]

Kind = Literal["no_retrieval", "plain_rag", "rag_web", "crag"]
INTERNAL_RETRY_ROUNDS = 2  # the cap: rounds of "CRAG + internal retry"


@dataclass(frozen=True)
class Variant:
    """One row of the evaluation table.

    ``program`` picks the CRAG whose predictors, thresholds and config a CRAG variant uses ("main" is
    the program under evaluation; "default" the uncompiled one with the default thresholds). Baselines
    use the default program's retrieval, web search and (uncompiled) answerer.
    """

    name: str
    kind: Kind = "crag"
    program: Literal["main", "default"] = "main"
    group: Literal["baseline", "crag", "ablation"] = "crag"
    remove: Action | None = None
    refine: bool = True
    rewrite: bool = True
    select: bool = True
    internal_retries: int | None = None  # None: the program's own (``CRAG.config.internal_retries``)


ROW_SETS = ("all", "main", "main+retry")
"""``--rows`` of the evaluation: every row; baselines and CRAG rows only; those and the retry row."""


def table_variants(has_program: bool, rows_set: str = "all") -> list[Variant]:
    """The rows, in order: baselines, CRAG with default thresholds, the program, the program with
    internal retries, its ablations (of the program, or without one of CRAG with default thresholds).
    ``rows_set`` (:data:`ROW_SETS`) leaves out the costlier rows for quicker runs."""
    if rows_set not in ROW_SETS:
        raise ValueError(f"unknown row set {rows_set!r}; choose from {ROW_SETS}")
    rows = [
        Variant("no retrieval", "no_retrieval", "default", "baseline"),
        Variant("plain RAG", "plain_rag", "default", "baseline"),
        Variant("RAG + web always", "rag_web", "default", "baseline"),
        Variant("CRAG (default thresholds)", program="default"),
    ]
    if has_program:
        rows.append(Variant("CRAG (program)"))
    if rows_set == "main":
        return rows
    rows.append(Variant("CRAG + internal retry", internal_retries=INTERNAL_RETRY_ROUNDS))
    if rows_set == "main+retry":
        return rows
    return rows + [
        Variant("w/o Correct", group="ablation", remove=Action.CORRECT),
        Variant("w/o Incorrect", group="ablation", remove=Action.INCORRECT),
        Variant("w/o Ambiguous", group="ablation", remove=Action.AMBIGUOUS),
        Variant("w/o refinement", group="ablation", refine=False),
        Variant("w/o rewriting", group="ablation", rewrite=False),
        Variant("w/o external selection", group="ablation", select=False),
    ]


def ablated_action(
    scores: Sequence[float | None], lower: float, upper: float, remove: Action | None = None
) -> Action:
    """:func:`~crag_dspy.routing.decide_action` with one action removed as the paper removes it."""
    action = decide_action(scores, lower, upper)
    if remove is None or action is not remove:
        return action
    if remove is not Action.AMBIGUOUS:
        return Action.AMBIGUOUS
    known = [s for s in scores if s is not None]
    return Action.CORRECT if known and max(known) >= (lower + upper) / 2 else Action.INCORRECT


@dataclass(frozen=True)
class Outcome:
    answer: str | None
    action: Action | None = None
    error: str | None = None


def run_variant(
    variant: Variant,
    question: str,
    pieces: dict[str, CRAGPieces],
    no_retrieval: Callable[[str], Outcome],
) -> Outcome:
    """Answer ``question`` as ``variant`` would, from shared pieces.

    ``pieces`` maps "main" and "default" to their programs' pieces; ``no_retrieval(question)`` is the
    shared no-retrieval answer.
    """
    p = pieces[variant.program]
    if variant.kind == "no_retrieval":
        return no_retrieval(question)
    if variant.kind == "plain_rag":
        return Outcome(p.answer(question, passage_strips(p.retrieve(question)), []))
    if variant.kind == "rag_web":
        web = p.external(question, rewrite=False, select=False)
        return Outcome(p.answer(question, passage_strips(p.retrieve(question)), web.strips if web else []))
    retries = p.crag.config.internal_retries if variant.internal_retries is None else variant.internal_retries
    _, rounds = p.retry_route(question, retries)
    # The rounds ran on the program's own actions; an ablation then removes an action from the last one.
    scores = [*p.documents(question)[1], *(x for r in rounds for x in r.scores)]
    action = ablated_action(scores, *p.thresholds_for(question), variant.remove)
    answer = p.route(
        question,
        action,
        refine=variant.refine,
        rewrite=variant.rewrite,
        select=variant.select,
        rounds=rounds,
    )
    return Outcome(answer, action)
