"""Does the grader's excerpt show the answer? Sentence choice measured without an LM.

The grader reads a passage's title and the sentence(s) that best match the question
(``crag_dspy.focus``). For every positive relevance pair whose passage holds a gold answer of its
question (qa.jsonl / relevance_questions.jsonl) in its text, this counts how often the excerpt still
holds it, for each ``--term-weights`` value (0 = embedding similarity alone), with the question's words
matched exactly and, for weights above 0, by their stems (columns "w=1 stems"; the default). Passages
short enough to be shown whole are left out: no choice is made for them.

    python benchmarks/excerpt_recall.py [--domain-dir data/default] [--term-weights 0 0.5 1 2]
        [--grade-sentences 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from crag_dspy.domain import load_domain
from crag_dspy.embeddings import Embedder
from crag_dspy.focus import focus_document
from crag_dspy.strips import split_sentences
from optimize.datasets import answers_by_question
from optimize.metrics import contains_answer


def excerpt_recall(domain_dir: Path, weights: list[float], sentences: int) -> dict:
    domain = load_domain(domain_dir)
    aliases = answers_by_question(domain)
    embedder = Embedder()
    results: dict = {"domain": domain.name, "grade_sentences": sentences, "splits": {}}
    for split in ("train", "val"):
        pairs = [
            p
            for p in domain.relevance
            if p.split == split
            and p.label
            and contains_answer(p.passage.partition("\n")[2], aliases.get(p.question, []))
            and len(split_sentences(p.passage.partition("\n")[2])) > sentences
        ]
        choices = [(weight, False) for weight in weights] + [(w, True) for w in weights if w > 0]
        shown = {
            f"{weight:g}" + (" stems" if stems else ""): sum(
                contains_answer(
                    focus_document(p.passage, p.question, embedder.encode, sentences, weight, stems),
                    aliases[p.question],
                )
                for p in pairs
            )
            for weight, stems in choices
        }
        results["splits"][split] = {"pairs": len(pairs), "answer_shown": shown}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain-dir", type=Path, default=Path("data/default"))
    parser.add_argument("--term-weights", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--grade-sentences", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = excerpt_recall(args.domain_dir, args.term_weights, args.grade_sentences)
    print(f"domain {results['domain']}: positive pairs whose excerpt shows a gold answer")
    print(
        f"{'split':<6} {'pairs':>5} "
        + " ".join(f"{'w=' + w:>10}" for w in results["splits"]["val"]["answer_shown"])
    )
    for split, row in results["splits"].items():
        counts = " ".join(f"{n / row['pairs']:10.1%}" for n in row["answer_shown"].values())
        print(f"{split:<6} {row['pairs']:>5} {counts}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
