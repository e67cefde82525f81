"""The programs the evaluation compares: baselines, CRAG, and the paper's ablations of CRAG (Yan et al.,
2024, section 5.4), each a call of ``CRAG.forward`` (or, for the baselines, of CRAG's own stages) over
one shared stage cache, so that all variants share grades, web results and answers to identical
contexts.

Ablations, as in the paper (:class:`~crag_dspy.routing.Ablation`): w/o Correct, w/o Incorrect and
w/o Ambiguous remove an action (:func:`~crag_dspy.routing.ablated_action`); w/o refinement answers
from the raw retrieved passages; w/o rewriting searches the web with the question; w/o
external-knowledge selection keeps every web strip unjudged.

Beyond the paper, "CRAG + internal retry" is the program with two rewrite-and-retry rounds on the
internal store before the web (``CRAGConfig(internal_retries=2)``): it shares the program's grades, web
query and web knowledge, and adds only the rounds' retrievals and grades, the revised query of round 2,
and the refinement and answers of the contexts that change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from crag_dspy.baselines import passage_strips
from crag_dspy.domain import QAPair
from crag_dspy.faults import CRAGRunError, raise_if_lm_down
from crag_dspy.module import CRAG
from crag_dspy.protocols import Passage
from crag_dspy.routing import NO_ABLATION, Ablation, Action
from crag_dspy.run import StageCache
from crag_dspy.stages import Answer, RefineExternal, Retrieve, SearchWeb
from crag_dspy.strips import format_context
from crag_dspy.web import web_is_off

from .frontier import Baselines
from .metrics import answer_matches, is_abstention
from .parallel import map_questions

__all__ = [
    "INTERNAL_RETRY_ROUNDS",
    "ROW_SETS",
    "Outcome",
    "Programs",
    "Variant",
    "baseline_outcomes",
    "rag_answer",
    "raw_passages",
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
    ablation: Ablation = NO_ABLATION
    internal_retries: int | None = None  # None: the program's own (``CRAG.config.internal_retries``)


ROW_SETS = ("all", "main", "main+retry", "crag")
"""``--rows`` of the evaluation: every row; baselines and CRAG rows only; those and the retry row; the
CRAG rows only (comparing one setting with another, the baselines are the same in both runs)."""


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
    if rows_set == "crag":
        return [row for row in rows if row.kind == "crag"]
    if rows_set == "main":
        return rows
    rows.append(Variant("CRAG + internal retry", internal_retries=INTERNAL_RETRY_ROUNDS))
    if rows_set == "main+retry":
        return rows
    return rows + [
        Variant(f"w/o {name}", group="ablation", ablation=ablation)
        for name, ablation in (
            ("Correct", Ablation(remove=Action.CORRECT)),
            ("Incorrect", Ablation(remove=Action.INCORRECT)),
            ("Ambiguous", Ablation(remove=Action.AMBIGUOUS)),
            ("refinement", Ablation(refine=False)),
            ("rewriting", Ablation(rewrite=False)),
            ("external selection", Ablation(select=False)),
        )
    ]


@dataclass(frozen=True)
class Outcome:
    """One variant's answer to one question: the answer (None when the question failed), CRAG's action,
    the error of a failed question, and the sources the answer cites (CRAG's
    ``crag_dspy.citations.Citation`` objects, each with ``doc_id`` and ``page``; the baselines cite
    nothing)."""

    answer: str | None
    action: Action | None = None
    error: str | None = None
    citations: tuple[Any, ...] = ()
    ungrounded: tuple[str, ...] = ()
    """CRAG's grounding check: the answer's key content that no kept strip states (and the question does not)."""
    sources: tuple[str, ...] = ()
    """What the answer read: ``"internal"`` (the knowledge base) and/or ``"web"``."""


class Programs:
    """The programs a table's variants run, over one stage cache: ``main`` and ``default``, and a copy
    of either with other ``internal_retries`` (made once; its stages share the original's keys)."""

    def __init__(self, main: CRAG, default: CRAG, cache: StageCache):
        self.cache = cache
        self._programs: dict[tuple[str, int | None], CRAG] = {
            ("main", None): main,
            ("default", None): default,
        }

    def __getitem__(self, name: str) -> CRAG:
        return self._programs[(name, None)]

    def of(self, variant: Variant) -> CRAG:
        key = (variant.program, variant.internal_retries)
        if key not in self._programs:
            program = self[variant.program].deepcopy()
            program.config = program.config.replace(internal_retries=variant.internal_retries)
            self._programs[key] = program
        return self._programs[key]


def raw_passages(crag: CRAG, question: str, cache: StageCache) -> list[Passage]:
    """The top-k passages as stored (plain RAG's view of the retrieval), through CRAG's retrieve stage."""
    run = crag.new_run(question, cache=cache)
    return Retrieve(crag, run)(question=question, sanitize=False)


def rag_answer(crag: CRAG, question: str, cache: StageCache, *, web: bool) -> str:
    """Plain RAG's answer (the raw top-k passages), or with ``web`` the paper's "RAG w. web" (those and
    every strip of the web's results for the question), by CRAG's own stages and answerer."""
    run = crag.new_run(question, cache=cache)
    with crag.lm_scope(run.trace):
        internal = passage_strips(Retrieve(crag, run)(question=question, sanitize=False))
        external = []
        if web and (results := SearchWeb(crag, run)(query=question).results):
            external = RefineExternal(crag, run)(question=question, results=results, select=False).kept
        context = format_context(internal, external)
        return Answer(crag, run)(question=question, context=context, unjudged=0).answer


def run_variant(
    variant: Variant,
    question: str,
    programs: Programs,
    no_retrieval: Callable[[str], Outcome] | None,
) -> Outcome:
    """Answer ``question`` as ``variant`` would, over the programs' shared cache; ``no_retrieval(question)``
    is the shared no-retrieval answer."""
    if variant.kind == "no_retrieval":
        if no_retrieval is None:
            raise ValueError("the no-retrieval row needs its answerer")
        return no_retrieval(question)
    crag = programs.of(variant)
    if variant.kind != "crag":
        web = variant.kind == "rag_web"
        sources = ("internal", "web") if web and not web_is_off(crag.web_search) else ("internal",)
        return Outcome(rag_answer(crag, question, programs.cache, web=web), sources=sources)
    prediction = crag(question=question, ablation=variant.ablation, cache=programs.cache, witness=False)
    grounding = prediction.trace.grounding
    return Outcome(
        prediction.answer,
        Action(prediction.action),
        citations=tuple(prediction.citations),
        ungrounded=tuple(grounding.ungrounded) if grounding else (),
        sources=tuple(tag for tag in ("internal", "web") if f"[{tag}]" in (prediction.trace.context or "")),
    )


def baseline_outcomes(
    crag: CRAG,
    questions: Sequence[QAPair],
    cache: StageCache,
    *,
    num_threads: int = 1,
    progress: bool = False,
) -> Baselines:
    """Plain RAG's and (when web search is configured) RAG + web always's answer to each question, right
    and "I don't know" (:func:`~optimize.metrics.answer_matches`), over ``cache``; ``num_threads``
    questions at a time. A question either baseline fails on counts wrong for it, as in the table.
    Over a :class:`~optimize.shared_work.SharedWork`, each answer's LM tokens too."""

    collecting = getattr(cache, "collecting", None)  # a SharedWork tells what each answer costs

    def outcome(question: QAPair, web: bool) -> tuple[tuple[bool, bool], int | None]:
        with collecting() if collecting else nullcontext() as used:
            try:
                answer = rag_answer(crag, question.question, cache, web=web)
            except CRAGRunError:
                raise_if_lm_down()
                answer = None
        tokens = cache.cost(used).tokens if used is not None else None  # type: ignore[attr-defined]
        if answer is None:
            return (False, False), tokens
        return (answer_matches(answer, question.answers), is_abstention(answer)), tokens

    with_web = not web_is_off(crag.web_search)
    both = map_questions(
        lambda q: (outcome(q, False), outcome(q, True) if with_web else None),
        questions,
        num_threads=num_threads,
        desc="baselines",
        progress=progress,
    )
    rag_tokens = [rag[1] for rag, _ in both]
    web_tokens = [web[1] for _, web in both] if with_web else None
    return Baselines.build(
        [rag[0] for rag, _ in both],
        [web[0] for _, web in both] if with_web else None,
        rag_tokens=None if None in rag_tokens else rag_tokens,  # type: ignore[arg-type]
        web_tokens=None if web_tokens is None or None in web_tokens else web_tokens,  # type: ignore[arg-type]
    )
