"""``python -m optimize.evaluate``: the CRAG paper's tables on any domain, from one shared run.

For one QA split it measures answer accuracy (normalized gold-alias match, see docs/evaluate.md) of no
retrieval, plain RAG, RAG with web results always added, CRAG with the default thresholds, CRAG from a
program JSON and the paper's ablations of that CRAG; their truthfulness (Meta's CRAG benchmark: right
+1, "I don't know" 0, wrong -1), hallucinations and right citations; per action the questions taken and
their accuracy; the correction success rate; the grader's quality; and the cost of every variant. Variants
share their pieces of work (:mod:`optimize.shared_work`), so the table costs far fewer LM calls than
running each variant alone; the report gives both. Writes JSON, markdown and a bar chart PNG.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy
import numpy as np

from crag_dspy.app import assemble, resolve_program
from crag_dspy.baselines import NoRetrieval
from crag_dspy.cli import (
    add_lm_arguments,
    add_storage_arguments,
    add_web_search_argument,
    command_prog,
    error_line,
    interruptible,
    settings_from_args,
    user_error_types,
)
from crag_dspy.domain import Domain, QAPair, load_domain
from crag_dspy.embeddings import Embedder
from crag_dspy.faults import CRAGRunError, LMDownError, describe_error, raise_if_lm_down, watch_lm
from crag_dspy.judges.protocols import Judge
from crag_dspy.lm import build_lm, lm_identity
from crag_dspy.module import CRAG
from crag_dspy.program import apply_program, check_dataset, read_program
from crag_dspy.protocols import Passage
from crag_dspy.redaction import configure_logging
from crag_dspy.routing import Action
from crag_dspy.settings import Settings
from crag_dspy.stages import Grade, Retrieve, SearchWeb, pieces_of, state_key
from crag_dspy.stages.base import part_state
from crag_dspy.stages.calls import judge_once
from crag_dspy.store import ingest_domain

from .cost import Cost
from .datasets import qa_split, relevance_examples
from .frontier import frontier_summary
from .grade_source import program_grades
from .metrics import (
    answer_matches,
    binary_report,
    cites_evidence,
    contains_answer,
    counted,
    is_abstention,
    is_answerable,
    truthfulness_score,
    truthfulness_summary,
    wilson_interval,
)
from .parallel import check_num_threads, map_questions
from .report import check_writable, plot_accuracy_bars, plot_frontier, write_evaluation_report
from .shared_work import SharedWork
from .thresholds import precompute_routes, route_table
from .variants import (
    ROW_SETS,
    Outcome,
    Programs,
    Variant,
    baseline_outcomes,
    raw_passages,
    run_variant,
    table_variants,
)

__all__ = ["answer_fields", "evaluate_domain", "grader_quality", "main", "summarize"]

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


def _no_retrieval(work: SharedWork, lm: dspy.BaseLM) -> Callable[[str], Outcome]:
    program = NoRetrieval(lm=lm)
    key = state_key(program.answerer.dump_state())

    def answer(question: str) -> Outcome:
        try:
            return Outcome(
                work.get(("no_retrieval", question, key), lambda: program(question=question).answer)
            )
        except Exception as exc:  # noqa: BLE001 - one failed LM request is a wrong answer, not a lost table
            log.warning("no-retrieval answer failed for %r: %s", question, exc)
            return Outcome(None, error=describe_error(exc))

    return answer


def _question_rows(
    q: QAPair,
    variants: Sequence[Variant],
    programs: Programs,
    work: SharedWork,
    no_retrieval: Callable[[str], Outcome],
    web_urls: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for variant in variants:
        raise_if_lm_down()  # an LM outage stops the run between variants, not after every question
        with work.consumer(variant.name) as used:
            outcome = _outcome(variant, q, programs, no_retrieval)
        cost = work.cost(used)
        errors = work.notes(used) + ([outcome.error] if outcome.error else [])
        rows.append(
            {
                "id": q.id,
                "variant": variant.name,
                **answer_fields(q, outcome, web_urls),
                "sources": list(outcome.sources),
                "web_searches": pieces_of(used, SearchWeb),
                **cost.as_dict(),
                "seconds": round(cost.seconds, 4),
                "errors": errors,
            }
        )
    # Whether the first retrieval held a gold answer is a property of the question, not of a variant.
    with work.consumer("evaluation"):
        passages = raw_passages(programs["main"], q.question, work)
    held = any(contains_answer(p.display, q.answers) for p in passages)
    for row in rows:
        row.update(retrieval_has_answer=held)
    return rows


def _evidence(q: QAPair) -> list[Any]:
    """The question's gold evidence (``evidence`` in qa.jsonl, an extra field: a list of
    ``{"doc_id", "page", "quote"}``); empty when it has none."""
    evidence = getattr(q, "evidence", None)  # an extra field of the line, kept by Record
    return list(evidence) if isinstance(evidence, list | tuple) else []


def answer_fields(q: QAPair, outcome: Outcome, web_urls: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A question row's measures of ``outcome``, the answer to ``q``; ``web_urls`` maps the domain's
    web document ids to their URLs (a web result is cited by its URL, evidence names the document).

    ``correct``: a gold alias matches (:func:`~optimize.metrics.answer_matches`); ``abstained``: the
    answer is "I don't know" (a failed question, answer None, did not abstain: it is wrong);
    ``score``: truthfulness as in Meta's CRAG benchmark (right +1, abstained 0, wrong -1); ``citations``:
    the cited ``{"doc_id", "page"}``; ``ungrounded``: the answer's key content no kept strip states
    (CRAG's grounding check; empty for the baselines); ``cited_right``: right, answerable and citing a gold evidence
    document (and its page, when the evidence gives one); None when the question has no evidence.
    """
    correct = answer_matches(outcome.answer, q.answers)
    abstained = is_abstention(outcome.answer)
    answerable = is_answerable(q.answers)
    citations = [{"doc_id": c.doc_id, "page": c.page} for c in outcome.citations]
    evidence = _evidence(q)
    urls = web_urls or {}
    evidence += [
        {**e, "doc_id": urls[e["doc_id"]]}
        for e in evidence
        if isinstance(e, dict) and e.get("doc_id") in urls
    ]
    return {
        "answer": outcome.answer,
        "action": outcome.action.value if outcome.action else None,
        "correct": correct,
        "abstained": abstained,
        "score": truthfulness_score(correct, abstained),
        "answerable": answerable,
        "citations": citations,
        "ungrounded": list(outcome.ungrounded),
        "cited_right": (correct and answerable and cites_evidence(citations, evidence)) if evidence else None,
    }


