"""The embedded model's llama.cpp engines, and other builds of one, on the same CRAG work: seconds per call
and their ratios to the first engine, and how far the engines' P(yes) and answers differ on the same
prompts.

    python benchmarks/engines.py
    python benchmarks/engines.py --engines xllamacpp --other-build /tmp/native-engine

Each engine runs in its own process, started as the app starts it (``build_lm``: the engine's prompt
cache on, DSPy's cache off, no retries), with the uncompiled default program on the domain, and does the
same work: the grader on ``--pairs`` relevance val pairs (whole questions, each question's pairs in a
row as CRAG grades them, the grader's excerpt computed before the clock starts), the strip filter on
``--pairs`` val strips, and ``--answers`` plain-RAG answers to QA val questions (the k whole passages:
long prompts, a few generated tokens). ``--engines`` picks among the installed engines (default: all);
``--other-build FOLDER`` adds xllamacpp as installed in FOLDER, e.g. a build for this CPU:

    CMAKE_ARGS="-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF" \\
        pip wheel --no-deps --no-binary xllamacpp "xllamacpp==<installed version>" -w wheels/
    pip install --no-deps --target /tmp/native-engine wheels/xllamacpp-*.whl

(``python -m crag_dspy engine`` prints the command for this CPU.) Writes benchmarks/results/engines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
import harness
from tqdm.auto import tqdm

from crag_dspy import CRAG, Domain
from crag_dspy.baselines import PlainRAG
from crag_dspy.lm import ENGINES
from optimize.datasets import qa_split, relevance_examples, spread, strip_examples

SCRIPT = "engines"
TIMED = ("grader_s_per_call", "strip_filter_s_per_call", "plain_rag_s_per_question")


def work_for(crag: CRAG, domain: Domain, pairs: int, answers: int) -> dict[str, list[Any]]:
    """The same calls for every engine: grader pairs and strips of whole val questions, QA val questions."""

    def question(e: dspy.Example) -> str:
        return e.question

    work = {
        "grader": spread(relevance_examples(domain.relevance, "val"), question, pairs),
        "strips": spread(strip_examples(domain, "val", crag.config.sentences_per_strip), question, pairs),
        "questions": qa_split(domain, "val", answers),
    }
    for e in work["grader"]:  # the grader's excerpt (MiniLM), cached, so that the clock times the LM alone
        crag.grader.shown_inputs(e.inputs())
    return work


def run_engine(
    crag: CRAG, lm: dspy.BaseLM, work: dict[str, list[Any]], *, progress: bool = True
) -> dict[str, Any]:
    """Seconds per call of each kind of work with ``lm``, and what it answered (P(yes) per judgement)."""
    plain = PlainRAG(crag.retriever, lm=lm, k=crag.config.k, answer_units=crag.config.answer_units)
    out: dict[str, Any] = {}
    with dspy.context(lm=lm):
        crag.grader(**work["grader"][0].inputs())  # warm-up: the instructions enter the prompt cache
        for name, judge, examples in (
            ("grader", crag.grader, work["grader"]),
            ("strip_filter", crag.strip_filter, work["strips"]),
        ):
            started = time.perf_counter()
            out[name] = [
                judge(**e.inputs()).judgement.raw_score
                for e in tqdm(examples, desc=name, disable=not progress)
            ]
            out[f"{name}_s_per_call"] = (time.perf_counter() - started) / len(examples)
        started = time.perf_counter()
        questions = tqdm(work["questions"], desc="plain RAG", disable=not progress)
        out["answers"] = [plain(question=q.question).answer for q in questions]
        out["plain_rag_s_per_question"] = (time.perf_counter() - started) / len(work["questions"])
    return out


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per timed kind, each engine's seconds and its ratio to the first engine's; per judge, how far each
    engine's P(yes) is from the first's (mean and max absolute difference, flips at 0.5); same answers."""
    first, *others = runs
    summary: dict[str, Any] = {"baseline": first}
    for key in TIMED:
        summary[key] = {name: run[key] for name, run in runs.items()}
        summary[key]["ratio_to_baseline"] = {name: runs[name][key] / runs[first][key] for name in others}
    for judge in ("grader", "strip_filter"):
        summary[f"{judge}_p_yes"] = {}
        for name in others:
            known = [
                (a, b)
                for a, b in zip(runs[first][judge], runs[name][judge], strict=True)
                if a is not None and b is not None
            ]
            diffs = [abs(a - b) for a, b in known]
            summary[f"{judge}_p_yes"][name] = {
                "mean_abs_diff": sum(diffs) / len(diffs) if diffs else None,
                "max_abs_diff": max(diffs, default=None),
                "flips_at_0.5": sum((a >= 0.5) != (b >= 0.5) for a, b in known),
                "n": len(known),
            }
    summary["plain_rag_same_answers"] = {
        name: sum(a == b for a, b in zip(runs[first]["answers"], runs[name]["answers"], strict=True))
        for name in others
    }
    return summary


