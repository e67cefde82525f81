"""The two embedded engines (ik_llama, xllamacpp) on the same CRAG work, one run, as ratios.

Each engine is started the way the app starts it (``build_lm``: its prompt cache on,
reached through ``dspy.LM``, DSPy's cache off) and does the same work: the grader on whole questions
of the default domain's relevance val split (the excerpt the grader reads, each question's pairs in
a row, as CRAG grades them), the strip filter on val strips, and plain-RAG answers (five whole
passages each: long prompts and a few generated tokens). The excerpts are computed before the clock
starts, so both engines are timed on the LM alone. Prints seconds per call, the ratio, and how far
the two engines' P(yes) differ on the same prompts.

    python benchmarks/engines.py [--pairs 40] [--answers 8] [--out benchmarks/results/engines.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy

from crag_dspy.app import assemble
from crag_dspy.baselines import PlainRAG
from crag_dspy.lm import build_lm
from crag_dspy.lm.embedded import ENGINES
from crag_dspy.settings import Settings
from optimize.compile import _question
from optimize.datasets import qa_split, relevance_examples, spread, strip_examples


def run(engine: str, crag, settings: Settings, work: dict) -> dict:
    lm = build_lm(settings.model_copy(update={"embedded_engine": engine}), num_retries=0, cache=False)
    plain = PlainRAG(crag.retriever, lm=lm, k=crag.k)
    out: dict = {"engine": engine}
    with dspy.context(lm=lm):
        crag.grader(**work["grader"][0].inputs())  # warm-up: the instructions enter the prompt cache
        for name, judge, examples in (
            ("grader", crag.grader, work["grader"]),
            ("strip_filter", crag.strip_filter, work["strips"]),
        ):
            started = time.perf_counter()
            out[name] = [judge(**e.inputs()).judgement.raw_score for e in examples]
            out[f"{name}_s_per_call"] = (time.perf_counter() - started) / len(examples)
        started = time.perf_counter()
        out["answers"] = [plain(question=q.question).answer for q in work["questions"]]
        out["plain_rag_s_per_question"] = (time.perf_counter() - started) / len(work["questions"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pairs", type=int, default=40, help="grader pairs and strip-filter strips (whole questions)"
    )
    parser.add_argument("--answers", type=int, default=8, help="plain-RAG answers (QA val questions)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings()
    crag, backends = assemble(
        settings, lm=dspy.LM("openai/unused", api_base="http://127.0.0.1:9"), progress=False
    )
    domain = backends.domain
    work = {
        "grader": spread(relevance_examples(domain.relevance, "val"), _question, args.pairs),
        "strips": spread(strip_examples(domain, "val", crag.sentences_per_strip), _question, args.pairs),
        "questions": qa_split(domain, "val", args.answers),
    }
    for e in work["grader"]:  # the grader's excerpt (MiniLM) once, outside the timed part
        crag.grader.shown_inputs(e.inputs())
    runs = {engine: run(engine, crag, settings, work) for engine in ENGINES}
    ik, xl = runs["ik_llama"], runs["xllamacpp"]
    summary = {}
    for key in ("grader_s_per_call", "strip_filter_s_per_call", "plain_rag_s_per_question"):
        summary[key] = {
            "ik_llama": round(ik[key], 3),
            "xllamacpp": round(xl[key], 3),
            "speedup": round(xl[key] / ik[key], 2),
        }
        print(
            f"{key:26} ik_llama {ik[key]:6.2f}  xllamacpp {xl[key]:6.2f}  xllamacpp/ik_llama {xl[key] / ik[key]:.2f}x"
        )
    for judge in ("grader", "strip_filter"):
        diffs = [abs(a - b) for a, b in zip(ik[judge], xl[judge]) if a is not None and b is not None]
        flips = sum(
            (a >= 0.5) != (b >= 0.5) for a, b in zip(ik[judge], xl[judge]) if a is not None and b is not None
        )
        summary[f"{judge}_p_yes"] = {
            "mean_abs_diff": round(sum(diffs) / len(diffs), 4),
            "max_abs_diff": round(max(diffs), 4),
            "flips_at_0.5": flips,
            "n": len(diffs),
        }
        print(
            f"{judge} P(yes): mean |diff| {summary[f'{judge}_p_yes']['mean_abs_diff']:.4f}, max {max(diffs):.4f}, {flips} of {len(diffs)} flip at 0.5"
        )
    same = sum(a == b for a, b in zip(ik["answers"], xl["answers"]))
    summary["plain_rag_same_answers"] = f"{same} of {len(ik['answers'])}"
    print(f"plain RAG answers identical: {same} of {len(ik['answers'])}")
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
