"""CRAG vs plain RAG on the same questions, model and machine, in one run: accuracy (Wilson 95% intervals,
exact McNemar p), wall time, LM calls and prompt tokens per question with their ratios (paired bootstrap
95% intervals over questions), where CRAG's time goes (by stage and by action), and a check that no
identical LM request repeats within a question.

    python benchmarks/crag_vs_rag.py --program default --limit 24
    python benchmarks/crag_vs_rag.py --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev
    python benchmarks/crag_vs_rag.py --hosted-latency 0.2 --threads 8 --limit 100 --out /tmp/hosted.json
    python benchmarks/crag_vs_rag.py --hosted-latency 0.2 --concurrency 8 --limit 24
    python benchmarks/crag_vs_rag.py --program default --followups benchmarks/followups.jsonl

The questions are the split's (``--split``, default test), ``--limit`` of them taken evenly across kinds;
without ``--program`` the uncompiled default program runs. Plain RAG retrieves the program's k passages
and answers from them with the same answerer signature. Every LM call is real (DSPy's cache off; the
engine's prompt-prefix cache on, as in the app), and the model's start and first prompt prefixes are
warmed up before the clock starts. Questions alternate RAG, CRAG.

``--threads N`` (N > 1) runs the questions once more on N threads (each question's RAG and CRAG in one
worker) and reports the speed-up and whether every answer, action and LM call count is the same; the
per-question numbers are the one-thread run's. ``--hosted-latency S`` measures that without a model:
the LM is then the project's OpenAI-compatible server on a free loopback port over a fake engine that
waits S seconds per request, as a hosted API's round trip does, and replies deterministically from the
prompt, shaped as the adapters parse it (never a quality claim; no result file unless ``--out``).

``--concurrency N`` then answers every question twice in a row: sequentially, and with
``await crag.acall(...)`` and ``LMCalls(concurrency=N)`` (a question's gradings, then its strip
judgements, N at a time); it reports their wall times per question, their ratio, and whether every
answer, action and LM call count is the same.

``--followups FILE`` measures conversations instead: each follow-up (a JSON line with ``history``, a
``question`` that is ambiguous alone and gold ``answers``; benchmarks/followups.jsonl has 21 over the
default domain) answered by CRAG with its history (condensed into a standalone question first) and
without (the follow-up as asked), right answers paired by exact McNemar. Writes
benchmarks/results/crag_vs_rag_followups_<domain>.json.

Writes benchmarks/results/crag_vs_rag_<domain>.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
import harness
import orjson
from harness import FakeHostedEngine

from crag_dspy.baselines import PlainRAG
from crag_dspy.domain import QAPair
from crag_dspy.lm import OpenAIServer
from crag_dspy.trace import usage_from_tracker
from optimize.datasets import qa_split
from optimize.metrics import answer_matches, bootstrap_ratio_interval, mcnemar_exact
from optimize.parallel import map_questions

SCRIPT = "crag_vs_rag"
USAGE = ("calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens")

# --- the measurement -------------------------------------------------------------------------------------


def duplicates(history: Sequence[dict]) -> int:
    """LM requests in ``history`` identical to an earlier one (same messages and settings)."""
    keys = Counter(
        orjson.dumps({"m": h["messages"], "k": h["kwargs"]}, option=orjson.OPT_SORT_KEYS) for h in history
    )
    return sum(n - 1 for n in keys.values())


def run_question(
    q: QAPair, rag: dspy.Module, crag: dspy.Module, lm: dspy.BaseLM, *, check_duplicates: bool
) -> dict[str, dict[str, Any]]:
    """Plain RAG, then CRAG, on one question: seconds, LM usage, answer, correctness (CRAG: its action and
    seconds per stage); with ``check_duplicates`` (one thread only) the repeated LM requests."""
    row: dict[str, dict[str, Any]] = {}
    for name, program in (("rag", rag), ("crag", crag)):
        if check_duplicates:
            lm.history.clear()
        started = time.perf_counter()
        with dspy.track_usage() as tracker:
            pred = program(question=q.question)
        r = {
            "id": q.id,
            "seconds": time.perf_counter() - started,
            **usage_from_tracker(tracker).model_dump(),
            "answer": pred.answer,
            "correct": answer_matches(pred.answer, q.answers),
        }
        if check_duplicates:
            r["duplicates"] = duplicates(lm.history)
        if name == "crag":
            r["action"] = pred.action
            r["stage_seconds"] = dict(pred.trace.timings)
        row[name] = r
    return row


def run_questions(
    questions: Sequence[QAPair], rag: dspy.Module, crag: dspy.Module, lm: dspy.BaseLM, *, threads: int = 1
) -> tuple[dict[str, list[dict[str, Any]]], float]:
    """``{"rag": rows, "crag": rows}`` in question order, and the wall time of the whole run."""
    started = time.perf_counter()
    rows = map_questions(
        lambda q: run_question(q, rag, crag, lm, check_duplicates=threads == 1),
        questions,
        num_threads=threads,
        desc=f"questions ({threads} thread{'s' if threads > 1 else ''})",
    )
    return {name: [r[name] for r in rows] for name in ("rag", "crag")}, time.perf_counter() - started


def run_concurrent(
    questions: Sequence[QAPair], crag: dspy.Module, concurrency: int
) -> dict[str, list[dict[str, Any]]]:
    """Every question answered twice in a row, sequentially (``forward``) and through
    ``await crag.acall(...)`` with ``concurrency`` LM calls in flight: ``{"sequential": rows,
    "concurrent": rows}``. Alternating per question puts both on the same warm caches and machine load."""
    fast = crag.deepcopy()
    calls = fast.config.lm_calls.model_dump() | {"concurrency": concurrency}
    fast.config = fast.config.replace(lm_calls=calls)
    runs = {
        "sequential": lambda q: crag(question=q),
        "concurrent": lambda q: asyncio.run(fast.acall(question=q)),
    }
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for q in questions:
        for name, answer in runs.items():
            started = time.perf_counter()
            with dspy.track_usage() as tracker:
                pred = answer(q.question)
            rows[name].append(
                {
                    "id": q.id,
                    "seconds": time.perf_counter() - started,
                    "calls": usage_from_tracker(tracker).calls,
                    "answer": pred.answer,
                    "correct": answer_matches(pred.answer, q.answers),
                    "action": pred.action,
                }
            )
    return rows


def stage_seconds(crag_rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for r in crag_rows:
        for stage, seconds in r.get("stage_seconds", {}).items():
            total[stage] += seconds
    return dict(total)


def by_action(rows: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per CRAG action: CRAG's and plain RAG's seconds summed over its questions, and their number."""
    out: dict[str, dict[str, float]] = {}
    for rag, crag in zip(rows["rag"], rows["crag"], strict=True):
        a = out.setdefault(crag["action"], {"crag_s": 0.0, "rag_s": 0.0, "n": 0})
        a["crag_s"] += crag["seconds"]
        a["rag_s"] += rag["seconds"]
        a["n"] += 1
    return out