def report(summary: dict[str, Any], runs: dict[str, dict[str, Any]]) -> None:
    base = summary["baseline"]
    print(f"\n{'per call (s)':26} " + " ".join(f"{name:>22}" for name in runs))
    for key in TIMED:
        cells = [
            f"{summary[key][name]:.3f}"
            + (f" ({summary[key]['ratio_to_baseline'][name]:.2f}x)" if name != base else "")
            for name in runs
        ]
        print(f"{key:26} " + " ".join(f"{c:>22}" for c in cells))
    for name in runs:
        if name == base:
            continue
        for judge in ("grader", "strip_filter"):
            d = summary[f"{judge}_p_yes"][name]
            if d["n"]:
                print(
                    f"{judge} P(yes), {name} vs {base}: mean |diff| {d['mean_abs_diff']:.4f}, max "
                    f"{d['max_abs_diff']:.4f}, {d['flips_at_0.5']} of {d['n']} on the other side of 0.5"
                )
        same = summary["plain_rag_same_answers"][name]
        print(f"plain RAG answers identical, {name} vs {base}: {same} of {len(runs[base]['answers'])}")


def child_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without its ``--other-build`` folders: what every engine's process is given."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--other-build":
            skip = True
        elif not a.startswith("--other-build="):
            out.append(a)
    return out


def run_in_subprocess(argv: Sequence[str], engine: str, site: Path | None = None) -> dict[str, Any]:
    """This script with ``--run-engine engine`` in a new process (one process holds one xllamacpp); with
    ``site``, its xllamacpp is the one installed there."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--run-engine", engine],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = harness.parser(__doc__, cache_flag=False)
    p.add_argument(
        "--pairs", type=int, default=40, help="grader pairs and strips, whole questions (default 40)"
    )
    p.add_argument("--answers", type=int, default=8, help="plain-RAG answers to QA val questions (default 8)")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated, of {', '.join(ENGINES)} (default: all)",
    )
    p.add_argument(
        "--other-build",
        type=Path,
        action="append",
        default=[],
        metavar="FOLDER",
        help="xllamacpp installed in FOLDER (pip install --target); repeatable",
    )
    p.add_argument("--run-engine", help=argparse.SUPPRESS)
    args = harness.parse(p, argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    if args.run_engine:  # the child: one engine, numbers on stdout
        settings = harness.settings_for(args, embedded_engine=args.run_engine, lm="embedded")
        lm = harness.lm_for(settings, args, cache=False, num_retries=0)
        crag, domain = harness.open_crag(settings, lm, None, None)
        print(json.dumps(run_engine(crag, lm, work_for(crag, domain, args.pairs, args.answers))))
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        p.error(f"--engines takes some of {', '.join(ENGINES)}, got {args.engines!r}")
    for folder in args.other_build:
        if not (folder / "xllamacpp").is_dir():
            p.error(f"--other-build {folder}: no xllamacpp package in it (pip install --target FOLDER ...)")
    if args.pairs < 1 or args.answers < 1:
        p.error("--pairs and --answers must be at least 1")
    child = child_argv(argv)
    runs = {engine: run_in_subprocess(child, engine) for engine in engines}
    for folder in args.other_build:
        runs[f"xllamacpp ({folder})"] = run_in_subprocess(child, "xllamacpp", folder)
    summary = summarize(runs)
    report(summary, runs)
    settings = harness.settings_for(args)
    results = {"domain": harness.domain_of(settings).name, "summary": summary, "runs": runs}
    harness.write_result(
        harness.result_path(args, SCRIPT), SCRIPT, argv, results, lm=f"embedded/{settings.embedded_model}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
