"""The answerer's input order: the context before the question (today's) against the question first,
on the same contexts, in one run.

    python benchmarks/answer_order.py --split val
    python benchmarks/answer_order.py --split val --domain-dir ../shared/data/popqa-dev
    python benchmarks/answer_order.py --program default --split test

Each question of the split (``--limit`` of them taken evenly across kinds) runs through CRAG (the
program, or without ``--program`` the uncompiled default) and is answered as CRAG answers it; its
refined context is then answered again with the answerer's inputs in the other order (same
instructions, same demos, same clean-up and unit rule). The answer feeds nothing back, so the two
answers differ only by the order. Reports each order's accuracy (Wilson 95% intervals), the questions
only one order answers right, the exact McNemar p, how often each says "I don't know", and how many
unanswerable questions each rightly declines. DSPy's cache is on (``--no-cache`` for cold calls): a
rerun costs only what changed.

Writes benchmarks/results/answer_order_<domain>_<split>.json.
"""

from __future__ import annotations

from typing import Any

import dspy
import harness
from tqdm.auto import tqdm

from crag_dspy import CRAG
from crag_dspy.stages import UNKNOWN_ANSWER, Answer
from optimize.datasets import qa_split
from optimize.metrics import answer_matches, is_answerable, mcnemar_exact

SCRIPT = "answer_order"
ORDERS = ("context_first", "question_first")


def question_first(signature: type[dspy.Signature]) -> type[dspy.Signature]:
    """``signature`` with its ``question`` input moved before the other inputs."""
    fields = signature.fields
    order = ["question", *(n for n in signature.input_fields if n != "question"), *signature.output_fields]
    return dspy.Signature({n: (fields[n].annotation, fields[n]) for n in order}, signature.instructions)


def question_first_crag(crag: CRAG) -> CRAG:
    """A copy of ``crag`` whose answerer (instructions, demos) takes the question first."""
    other = crag.deepcopy()
    other.answerer.signature = question_first(crag.answerer.signature)
    return other


def answer_other_way(other: CRAG, question: str, context: str) -> str:
    """``other``'s answer to ``context`` by CRAG's own answer step: the empty-context rule, retries,
    clean-up and unit rule are the ones the context-first answer went through."""
    run = other.new_run(question)
    with other.lm_scope(run.trace):
        return Answer(other, run)(question=question, context=context, unjudged=0).answer


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    right = {order: [r[order]["correct"] for r in rows] for order in ORDERS}
    unanswerable = [r for r in rows if not r["answerable"]]
    summary: dict[str, Any] = {}
    for order in ORDERS:
        summary[order] = {
            "accuracy": harness.rate(sum(right[order]), len(rows)),
            "dont_know": sum(r[order]["answer"] == UNKNOWN_ANSWER for r in rows),
            "unanswerable_declined": harness.rate(
                sum(r[order]["correct"] for r in unanswerable), len(unanswerable)
            ),
        }
    summary["only_context_first"] = sum(a and not b for a, b in zip(*right.values()))
    summary["only_question_first"] = sum(b and not a for a, b in zip(*right.values()))
    summary["mcnemar_p"] = mcnemar_exact(right["context_first"], right["question_first"])
    return summary


def report(results: dict[str, Any]) -> None:
    s = results["summary"]
    print(f"{results['domain']} / {results['split']}: {results['questions']} questions")
    for order in ORDERS:
        o = s[order]
        print(
            f"  {order:15s} {harness.fmt_rate(o['accuracy'])}; I don't know {o['dont_know']}; "
            f"unanswerable declined {o['unanswerable_declined']['k']} of {o['unanswerable_declined']['n']}"
        )
    print(
        f"  only context first right: {s['only_context_first']}, only question first right: "
        f"{s['only_question_first']}, exact McNemar p = {s['mcnemar_p']:.4f}"
    )


def main(argv: list[str] | None = None, *, lm: dspy.BaseLM | None = None) -> int:
    p = harness.parser(__doc__, program=True)
    p.add_argument("--split", default="val", help="QA split (default val)")
    p.add_argument("--limit", type=int, help="N questions of the split, taken evenly across kinds")
    args = harness.parse(p, argv)
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    document = harness.read_document(args.program)
    settings = harness.settings_for(args, document)
    lm = harness.lm_for(settings, args, lm)
    crag, domain = harness.open_crag(settings, lm, document, args.program)
    if list(crag.answerer.signature.input_fields) != ["context", "question"]:
        p.error("this benchmark compares the context-first answerer with the question-first one")
    questions = qa_split(domain, args.split, args.limit)
    if not questions:
        p.error(f"domain `{domain.name}` has no {args.split} questions")
    other_way = question_first_crag(crag)
    rows = []
    for q in tqdm(questions, desc="questions"):
        prediction = crag(question=q.question)
        context = prediction.trace.context or ""
        other = answer_other_way(other_way, q.question, context)
        rows.append(
            {
                "id": q.id,
                "kind": q.kind,
                "answerable": is_answerable(q.answers),
                "action": prediction.action,
                "context_first": {
                    "answer": prediction.answer,
                    "correct": answer_matches(prediction.answer, q.answers),
                },
                "question_first": {"answer": other, "correct": answer_matches(other, q.answers)},
            }
        )
    results = {
        "domain": domain.name,
        "split": args.split,
        "questions": len(rows),
        "program": str(args.program) if args.program else None,
        "summary": summarize(rows),
        "rows": rows,
    }
    report(results)
    harness.write_result(
        harness.result_path(args, SCRIPT, f"{domain.name}_{args.split}"), SCRIPT, argv, results, lm=lm
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
