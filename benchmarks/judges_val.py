"""Both judges of a compiled program on a whole labelled split, next to the uncompiled program's.

The compile measures its judges on samples of the val split (``--judge-val-limit``, 80 examples by
default) to keep a cold compile short; this runs the compiled grader (through the program's grade
source: LLM judge, trained evaluator or both fused) and strip filter and the uncompiled ones (the
program's configuration, zero-shot, the model's own P(yes) >= 0.5) on every relevance pair and strip
of a split, and prints accuracy (Wilson 95% interval), precision, recall and ROC AUC (bootstrap over
questions). When the program's judges kept the uncompiled prompt (no demos, the same instruction and
excerpt), both read the same LM answers, so the uncompiled side costs no LM calls (DSPy cache).

    python benchmarks/judges_val.py --program runs/default/program.json [--split val] [--out FILE]

The domain is the program's own (``--domain-dir`` for one outside ``data/``); ``--lm`` as in the CLI.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import dspy

from crag_dspy.domain import Domain, load_domain
from crag_dspy.embeddings import Embedder
from crag_dspy.lm import build_lm
from crag_dspy.module import CRAG
from crag_dspy.program import apply_program, read_program
from crag_dspy.settings import Settings
from optimize.datasets import relevance_examples, strip_examples
from optimize.evaluation import judge_scores
from optimize.grade_source import measured, program_grades
from optimize.metrics import mcnemar_exact


class _NoBackend:
    """Judges never retrieve or search: any call here is a bug in this benchmark."""

    def retrieve(self, query: str, k: int):
        raise RuntimeError("judges_val.py does not retrieve")

    def search(self, query: str, max_results: int):
        raise RuntimeError("judges_val.py does not search the web")


def judges_on_split(
    document: dict[str, Any],
    domain: Domain,
    lm: dspy.BaseLM,
    split: str = "val",
    *,
    program_dir: Path | None = None,
    judges: tuple[str, ...] = ("grader", "strip_filter"),
    progress: bool = True,
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{judge: {"uncompiled": metrics, "compiled": metrics}}`` for the grader and the strip filter of
    the program ``document`` (as read by :func:`~crag_dspy.program.read_program`, from ``program_dir``)
    on ``split``; metrics as :func:`optimize.grade_source.measured` gives them."""
    compiled = apply_program(CRAG(_NoBackend(), _NoBackend(), lm=lm), document, program_dir)
    # The program's configuration (excerpt length, adapters) with a fresh module's state: what the
    # compile measured as "uncompiled" before fitting anything.
    fresh = CRAG(_NoBackend(), _NoBackend(), lm=lm)
    uncompiled = apply_program(fresh, {**document, "state": fresh.dump_state(json_mode=True)})
    examples = {
        "grader": (relevance_examples(domain.relevance, split), "relevant"),
        "strip_filter": (strip_examples(domain, split, compiled.sentences_per_strip), "keep"),
    }
    examples = {judge: examples[judge] for judge in judges}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    embedder = Embedder()
    with dspy.context(lm=lm):
        for judge, (exs, label) in examples.items():
            gold = [int(bool(e[label])) for e in exs]
            right: dict[str, list[bool]] = {}
            for name, crag in (("uncompiled", uncompiled), ("compiled", compiled)):
                if judge == "grader":
                    scores = program_grades(crag, exs, embedder, progress=progress)
                else:
                    scores = judge_scores(crag.strip_filter, exs, desc=f"{judge} ({name})", progress=progress)
                results.setdefault(judge, {})[name] = measured(scores, gold, [e.question for e in exs])
                right[name] = [s is not None and (s >= 0.5) == bool(g) for s, g in zip(scores, gold)]
            # Paired: the same examples judged by both programs.
            results[judge]["compiled"]["mcnemar_p"] = mcnemar_exact(right["compiled"], right["uncompiled"])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", type=Path, required=True, help="a compiled program JSON")
    parser.add_argument("--split", default="val")
    parser.add_argument(
        "--domain-dir", type=Path, help="the program's domain directory (default: data/<its domain>)"
    )
    parser.add_argument("--lm", help="LM as in the CLI (default: the embedded model)")
    parser.add_argument(
        "--judges",
        default="grader,strip_filter",
        help="comma-separated: grader, strip_filter (default: both)",
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)

    document = read_program(args.program)
    overrides = {"lm": args.lm} if args.lm else {}
    settings = Settings(domain=document["metadata"]["domain"], domain_dir=args.domain_dir, **overrides)
    domain = load_domain(settings.resolved_domain_dir)
    results = judges_on_split(
        document,
        domain,
        build_lm(settings, cache=True),
        args.split,
        program_dir=args.program.parent,
        judges=tuple(j.strip() for j in args.judges.split(",") if j.strip()),
    )
    print(f"{args.program} on the {args.split} split of domain `{domain.name}`")
    grading = document["state"].get("grading", {}).get("mode", "llm")
    print(f"grade source: {grading}; 95% intervals: Wilson (accuracy), bootstrap over questions (ROC AUC)")
    print(
        f"{'judge':<14} {'program':<11} {'n':>4} {'accuracy [95% CI]':>24} {'precision':>10} {'recall':>7} {'ROC AUC [95% CI]':>26} failed"
    )
    for judge, reports in results.items():
        for name, r in reports.items():
            low, high = r["accuracy_ci"]
            acc = f"{r['accuracy']:.1%} [{low:.1%}, {high:.1%}]"
            auc = "-" if r["roc_auc"] is None else f"{r['roc_auc']:.3f}"
            if r["roc_auc_ci"]:
                auc += f" [{r['roc_auc_ci'][0]:.3f}, {r['roc_auc_ci'][1]:.3f}]"
            print(
                f"{judge:<14} {name:<11} {r['n']:>4} {acc:>24} {r['precision']:>10.1%} "
                f"{r['recall']:>7.1%} {auc:>26} {r['unknown']:>6}"
            )
        p = reports["compiled"]["mcnemar_p"]
        verdict = "a difference" if p < 0.05 else "no measured difference"
        print(f"{judge}: compiled vs uncompiled, exact McNemar p = {p:.4f} ({verdict})")
    if args.out:
        payload = {"program": str(args.program), "split": args.split, "grade_source": grading}
        payload |= results
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
