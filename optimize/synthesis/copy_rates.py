"""How much a domain's hand-written questions copy from their evidence passages: the measurement
behind :data:`~.rules.MAX_COPIED_SHARE`.

    python -m optimize.synthesis.copy_rates --domain-dir data/default
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from crag_dspy.domain import Domain, load_domain

from .candidates import source_passages
from .rules import MAX_COPIED_SHARE, copied_share, question_key

__all__ = ["copy_rates", "main"]


def copy_rates(domain: Domain) -> list[float]:
    """:func:`~.rules.copied_share` of each answerable question with evidence, against the passage
    holding its first evidence quote (skipped when no passage holds it whole)."""
    passages = [p for side in source_passages(domain).values() for p in side]
    rates = []
    for q in domain.qa:
        evidence = getattr(q, "evidence", None) or []
        if q.kind == "none" or q.source == "synthetic" or not evidence:
            continue
        quote = question_key(evidence[0]["quote"])
        holder = next(
            (p for p in passages if p.doc_id == evidence[0]["doc_id"] and quote in question_key(p.text)), None
        )
        if holder is not None:
            rates.append(copied_share(q.question, holder.text))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimize.synthesis.copy_rates", description=__doc__)
    parser.add_argument("--domain-dir", type=Path, required=True)
    rates = sorted(copy_rates(load_domain(parser.parse_args(argv).domain_dir)))
    if not rates:
        print("no hand-written questions with evidence quotes found in their passages")
        return 1
    over = sum(r > MAX_COPIED_SHARE for r in rates)
    print(
        f"{len(rates)} questions: median {statistics.median(rates):.2f}, "
        f"90th percentile {rates[int(0.9 * (len(rates) - 1))]:.2f}, max {rates[-1]:.2f}; "
        f"{over} ({over / len(rates):.0%}) over the cut {MAX_COPIED_SHARE}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