def _outcome(
    variant: Variant, q: QAPair, programs: Programs, no_retrieval: Callable[[str], Outcome]
) -> Outcome:
    """``variant``'s answer to ``q``; a question that fails (:class:`~crag_dspy.faults.CRAGRunError`)
    is a wrong answer with its error, and the run goes on, unless the LM is down (:func:`watch_lm`)."""
    try:
        return run_variant(variant, q.question, programs, no_retrieval)
    except CRAGRunError as exc:
        raise_if_lm_down()
        log.warning("%s failed on question %s (counted wrong): %s", variant.name, q.id, describe_error(exc))
        return Outcome(None, error=describe_error(exc))


def _share(n: int, total: int) -> dict[str, Any]:
    return {"n": n, "of": total, "rate": n / total if total else None}


def _truthfulness(mine: Sequence[dict[str, Any]], variant: Variant, measured: bool) -> dict[str, Any]:
    """The variant's truthfulness summary (:func:`~optimize.metrics.truthfulness_summary`) and its
    citations (see :func:`summarize`) from its question rows."""
    cited = None
    if measured and variant.kind == "crag":  # the baselines cite nothing: not measured, not 0
        graded = [r for r in mine if r["correct"] and r["answerable"] and r.get("cited_right") is not None]
        cited = counted(sum(bool(r["cited_right"]) for r in graded), len(graded))
    return truthfulness_summary(mine) | {"cited": cited}


