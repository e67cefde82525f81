"""CRAG vs plain RAG on the same questions, model and machine, in one run: wall time, LM calls and
prompt tokens per question, and their ratios; CRAG's time per stage; prompt-prefix cache use; and a
check that no identical LM request is made twice within one question.

    python benchmarks/crag_vs_rag.py [--n 12] [--split test] [--lm embedded] [--program PATH] [--text-adapter text|chat]
        [--domain-dir DIR]

Questions are taken evenly across kinds (kb / web / both / none); ``--program`` measures a compiled
program (its thresholds and prompts) instead of the uncompiled defaults.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

import dspy
import orjson
from tqdm.auto import tqdm

from crag_dspy.app import build_crag, load_program, open_backends
from crag_dspy.baselines import PlainRAG
from crag_dspy.generation import TEXT_ADAPTERS
from crag_dspy.lm import build_lm, lm_identity
from crag_dspy.settings import Settings
from crag_dspy.trace import usage_from_tracker
from optimize.datasets import qa_split
from optimize.metrics import answer_matches


def _duplicates(history: list[dict]) -> int:
    keys = Counter(
        orjson.dumps({"m": h["messages"], "k": h["kwargs"]}, option=orjson.OPT_SORT_KEYS) for h in history
    )
    return sum(n - 1 for n in keys.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=12)
    parser.add_argument("--split", default="test")
    parser.add_argument("--lm")
    parser.add_argument("--program", type=Path, help="a compiled program JSON (default: uncompiled)")
    parser.add_argument(
        "--text-adapter",
        choices=TEXT_ADAPTERS,
        help="answer/rewrite format for both systems (default: the program's, or 'text')",
    )
    parser.add_argument(
        "--domain-dir", type=Path, help="a domain outside data/ (default: the bundled default)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    overrides = {"lm": args.lm} if args.lm else {}
    settings = Settings(**overrides, **({"domain_dir": args.domain_dir} if args.domain_dir else {}))
    backends = open_backends(settings)
    questions = qa_split(backends.domain, args.split, args.n)
    lm = build_lm(settings, cache=False)  # every call real: we are measuring the model, not the cache
    if args.program:
        crag = load_program(args.program, settings=settings, lm=lm, progress=False)
    else:
        crag = build_crag(settings, lm=lm, progress=False)
    if args.text_adapter:
        crag.text_adapter = args.text_adapter
    rag = PlainRAG(
        crag.retriever, lm=lm, k=crag.k, text_adapter=crag.text_adapter, answer_units=crag.answer_units
    )
    rag(question="warm-up")  # model load and the first prompt prefixes are not part of either system's cost
    crag(question="warm-up")

    rows = defaultdict(list)
    stage_time = defaultdict(float)
    by_action = defaultdict(lambda: [0.0, 0.0, 0])  # action -> [CRAG s, RAG s, questions]
    for q in tqdm(questions, desc="questions"):
        for name, program in (("rag", rag), ("crag", crag)):
            lm.history.clear()
            started = time.perf_counter()
            with dspy.track_usage() as tracker:
                pred = program(question=q.question)
            row = {
                "seconds": time.perf_counter() - started,
                **usage_from_tracker(tracker).model_dump(),
                "correct": answer_matches(pred.answer, q.answers),
                "duplicates": _duplicates(lm.history),
            }
            if name == "crag":
                row["action"] = pred.action
                for stage, seconds in pred.trace.timings.items():
                    stage_time[stage] += seconds
                by_action[pred.action][0] += row["seconds"]
                by_action[pred.action][1] += rows["rag"][-1]["seconds"]
                by_action[pred.action][2] += 1
            rows[name].append(row)

    def mean(name, key):
        return statistics.fmean(r[key] for r in rows[name])

    program = f"program {args.program}" if args.program else "uncompiled defaults"
    print(
        f"\n{len(questions)} {args.split} questions, LM {lm_identity(settings)}, k={crag.k}, {program} "
        f"(lower={crag.thresholds.lower:.3f}, upper={crag.thresholds.upper:.3f}), text adapter {crag.text_adapter}"
    )
    print(f"{'':10} {'plain RAG':>10} {'CRAG':>10} {'ratio':>7}")
    summary = {}
    for key in ("seconds", "calls", "prompt_tokens", "cached_prompt_tokens", "completion_tokens"):
        r, c = mean("rag", key), mean("crag", key)
        summary[key] = {"rag": r, "crag": c, "ratio": c / r if r else None}
        print(f"{key:<22} {r:10.1f} {c:10.1f} {c / r if r else float('nan'):7.2f}x")
    for name in ("rag", "crag"):
        summary[f"{name}_accuracy"] = mean(name, "correct")
    print(
        f"accuracy (gold alias match): plain RAG {summary['rag_accuracy']:.2f}, CRAG {summary['crag_accuracy']:.2f}"
    )
    total = sum(stage_time.values())
    print(
        "CRAG time by stage: "
        + ", ".join(f"{s} {t / total:.0%}" for s, t in sorted(stage_time.items(), key=lambda x: -x[1]))
    )
    # The floor of the ratio: grading alone reads every retrieved passage, as plain RAG's answer does.
    rag_total = sum(r["seconds"] for r in rows["rag"])
    summary["grading_vs_rag"] = stage_time.get("grade", 0.0) / rag_total if rag_total else None
    print(f"CRAG grading alone / plain RAG wall time: {summary['grading_vs_rag']:.2f}x")
    summary["grade_seconds_per_question"] = stage_time.get("grade", 0.0) / len(questions)
    sources = Counter(d.score_source for d in pred.trace.documents)
    print(
        f"grading {crag.k} passages: {summary['grade_seconds_per_question']:.3f} s per question "
        f"(grade source {crag.grading.mode}; last question's scores from {dict(sources)})"
    )
    print(
        "CRAG actions: "
        + ", ".join(f"{a} {n}" for a, n in Counter(r["action"] for r in rows["crag"]).items())
    )
    for action, (crag_s, rag_s, n) in sorted(by_action.items()):
        print(
            f"  {action}: {n} questions, CRAG {crag_s / n:.1f} s vs RAG {rag_s / n:.1f} s ({crag_s / rag_s:.2f}x)"
        )
    dup = sum(r["duplicates"] for r in rows["crag"]) + sum(r["duplicates"] for r in rows["rag"])
    print(f"identical LM requests repeated within a question: {dup}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "program": str(args.program) if args.program else None,
                    "thresholds": crag.thresholds.dump_state(),
                    "text_adapter": crag.text_adapter,
                    "summary": summary,
                    "rows": rows,
                    "stage_seconds": stage_time,
                    "by_action": {a: dict(zip(("crag_s", "rag_s", "n"), v)) for a, v in by_action.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
