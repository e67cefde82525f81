"""Knowledge refinement: decompose passages and web results into strips, filter, recompose."""

from __future__ import annotations

from contextlib import closing

from ..baselines import passage_strips
from ..judges.llm import Judgement
from ..protocols import Passage, WebResult
from ..run import QuestionRun
from ..strips import Strip, decompose, recompose, select_strips
from ..trace import StripRecord
from .base import Program, Stage
from .calls import count_lm_outcome, each_call, judge_once
from .knowledge import Knowledge, Refined

__all__ = ["RefineExternal", "RefineInternal", "filter_strips", "internal_knowledge"]

_FILTER_READS = ("strip_threshold", "max_strips", "sentences_per_strip", "reserve_strips")


class RefineInternal(Stage[Refined]):
    """Decompose, filter and recompose the retrieved passages into internal knowledge.

    Passages graded below ``strip_threshold`` are dropped whole (their strips would be judged on the
    same evidence), except the best-graded one: its grade decided whether retrieval was CORRECT or
    AMBIGUOUS, and tuned thresholds may put ``upper`` below ``strip_threshold``, so without it a CORRECT
    route could answer from nothing. The strip filter judges that passage's strips itself. The result
    depends on the grades but not on the action thresholds, so one refinement per question serves
    every (lower, upper) during tuning.
    """

    name = "refine_internal"
    uses = ("strip_filter",)
    reads = _FILTER_READS

    def compute(self, question: str, passages: list[Passage], scores: list[float | None]) -> Refined:
        strips: list[Strip] = []
        reuse: dict[Strip, float | None] = {}
        threshold = self.program.config.strip_threshold
        graded = [i for i, score in enumerate(scores) if score is not None]
        best = max(graded, key=lambda i: scores[i], default=None)  # ties: the higher-ranked passage
        for i, (passage, score) in enumerate(zip(passages, scores)):
            below = score is not None and score < threshold
            if below and i != best:
                continue
            pieces = decompose(passage.text, self.program.config.sentences_per_strip)
            for j, text in enumerate(pieces):
                strips.append(
                    Strip(
                        text,
                        "internal",
                        passage.doc_id,
                        passage.title,
                        passage.rank,
                        j,
                        passage.url,
                        passage.page,
                        passage.section,
                    )
                )
                if len(pieces) == 1 and not below:
                    # The grader already judged this passage whole: asking again would be the same question.
                    reuse[strips[-1]] = score
        return filter_strips(self.program, self.run, question, strips, reuse)

    def record(self, value: Refined, run: QuestionRun) -> None:
        run.trace.internal_strips = [r.model_copy() for r in value.records]
        emit_kept(run, "internal", value)


def internal_knowledge(
    program: Program,
    run: QuestionRun,
    question: str,
    passages: list[Passage],
    scores: list[float | None],
    *,
    refine: bool = True,
) -> Knowledge:
    """The refined passages, or with ``refine=False`` the raw ones (the paper's "w/o refinement")."""
    if not refine:
        return Knowledge(passage_strips(passages))
    return Knowledge.of(RefineInternal(program, run)(question=question, passages=passages, scores=scores))


class RefineExternal(Stage[Refined]):
    """Decompose the web results and filter them; with ``select=False`` every strip is kept unjudged
    (the paper's "w/o external-knowledge selection")."""

    name = "refine_external"
    uses = ("strip_filter",)
    reads = _FILTER_READS

    def compute(self, question: str, results: list[WebResult], select: bool = True) -> Refined:
        strips = [
            Strip(text, "web", r.url, r.title, rank, i, r.url)
            for rank, r in enumerate(results)
            for i, text in enumerate(decompose(r.content, self.program.config.sentences_per_strip))
        ]
        return filter_strips(self.program, self.run, question, strips, {}, select=select)

    def record(self, value: Refined, run: QuestionRun) -> None:
        run.trace.external_strips = [r.model_copy() for r in value.records]
        emit_kept(run, "web", value)


def emit_kept(run: QuestionRun, source: str, refined: Refined) -> None:
    """The ``strips_kept`` event: how many of ``source``'s strips refinement kept, and from where."""
    run.emit(
        "strips_kept",
        source=source,
        kept=len(refined.kept),
        strips=len(refined.records),
        titles=sorted({s.title for s in refined.kept}),
    )


def filter_strips(
    program: Program,
    run: QuestionRun,
    question: str,
    strips: list[Strip],
    reuse: dict[Strip, float | None],
    *,
    select: bool = True,
) -> Refined:
    """The kept strips, the best-scored strips below the threshold that make up ``reserve_strips`` in
    all, and the trace's records of every strip. ``reuse`` maps strips to a grade already given."""
    config = program.config
    # (strip, score, where the score came from, the judgement when the strip filter judged it)
    scored: list[tuple[Strip, float | None, str, Judgement | None]] = []
    to_judge = [strip for strip in strips if select and strip not in reuse]

    def judge(strip: Strip) -> tuple[Judgement, bool]:
        return judge_once(program.strip_filter, "strip_filter", run, question=question, strip=strip.text)

    with closing(each_call(judge, to_judge, config.lm_calls.concurrency)) as judged:
        for strip in strips:
            if not select:
                scored.append((strip, None, "unfiltered", None))
                continue
            if strip in reuse:
                scored.append((strip, reuse[strip], "document_grade", None))
                continue
            judgement, asked = next(judged)
            if judgement.view_error:
                run.fallback(
                    f"strip filter's sentence focus failed on a strip of {strip.doc_id} "
                    f"({judgement.view_error}); judged the whole strip"
                )
            if judgement.score is None:
                run.error(
                    f"strip filter failed on a strip of {strip.doc_id} (dropped): {judgement.errors[-1]}"
                )
            if asked:
                count_lm_outcome(judgement, "strip_filter", run)
            origin = "strip_filter" if judgement.score is not None else "error"
            scored.append((strip, judgement.score, origin, judgement))
    pairs = [(s, score) for s, score, _, _ in scored]
    threshold, most = config.strip_threshold, config.max_strips
    kept = recompose(select_strips(pairs, threshold, most) if select else strips)
    kept_set = set(kept)
    spare = select_strips(pairs, threshold, most, at_least=config.reserve_strips) if select else []
    spare = recompose(s for s in spare if s not in kept_set)
    spare_set = set(spare)
    spare_score = max((x for s, x in pairs if s in spare_set and x is not None), default=None)
    records = [
        StripRecord(
            source=s.source,
            doc_id=s.doc_id,
            title=s.title,
            position=s.position,
            text=s.text,
            score=None if score is None else round(score, 4),
            score_source=origin,
            kept=s in kept_set,
            url=s.url if s.source == "web" else None,
            page=s.page,
            section=s.section,
            judged_text=(judgement.shown or {}).get("strip") if judgement else None,
            evidence=judgement.evidence if judgement else None,
        )
        for s, score, origin, judgement in scored
    ]
    return Refined(kept, spare, records, spare_score)
