"""Measure how the grader should ask and read its answer, on a domain's labelled relevance pairs.

Compares, on the same pairs and model, before any compilation:
  - chat  : DSPy's default ChatAdapter, bool output; accuracy of the parsed label, and of P(yes) from logprobs
  - label : crag-dspy's LabelAdapter (one-word answer); parsed label and P(yes) from logprobs
  - cosine: all-MiniLM-L6-v2 question/passage cosine similarity (no LM), AUC only
and prints accuracy / precision / recall / AUC, seconds per call and generated tokens.

    python benchmarks/grader_formats.py --split val [--limit N] [--variants label chat] [--lm embedded]
        [--embedded-model qwen2.5-coder-0.5b-instruct] [--instructions FILE] [--grade-sentences N]
        [--term-weight W] [--program runs/default/program.json]

``--instructions`` replaces the grader's instruction (the signature's docstring) with a file's text, to
compare wordings on the same pairs; ``--embedded-model`` grades with the other embedded model;
``--grade-sentences N`` shows the grader each passage's title and its N sentences most similar to the
question (CRAG's default is 1; 0, the default here, shows whole passages), chosen with the question's
words weighted by ``--term-weight`` (crag_dspy/focus.py; 0 ranks by similarity alone). ``--program`` grades with a
compiled program's grader (its demos, instructions, calibration and sentence focus) and prints, from the
same LM answers, the uncompiled reading (the model's own P(yes)) next to the compiled score.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dspy
import numpy as np
from tqdm.auto import tqdm

from crag_dspy.domain import load_domain
from crag_dspy.embeddings import Embedder
from crag_dspy.focus import DEFAULT_TERM_WEIGHT, SentenceFocus
from crag_dspy.judging import BinaryJudge
from crag_dspy.lm import build_lm, lm_identity
from crag_dspy.program import read_program
from crag_dspy.settings import Settings
from crag_dspy.trace import usage_from_tracker
from optimize.metrics import binary_report
from signatures import GradeDocument


def run_variant(
    adapter: str,
    pairs,
    lm,
    signature: type[dspy.Signature] = GradeDocument,
    view: SentenceFocus | None = None,
    judge_state: dict | None = None,
) -> dict:
    judge = BinaryJudge(signature, adapter=adapter, use_logprobs=True, retries=1, view=view)
    if judge_state is not None:
        judge.load_state(judge_state)
    scores, raw, labels = [], [], []
    started = time.perf_counter()
    with dspy.context(lm=lm), dspy.track_usage() as usage:
        for pair in tqdm(pairs, desc=f"grader[{adapter}]"):
            j = judge(question=pair.question, document=pair.passage).judgement
            scores.append(j.score)
            raw.append(j.raw_score if j.score_source == "logprobs" else j.score)
            labels.append(None if j.label is None else float(j.label))
    elapsed = time.perf_counter() - started
    counted = usage_from_tracker(usage)
    gold = [p.label for p in pairs]
    return {
        "variant": adapter,
        "logprob_score": binary_report(scores, gold).as_dict(),
        # The model's own P(yes) from the same answers: the uncompiled reading of a compiled grader.
        "raw_p_yes": binary_report(raw, gold).as_dict(),
        "parsed_label": binary_report(labels, gold).as_dict(),
        "seconds_per_pair": elapsed / len(pairs),
        "lm_calls": counted.calls,
        "completion_tokens_per_call": counted.completion_tokens / max(counted.calls, 1),
        "score_sources": {
            s: sum(1 for x in scores if (x is None) == (s == "error")) for s in ("ok", "error")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain-dir", type=Path, default=Path("data/default"))
    parser.add_argument("--split", default="val")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--variants", nargs="+", default=["label", "chat"])
    parser.add_argument("--lm", default=None)
    parser.add_argument("--embedded-model", default=None, help="with the embedded LM: which model grades")
    parser.add_argument(
        "--instructions", type=Path, help="a file whose text replaces the grader's instruction"
    )
    parser.add_argument(
        "--grade-sentences",
        type=int,
        default=0,
        help="show the title and this many most question-similar sentences (0: whole passages)",
    )
    parser.add_argument(
        "--term-weight",
        type=float,
        default=None,
        help="weight of the question's words in choosing those sentences "
        f"(default {DEFAULT_TERM_WEIGHT:g}; with --program, the program's)",
    )
    parser.add_argument(
        "--program", type=Path, help="grade with this compiled program's grader (state and sentence focus)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    overrides = {"lm": args.lm, "embedded_model": args.embedded_model}
    settings = Settings(**{key: value for key, value in overrides.items() if value})
    signature = GradeDocument
    if args.instructions:
        signature = GradeDocument.with_instructions(args.instructions.read_text().strip())
    domain = load_domain(args.domain_dir)
    # Grouped by question so consecutive calls share the cached prompt prefix, as in a real CRAG query.
    pairs = sorted((p for p in domain.relevance if p.split == args.split), key=lambda p: p.question)[
        : args.limit
    ]
    print(
        f"{len(pairs)} {args.split} pairs ({sum(p.label for p in pairs)} positive), LM {lm_identity(settings)}"
    )

    embedder = Embedder()
    q = np.asarray(embedder.encode([p.question for p in pairs]))
    d = np.asarray(embedder.encode([p.passage for p in pairs]))
    cosine = binary_report(list((q * d).sum(axis=1)), [p.label for p in pairs]).roc_auc
    results = {
        "pairs": len(pairs),
        "split": args.split,
        "lm": lm_identity(settings),
        "cosine_auc": cosine,
        "instructions": signature.instructions,
        "grade_sentences": args.grade_sentences,
        "variants": [],
    }
    judge_state, grade_sentences = None, args.grade_sentences
    term_weight, term_stems = DEFAULT_TERM_WEIGHT, True
    if args.program:
        program = read_program(args.program)
        state = program["state"]
        judge_state = {name: state[f"grader.{name}"] for name in ("predict", "calibration")}
        signature = GradeDocument.with_instructions(state["grader.predict"]["signature"]["instructions"])
        grade_sentences = program["config"].get("grade_sentences", 0)
        term_weight = program["config"].get("grade_term_weight", 0.0)
        term_stems = program["config"].get("grade_term_stems", False)
        results.update(program=str(args.program), grade_sentences=grade_sentences)
    if args.term_weight is not None:
        term_weight = args.term_weight
    results["grade_term_weight"], results["grade_term_stems"] = term_weight, term_stems
    view = SentenceFocus(grade_sentences, embedder, term_weight, term_stems) if grade_sentences else None
    lm = build_lm(settings, cache=False)  # measure real calls, not cache hits
    for variant in args.variants:
        results["variants"].append(run_variant(variant, pairs, lm, signature, view, judge_state))

    print(f"\ncosine similarity baseline: AUC {cosine:.3f}")
    print(
        f"{'variant':<8} {'read as':<9} {'acc':>6} {'prec':>6} {'rec':>6} {'AUC':>6} {'unk':>4} {'s/pair':>7} {'out tok':>7}"
    )
    for r in results["variants"]:
        readings = [("parsed_label", "label"), ("logprob_score", "P(yes)")]
        if judge_state is not None:
            readings = [("parsed_label", "label"), ("raw_p_yes", "P(yes)"), ("logprob_score", "compiled")]
        for key, name in readings:
            m = r[key]
            auc = "-" if m["roc_auc"] is None else f"{m['roc_auc']:.3f}"
            print(
                f"{r['variant']:<8} {name:<9} {m['accuracy']:6.3f} {m['precision']:6.3f} {m['recall']:6.3f} {auc:>6} "
                f"{m['unknown']:4d} {r['seconds_per_pair']:7.2f} {r['completion_tokens_per_call']:7.1f}"
            )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