def summarize(rows: Sequence[dict[str, Any]], variants: Sequence[Variant]) -> list[dict[str, Any]]:
    """Per variant: accuracy, truthfulness, citations, per-action counts and accuracy, correction
    success, standalone cost.

    Truthfulness follows Meta's CRAG benchmark: per question right +1, "I don't know" 0, wrong -1;
    abstentions, hallucinations and the breakdown by answerable questions are
    :func:`~optimize.metrics.truthfulness_summary`'s. ``cited``: among right answers to answerable questions with
    gold evidence, those citing it (``cited_right``); None when no question has evidence or the
    variant is no CRAG row (the baselines cite nothing).

    Correction success: among answerable questions whose first retrieval held no gold alias, the share
    answered correctly. Cost is standalone (every piece the variant used, shared or not); seconds are
    per question, p50 and p95.
    """
    measured = any(r.get("cited_right") is not None for r in rows)  # some question has gold evidence
    table = []
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant.name]
        n = len(mine)
        actions = {}
        for action in Action:
            took = [r for r in mine if r["action"] == action.value]
            if took or variant.kind == "crag":
                actions[action.value] = _share(sum(r["correct"] for r in took), len(took)) | {
                    "taken": len(took)
                }
        missed = [r for r in mine if r["answerable"] and not r["retrieval_has_answer"]]
        seconds = [r["seconds"] for r in mine]
        p50, p95 = np.percentile(seconds, [50, 95]).tolist() if seconds else (None, None)
        table.append(
            {
                "name": variant.name,
                "group": variant.group,
                "kind": variant.kind,
                "internal_retries": variant.internal_retries,
                "n": n,
                "correct": sum(r["correct"] for r in mine),
                "accuracy": sum(r["correct"] for r in mine) / n if n else None,
                "interval": list(wilson_interval(sum(r["correct"] for r in mine), n)),
                **_truthfulness(mine, variant, measured),
                "actions": actions,
                "correction": _share(sum(r["correct"] for r in missed), len(missed)),
                "errors": sum(bool(r["errors"]) for r in mine),
                "standalone": {
                    key: sum(r[key] for r in mine)
                    for key in (
                        "requests",
                        "tokens",
                        "calls",
                        "prompt_tokens",
                        "cached_prompt_tokens",
                        "completion_tokens",
                    )
                }
                | {"seconds": sum(seconds), "seconds_p50": p50, "seconds_p95": p95},
            }
        )
    return table


def _graded(crag: CRAG, question: str, cache: SharedWork) -> tuple[list[Passage], list[float | None]]:
    """The top-k passages (made inert) and their grades, through the program's cached stages."""
    run = crag.new_run(question, cache=cache)
    with crag.lm_scope(run.trace):
        passages = Retrieve(crag, run)(question=question)
        return passages, [g.score for g in Grade(crag, run)(question=question, passages=passages)]


def _shared_grader(crag: CRAG, cache: SharedWork) -> Judge:
    """The program's grader as a :class:`~crag_dspy.judges.protocols.Judge` whose judgements are the
    cache's: a (question, document) pair shown to the grader as a retrieved passage was is not judged
    again."""

    def grade(**inputs: str) -> dspy.Prediction:
        run = crag.new_run(inputs["question"], cache=cache)
        with crag.lm_scope(run.trace):
            judgement, _ = judge_once(crag.grader, "grader", run, **inputs)
        return dspy.Prediction(score=judgement.score, judgement=judgement)

    return grade  # type: ignore[return-value] - a Judge is any callable of the judge's inputs