def summarize(rows: dict[str, list[dict[str, Any]]], stages: dict[str, float]) -> dict[str, Any]:
    """Means per question and CRAG / RAG ratios, accuracies with intervals and McNemar's p, grading's share."""
    summary: dict[str, Any] = {}
    for key in ("seconds", *USAGE):
        r, c = (statistics.fmean(row[key] for row in rows[name]) for name in ("rag", "crag"))
        interval = bootstrap_ratio_interval(
            [row[key] for row in rows["crag"]], [row[key] for row in rows["rag"]]
        )
        summary[key] = {"rag": r, "crag": c, "ratio": c / r if r else None, "ratio_ci": interval}
    right = {name: [bool(row["correct"]) for row in rows[name]] for name in ("rag", "crag")}
    for name in ("rag", "crag"):
        summary[f"{name}_accuracy"] = harness.rate(sum(right[name]), len(right[name]))
    summary["mcnemar_p"] = mcnemar_exact(right["crag"], right["rag"])
    rag_total = sum(row["seconds"] for row in rows["rag"])
    # The floor of the ratio: grading alone reads every retrieved passage, as plain RAG's answer does.
    summary["grading_vs_rag"] = stages.get("grade", 0.0) / rag_total if rag_total else None
    summary["grade_seconds_per_question"] = stages.get("grade", 0.0) / len(rows["crag"])
    summary["actions"] = dict(Counter(row["action"] for row in rows["crag"]))
    checked = [row["duplicates"] for name in ("rag", "crag") for row in rows[name] if "duplicates" in row]
    summary["duplicate_requests"] = sum(checked) if checked else None
    return summary


