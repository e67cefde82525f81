"""Does each heuristic beyond the paper pay? A compiled program answered with one setting switched off.

Runs the program on a QA split as shipped, then once per ``--variants`` entry with that one setting
changed, and compares each variant with the program on the same questions: accuracy (Wilson 95%
interval), the questions only one of the two answers right, and the exact McNemar p. A setting
pays on a domain when switching it off is *worse* there at p < 0.05.

    python benchmarks/knob_ablation.py --program runs/default/program.json [--split test] [--limit N]
        [--variants answer_units fallback_web_strips grade_term_stems grade_term_weight grade_sentences]

Answers come from DSPy's disk cache when they are there, so the shipped program costs nothing after an
evaluation and a variant pays only for the LM requests it changes. A question whose run failed counts
as wrong and is listed.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from crag_dspy.app import open_program
from crag_dspy.domain import load_domain
from crag_dspy.faults import CRAGRunError
from optimize.datasets import qa_split
from optimize.metrics import answer_matches, mcnemar_exact, wilson_interval

# The setting a variant switches off, and the value that switches it off.
OFF: dict[str, tuple[str, Any]] = {
    "answer_units": ("answer_units", False),
    "fallback_web_strips": ("fallback_web_strips", 0),
    "grade_term_stems": ("grade_term_stems", False),
    "grade_term_weight": ("grade_term_weight", 0.0),
    "grade_sentences": ("grade_sentences", 0),
}


def answer_all(crag, questions, desc: str) -> list[dict[str, Any]]:
    rows = []
    for q in tqdm(questions, desc=desc):
        try:
            answer, error = crag(question=q.question).answer, None
        except CRAGRunError as exc:
            answer, error = None, str(exc)
        rows.append(
            {"id": q.id, "answer": answer, "right": answer_matches(answer, q.answers), "error": error}
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--variants", nargs="+", default=list(OFF), choices=list(OFF))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    loaded = open_program(args.program)
    recorded = loaded.document["metadata"].get("domain_dir")
    domain = load_domain(Path(recorded) if recorded else Path("data") / loaded.domain)
    questions = qa_split(domain, args.split, args.limit)
    shipped = answer_all(loaded.crag, questions, "program")
    base = [r["right"] for r in shipped]
    result: dict[str, Any] = {
        "program": str(args.program),
        "domain": loaded.domain,
        "split": args.split,
        "questions": len(questions),
        "shipped": {"right": sum(base), "failed": [r["id"] for r in shipped if r["error"]]},
        "variants": [],
    }
    out = args.out or Path(f"runs/knob_ablation_{loaded.domain}_{args.split}.json")
    for name in args.variants:
        attribute, value = OFF[name]
        crag = copy.deepcopy(loaded.crag)
        setattr(crag, attribute, value)
        rows = answer_all(crag, questions, f"{attribute}={value}")
        right = [r["right"] for r in rows]
        result["variants"].append(
            {
                "variant": f"{attribute}={value}",
                "right": sum(right),
                "only_program_right": sum(b and not v for b, v in zip(base, right)),
                "only_variant_right": sum(v and not b for b, v in zip(base, right)),
                "mcnemar_p": mcnemar_exact(base, right),
                "failed": [r["id"] for r in rows if r["error"]],
                "changed_answers": sum(a["answer"] != b["answer"] for a, b in zip(shipped, rows)),
            }
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))  # after every variant: a long run keeps what it measured

    n = len(questions)
    lo, hi = wilson_interval(sum(base), n)
    print(f"\n{loaded.domain} {args.split}, {n} questions; program {sum(base)}/{n} [{lo:.1%}, {hi:.1%}]")
    print(
        f"{'switched off':<28} {'right':>6} {'95% CI':>16} {'only prog':>9} {'only var':>8} {'p':>6} {'changed':>7}"
    )
    for v in result["variants"]:
        lo, hi = wilson_interval(v["right"], n)
        print(
            f"{v['variant']:<28} {v['right']:>6} {f'[{lo:.1%}, {hi:.1%}]':>16} {v['only_program_right']:>9} "
            f"{v['only_variant_right']:>8} {v['mcnemar_p']:>6.3f} {v['changed_answers']:>7}"
        )
    print(f"written to {out}")


if __name__ == "__main__":
    main()
