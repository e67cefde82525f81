"""Seconds to grade one question's k passages with a program's trained evaluator (one batched pass).

    python benchmarks/evaluator_latency.py --program runs/popqa/program.json --domain-dir ../shared/data/popqa-dev [--k 5] [--n 20]

Groups of k relevance passages per question from the domain's relevance.jsonl; one warm-up call first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from crag_dspy.domain import load_domain
from crag_dspy.grading import Grading
from crag_dspy.program import read_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", type=Path, required=True)
    parser.add_argument("--domain-dir", type=Path, required=True)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    grading = Grading().load_state(read_program(args.program)["state"]["grading"])
    grading.attach(args.program.parent)
    if grading.evaluator is None:
        raise SystemExit(f"{args.program} grades with the LLM judge: it has no trained evaluator")
    passages: dict[str, list[str]] = {}
    for pair in load_domain(args.domain_dir).relevance:
        passages.setdefault(pair.question, []).append(pair.passage)
    groups = [(q, (ps * args.k)[: args.k]) for q, ps in passages.items()][: args.n + 1]
    grading.evaluator.logits([(groups[0][0], p) for p in groups[0][1]])  # warm-up
    seconds = []
    for question, texts in groups[1:]:
        started = time.perf_counter()
        grading.evaluator.logits([(question, t) for t in texts])
        seconds.append(time.perf_counter() - started)
    print(
        f"{len(seconds)} questions, {args.k} passages each: median {statistics.median(seconds):.3f} s, "
        f"max {max(seconds):.3f} s per question"
    )


if __name__ == "__main__":
    main()