def grader_quality(
    domain: Domain,
    questions: Sequence[QAPair],
    graders: dict[str, CRAG],
    work: SharedWork,
    split: str,
    *,
    lm: dspy.BaseLM,
    embedder: Embedder,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Each distinct grader's accuracy, precision, recall and ROC AUC at 0.5.

    On the domain's labelled relevance pairs of ``split`` when it has any (extra LM calls, shared
    between programs with the same grader), and always on the passages retrieved for the split's
    questions, labelled relevant when they hold a gold alias (no extra LM calls: those grades exist).
    """
    examples = relevance_examples(domain.relevance, split)
    results, seen = [], set()
    for name, crag in graders.items():
        # Programs with equal keys grade identically: measured once.
        key = state_key(part_state(crag.grader), part_state(crag.grading), crag.config.k)
        if key in seen:
            continue
        seen.add(key)
        with work.consumer("grader quality"):
            if examples:

                def run(crag=crag):
                    with dspy.context(lm=lm):
                        # Through the program's grade source: LLM judge, trained evaluator or both.
                        grader = _shared_grader(crag, work)
                        scores = program_grades(crag, examples, embedder, grader=grader, progress=progress)
                    return binary_report(scores, [int(e.relevant) for e in examples])

                report = work.get(("grader_eval", split, key), run)
                results.append({"grader": name, "data": f"relevance.jsonl ({split})", **report.as_dict()})
            scores, labels, failed = [], [], 0
            for q in questions:
                try:
                    passages, grades = _graded(crag, q.question, work)
                except CRAGRunError:  # its rows hold the error; it has no grades to measure
                    failed += 1
                    continue
                scores.extend(grades)
                labels.extend(int(contains_answer(p.display, q.answers)) for p in passages)
            data = f"retrieved passages ({split}; relevant = holds a gold alias)"
            if failed:
                data += f"; {failed} question(s) failed before grading, left out"
            results.append({"grader": name, "data": data, **binary_report(scores, labels).as_dict()})
    return results


def evaluate_domain(
    settings: Settings,
    *,
    lm: dspy.BaseLM | None = None,
    program: Path | None = None,
    split: str = "test",
    limit: int | None = None,
    out: Path | None = None,
    progress: bool = True,
    num_threads: int = 1,
    rows: str = "all",
    force: bool = False,
    cache: bool = True,
) -> dict[str, Any]:
    """Evaluate every variant on ``split`` of the domain of ``settings``; write and return the report.

    A ``program`` compiled on other data than the domain holds now (its dataset hashes) is refused
    unless ``force``.

    ``num_threads`` questions are evaluated at a time (each question's pieces by one thread): faster
    when the LM serves several requests at once (hosted APIs, multi-slot servers). The report is the
    same as with one thread, wall times aside. ``rows`` (:data:`~optimize.variants.ROW_SETS`) leaves
    out the costlier rows (ablations, internal retry) for quicker runs. ``cache=False`` builds the LM
    (when ``lm`` is not given) without DSPy's request cache.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    if limit is not None and limit < 1:
        raise ValueError("--limit must be at least 1")
    check_num_threads(num_threads, "--num-threads")
    table_variants(False, rows)  # an unknown row set fails before anything loads
    # Bad input fails here, before a model loads or anything is indexed.
    domain = load_domain(settings.resolved_domain_dir)
    questions = qa_split(domain, split, limit)
    if not questions:
        raise ValueError(f"domain {domain.name!r} has no QA questions in split {split!r} (qa.jsonl)")
    program = resolve_program(program) if program else None  # a path, or a bundled domain's name
    document = read_program(program, domain=domain.name) if program else None
    if document:
        check_dataset(document, domain.file_hashes(), program, force=force)
    out = out or Path("runs") / "eval" / f"{domain.name}-{split}"
    check_writable(out.with_suffix(".md"), "the report")
    started = time.perf_counter()
    lm = lm or build_lm(settings, cache=cache)
    default_crag, backends = assemble(settings, lm, progress, domain=domain)
    ingest_domain(backends.client, domain, backends.embedder, progress=progress)  # refresh if data changed
    backends.embedder.encode(["warm-up"])  # loading the embedding model is no variant's cost
    work = SharedWork()
    main_crag = (
        apply_program(default_crag.deepcopy(), document, Path(program).parent) if document else default_crag
    )
    programs = Programs(main_crag, default_crag, work)
    variants = table_variants(document is not None, rows)
    no_retrieval = _no_retrieval(work, lm)
    # A web result is cited by its URL; gold evidence names the web.jsonl document.
    web_urls = {doc.id: doc.url for doc in domain.web}

    with watch_lm():  # one failed question is counted wrong; an LM that is down stops the run
        per_question = map_questions(
            lambda q: _question_rows(q, variants, programs, work, no_retrieval, web_urls),
            questions,
            num_threads=num_threads,
            desc=f"evaluate {domain.name}/{split}",
            progress=progress,
        )
        answer_rows: list[dict[str, Any]] = [row for question_rows in per_question for row in question_rows]
        graders = grader_quality(
            domain,
            questions,
            {"program" if document else "default": main_crag, "default": default_crag},
            work,
            split,
            lm=lm,
            embedder=backends.embedder,
            progress=progress,
        )
        frontier = routing_frontier(main_crag, default_crag, questions, work, num_threads, progress)
    table = summarize(answer_rows, variants)
    owned = work.owned()
    for entry in table:
        marginal = owned.get(entry["name"])
        entry["marginal"] = (marginal or Cost()).as_dict()
    total = work.total()
    frontier_cost = Cost.total(owned[name] for name in FRONTIER_CONSUMERS if name in owned)
    report = {
        "domain": domain.name,
        "split": split,
        "questions": len(questions),
        "lm": getattr(lm, "model", lm_identity(settings)),
        "program": str(program) if program else None,
        "thresholds": {
            "default": {"lower": default_crag.thresholds.lower, "upper": default_crag.thresholds.upper},
            "main": main_crag.thresholds.dump_state(),
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "variants": table,
        "grader": graders,
        "cost": {
            "lm_requests": total.requests,
            "lm_calls": total.usage.calls,
            "prompt_tokens": total.usage.prompt_tokens,
            "completion_tokens": total.usage.completion_tokens,
            "standalone_lm_requests": sum(v["standalone"]["requests"] for v in table),
            "standalone_lm_calls": sum(v["standalone"]["calls"] for v in table),
            "grader_quality_lm_requests": (owned.get("grader quality") or Cost()).requests,
            # The frontier's own pieces: the actions no row took and the baselines' answers (when the
            # table has no baseline rows).
            "frontier_lm_requests": frontier_cost.requests,
            "frontier_lm_calls": frontier_cost.usage.calls,
            "pieces": len(work),
            "seconds": time.perf_counter() - started,
            "num_threads": num_threads,
        },
        "rows": answer_rows,
        "frontier": frontier,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot_accuracy_bars(table, out.with_suffix(".png"), f"{domain.name} / {split}"))
    frontier["plot"] = str(
        plot_frontier(frontier, out.with_name(out.name + "-frontier.png"), f"{domain.name} / {split}")
    )
    report["files"] = [str(p) for p in write_evaluation_report(report, out)] + [
        report["plot"],
        frontier["plot"],
    ]
    return report


FRONTIER_CONSUMERS = (*(action.value for action in Action), "frontier baselines")
"""The work consumers of :func:`routing_frontier` (precompute_routes names its pieces by action)."""


def routing_frontier(
    crag: CRAG,
    default: CRAG,
    questions: Sequence[QAPair],
    work: SharedWork,
    num_threads: int = 1,
    progress: bool = True,
) -> dict[str, Any]:
    """What ``crag``'s routing buys on ``questions`` (:func:`~optimize.frontier.frontier_summary`): each
    question answered once per action and by the two baselines, over ``work`` (pieces the table's rows
    computed are not asked again); the frontier itself makes no LM call."""
    routes, _ = precompute_routes(crag, questions, work=work, num_threads=num_threads, progress=progress)
    with work.consumer("frontier baselines"):
        baselines = baseline_outcomes(default, questions, work, num_threads=num_threads, progress=progress)
    pair = (crag.thresholds.lower, crag.thresholds.upper)
    defaults = (default.thresholds.lower, default.thresholds.upper)
    return frontier_summary(route_table(routes), baselines, pair, defaults=defaults)


def _report_prefix(out: Path) -> Path:
    """``--out`` as the reports' common prefix: ``x.md``, ``x.json`` and ``x`` all name ``x``; another
    suffix is part of the name (``run.2026`` stays ``run.2026``)."""
    return out.with_suffix("") if out.suffix in (".md", ".json") else out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_prog("evaluate", "optimize.evaluate"), description=__doc__.split("\n\n")[0]
    )
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    add_web_search_argument(parser)
    parser.add_argument(
        "--program",
        type=Path,
        help="compiled program JSON to evaluate (python -m optimize.compile), or a bundled domain's name for "
        "the program it ships (default)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="evaluate a program compiled on other data than the domain holds now (dataset hashes differ)",
    )
    parser.add_argument(
        "--split", choices=SPLITS, default="test", help="QA split to evaluate (default: test)"
    )
    parser.add_argument(
        "--limit", type=int, help="evaluate N questions of the split, taken evenly across kinds (quick runs)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="report path: PATH.md, with PATH.json and the plots beside it (a .md or .json suffix given is "
        "the same path; default: runs/eval/<domain>-<split>.md)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="bypass DSPy's request cache, so that costs and times are those of a cold run",
    )
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        metavar="N",
        help="evaluate N questions at a time (default: 1). Faster with a hosted LM or a server with several "
        "slots (vLLM, llama.cpp --parallel); the embedded model serves one request at a time and gains "
        "nothing. Same table as with 1, wall times aside",
    )
    parser.add_argument(
        "--rows",
        choices=ROW_SETS,
        default="all",
        help="which rows: all (default); main = baselines and CRAG rows; main+retry = those and "
        "CRAG + internal retry (ablations and retry rounds cost the most LM calls); crag = the CRAG rows "
        "only (to compare a setting with another: python -m optimize.compare)",
    )
    return parser


@interruptible
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)  # every handler redacts credentials
    try:
        settings = settings_from_args(args)
        if args.num_threads > 1 and settings.lm == "embedded":
            log.warning("--num-threads: the embedded model serves one request at a time, so it is no faster")
        report = evaluate_domain(
            settings,
            cache=not args.no_cache,  # the LM is built after the domain and the program are checked
            program=args.program,
            split=args.split,
            limit=args.limit,
            out=_report_prefix(args.out) if args.out else None,
            num_threads=args.num_threads,
            rows=args.rows,
            force=args.force,
        )
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)  # e.g. a --chroma-host with user:password@
        return 2
    except (LMDownError, CRAGRunError) as exc:  # one redacted line, no traceback, no report
        print(error_line(exc), file=sys.stderr)
        return 1
    md = next(Path(p) for p in report["files"] if p.endswith(".md"))
    print(md.read_text(encoding="utf-8"))
    print("\n" + "\n".join(f"wrote {p}" for p in report["files"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