def same_outcomes(a: dict[str, list[dict[str, Any]]], b: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether two runs gave every question the same answers, actions and LM call counts."""
    keys = ("id", "answer", "correct", "action", "calls")
    return all(
        [{k: r.get(k) for k in keys} for r in a[name]] == [{k: r.get(k) for k in keys} for r in b[name]]
        for name in ("rag", "crag")
    )


def report(results: dict[str, Any]) -> None:
    s = results["summary"]
    print(
        f"\n{results['questions']} {results['split']} questions of `{results['domain']}`, k={results['k']}, "
        f"{results['program'] or 'uncompiled defaults'} (lower={results['thresholds']['lower']:.3f}, "
        f"upper={results['thresholds']['upper']:.3f}), grade source {results['grade_source']}"
    )
    print(f"{'per question':<22} {'plain RAG':>10} {'CRAG':>10} {'ratio':>7}")
    for key in ("seconds", *USAGE):
        r, c, ratio = s[key]["rag"], s[key]["crag"], s[key]["ratio"]
        ci = s[key].get("ratio_ci")
        interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        print(f"{key:<22} {r:10.1f} {c:10.1f} {ratio if ratio is not None else float('nan'):7.2f}x{interval}")
    print(
        f"accuracy: plain RAG {harness.fmt_rate(s['rag_accuracy'])}, CRAG {harness.fmt_rate(s['crag_accuracy'])}"
    )
    verdict = "a difference" if s["mcnemar_p"] < 0.05 else "no measured difference"
    print(f"CRAG vs plain RAG, exact McNemar p = {s['mcnemar_p']:.3f} ({verdict})")
    stages = results["stage_seconds"]
    total = sum(stages.values()) or 1.0
    print(
        "CRAG time by stage: "
        + ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(stages.items(), key=lambda x: -x[1]))
    )
    if s["grading_vs_rag"] is not None:
        print(f"CRAG grading alone / plain RAG wall time: {s['grading_vs_rag']:.2f}x")
    for action, a in sorted(results["by_action"].items()):
        ratio = a["crag_s"] / a["rag_s"] if a["rag_s"] else float("nan")
        print(
            f"  {action}: {a['n']} questions, CRAG {a['crag_s'] / a['n']:.1f} s vs RAG {a['rag_s'] / a['n']:.1f} s ({ratio:.2f}x)"
        )
    if s["duplicate_requests"] is not None:
        print(f"identical LM requests repeated within a question: {s['duplicate_requests']}")
    for threads, t in results.get("threads", {}).items():
        extra = f", {t['speedup']:.2f}x, same outcomes: {t['same_outcomes']}" if "speedup" in t else ""
        print(f"{threads} thread(s): {t['seconds']:.1f} s wall{extra}")
    if "concurrency" in results:
        c = results["concurrency"]
        print(
            f"CRAG per question, sequential {c['sequential_seconds']:.2f} s vs aforward with {c['n']} LM calls "
            f"in flight {c['seconds']:.2f} s: {c['ratio']:.2f}x; same outcomes: {c['same_outcomes']}"
        )


# --- follow-up questions: with and without condensing the history ---------------------------------------


def read_followups(path: Path) -> list[dict[str, Any]]:
    """The follow-ups of a JSON-lines file, each checked: ``id``, ``history`` (turns of ``question`` and
    ``answer``), ``question`` and gold ``answers``; a ValueError names the line and what is missing."""
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        missing = [key for key in ("id", "history", "question", "answers") if not item.get(key)]
        if missing:
            raise ValueError(f"{path}:{number}: a follow-up needs {', '.join(missing)}")
        if not all(isinstance(t, dict) and t.get("question") and "answer" in t for t in item["history"]):
            raise ValueError(f"{path}:{number}: each history turn needs a question and an answer")
        items.append(item)
    return items


def answer_followups(crag: Any, items: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each follow-up answered twice: ``condensed`` with its history (a standalone question first) and
    ``as_asked`` without it; a row per follow-up and side: its answer, whether it is right, the question
    the stages read."""
    rows: dict[str, list[dict[str, Any]]] = {"condensed": [], "as_asked": []}
    for item in items:
        for side, history in (("condensed", item["history"]), ("as_asked", None)):
            trace = crag(question=item["question"], history=history).trace
            rows[side].append(
                {
                    "id": item["id"],
                    "answer": trace.answer,
                    "right": answer_matches(trace.answer, item["answers"]),
                    "asked": trace.standalone_question or trace.question,
                    "action": trace.action,
                }
            )
    return rows


def summarize_followups(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Accuracy of each side (Wilson intervals), the discordant pairs and the exact McNemar p."""
    condensed = [r["right"] for r in rows["condensed"]]
    as_asked = [r["right"] for r in rows["as_asked"]]
    pairs = list(zip(condensed, as_asked, strict=True))
    return {
        "questions": len(pairs),
        "condensed_accuracy": harness.rate(sum(condensed), len(pairs)),
        "as_asked_accuracy": harness.rate(sum(as_asked), len(pairs)),
        "only_condensed_right": sum(c and not a for c, a in pairs),
        "only_as_asked_right": sum(a and not c for c, a in pairs),
        "mcnemar_p": mcnemar_exact(condensed, as_asked),
    }


def report_followups(summary: dict[str, Any]) -> None:
    print(f"{summary['questions']} follow-up questions")
    print(f"  with the history condensed: {harness.fmt_rate(summary['condensed_accuracy'])}")
    print(f"  as asked, without history:  {harness.fmt_rate(summary['as_asked_accuracy'])}")
    print(
        f"  right only condensed {summary['only_condensed_right']}, only as asked "
        f"{summary['only_as_asked_right']}; exact McNemar p = {summary['mcnemar_p']:.3f}"
    )


def main(argv: list[str] | None = None, *, lm: dspy.BaseLM | None = None) -> int:
    p = harness.parser(__doc__, cache_flag=False, program=True)
    p.add_argument("--split", default="test", help="QA split (default test)")
    p.add_argument(
        "--limit", type=int, help="N questions of the split, taken evenly across kinds (default: all)"
    )
    p.add_argument("--threads", type=int, default=1, help="also run on N threads and compare (default 1)")
    p.add_argument(
        "--hosted-latency", type=float, metavar="S", help="a simulated hosted LM, S seconds per request"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="also answer with aforward and N LM calls of a question in flight, and compare",
    )
    p.add_argument(
        "--followups",
        type=Path,
        metavar="FILE",
        help="instead: answer these follow-ups with and without their history (benchmarks/followups.jsonl)",
    )
    args = harness.parse(p, argv)
    if args.threads < 1:
        p.error("--threads must be at least 1")
    if args.concurrency is not None and args.concurrency < 2:
        p.error("--concurrency must be at least 2 (1 is the sequential run every benchmark makes)")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    document = harness.read_document(args.program)
    if args.followups is not None:
        return followups_main(args, argv, document, lm)
    server = None
    if args.hosted_latency is not None and lm is None:
        engine = FakeHostedEngine(latency=0.0)  # no latency while warming up
        server = OpenAIServer(engine, "fake-hosted", api_key=None)  # a fake engine, for this run only
        extra = {"lm": "openai/fake-hosted", "lm_api_base": f"http://127.0.0.1:{server.port}/v1"}
        settings = harness.settings_for(args, document, **extra)
    else:
        settings = harness.settings_for(args, document)
    try:
        # Every call real: the model is measured, not DSPy's cache.
        lm = harness.lm_for(settings, args, lm, cache=False)
        crag, domain = harness.open_crag(settings, lm, document, args.program)
        questions = qa_split(domain, args.split, args.limit)
        if not questions:
            p.error(f"domain `{domain.name}` has no {args.split} questions")
        rag = PlainRAG(crag.retriever, lm=lm, k=crag.config.k, answer_units=crag.config.answer_units)
        rag(question="warm-up")  # the model's start and the first prompt prefixes count for neither system
        crag(question="warm-up")
        if server is not None:
            engine.latency = args.hosted_latency
        rows, wall = run_questions(questions, rag, crag, lm)
        stages = stage_seconds(rows["crag"])
        results: dict[str, Any] = {
            "domain": domain.name,
            "split": args.split,
            "questions": len(questions),
            "program": str(args.program) if args.program else None,
            "k": crag.config.k,
            "thresholds": crag.thresholds.dump_state(),
            "grade_source": crag.grading.mode,
            "config": crag.config.model_dump(mode="json"),
            "hosted_latency": args.hosted_latency,
            "summary": summarize(rows, stages),
            "stage_seconds": stages,
            "by_action": by_action(rows),
            "rows": rows,
        }
        if args.threads > 1:
            parallel, parallel_wall = run_questions(questions, rag, crag, lm, threads=args.threads)
            results["threads"] = {
                "1": {"seconds": wall},
                str(args.threads): {
                    "seconds": parallel_wall,
                    "speedup": wall / parallel_wall,
                    "same_outcomes": same_outcomes(rows, parallel),
                },
            }
        if args.concurrency:
            both = run_concurrent(questions, crag, args.concurrency)
            sequential, concurrent = (statistics.fmean(r["seconds"] for r in both[n]) for n in both)
            results["concurrency"] = {
                "n": args.concurrency,
                "sequential_seconds": sequential,
                "seconds": concurrent,
                "ratio": concurrent / sequential,
                "same_outcomes": same_outcomes(
                    {"rag": [], "crag": both["sequential"]}, {"rag": [], "crag": both["concurrent"]}
                ),
            }
    finally:
        if server is not None:
            server.close()
    report(results)
    if args.hosted_latency is None or args.out is not None:
        harness.write_result(harness.result_path(args, SCRIPT, domain.name), SCRIPT, argv, results, lm=lm)
    same = results.get("threads", {}).get(str(args.threads), {}).get("same_outcomes", True)
    same = same and results.get("concurrency", {}).get("same_outcomes", True)
    return 0 if same else 1


def followups_main(args: Any, argv: list[str] | None, document: Any, lm: dspy.BaseLM | None) -> int:
    """``--followups``: the conversation measurement (every LM call real, as the main one)."""
    items = read_followups(args.followups)
    settings = harness.settings_for(args, document)
    lm = harness.lm_for(settings, args, lm, cache=False)
    crag, domain = harness.open_crag(settings, lm, document, args.program)
    rows = answer_followups(crag, items)
    summary = summarize_followups(rows)
    report_followups(summary)
    results = {
        "domain": domain.name,
        "followups": str(args.followups),
        "program": str(args.program) if args.program else None,
        "summary": summary,
        "rows": rows,
    }
    harness.write_result(
        harness.result_path(args, f"{SCRIPT}_followups", domain.name), SCRIPT, argv, results, lm=lm
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
