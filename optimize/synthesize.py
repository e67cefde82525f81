"""``python -m optimize.synthesize``: labelled questions and relevance pairs for a domain that has only
documents, written by the LM from the domain's own passages (docs/synthesize.md).

    python -m optimize.synthesize --domain-dir DIR                  # candidates -> DIR/synthetic/review.csv
    python -m optimize.synthesize --domain-dir DIR --apply-review   # accepted rows -> qa/relevance.jsonl
    python -m optimize.synthesize --domain-dir DIR --accept-all     # both at once, for automation

Each sampled passage gets one question it answers with a short gold answer found in it; some
questions the knowledge base cannot answer come from web.jsonl (or are marked "I don't know").
Rules reject copied, unanswerable-by-their-passage, duplicate and malformed questions; each
accepted question's passage is a positive relevance pair, and the store's top-ranked passages
without its answer are hard negatives. Splits are by source document. Reruns ask nothing twice and
never touch hand-written records.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from crag_dspy.app import open_backends
from crag_dspy.cli import (
    add_lm_arguments,
    add_storage_arguments,
    add_web_search_argument,
    command_prog,
    error_line,
    interruptible,
    settings_from_args,
    user_error_types,
)
from crag_dspy.domain import Domain, load_domain
from crag_dspy.faults import CRAGRunError, LMDownError, watch_lm
from crag_dspy.lm import build_lm
from crag_dspy.protocols import Retriever
from crag_dspy.redaction import configure_logging
from crag_dspy.settings import Settings

from .compile import at_least
from .synthesis.candidates import (
    WEB_POOL_FACTOR,
    Candidate,
    Generation,
    Kind,
    SourcePassage,
    doc_key,
    generate,
    passage_order,
    passages_to_try,
    source_passages,
)
from .synthesis.merge import MergeReport, merge_accepted
from .synthesis.review import (
    append_candidate,
    load_candidates,
    read_decisions,
    state_dir,
    write_candidates,
    write_review,
)
from .synthesis.rules import question_key
from .synthesis.splits import assign_splits

__all__ = [
    "UNANSWERABLE_SHARE",
    "SynthesisReport",
    "main",
    "plan_passages",
    "plan_targets",
    "synthesize",
]

log = logging.getLogger(__name__)

UNANSWERABLE_SHARE = 0.2
"""Share of the questions the knowledge base cannot answer (web-only, or "I don't know" without a
web.jsonl): the bundled default domain has 38% web and 7% unanswerable questions."""


@dataclass
class SynthesisReport:
    """What a run did: candidates made (by kind, by rejection reason), failures, and the merges."""

    root: Path
    candidates: list[Candidate] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    total: int = 0  # candidates in the state, old and new
    accepted: int = 0  # of them, accepted by the review (or the rules)
    merges: list[MergeReport] = field(default_factory=list)

    def lines(self) -> list[str]:
        new = self.candidates
        out = [f"{len(new)} new candidate(s) ({self.total} in {state_dir(self.root)}/candidates.jsonl)"]
        for kind, n in sorted(Counter(c.kind for c in new).items()):
            kept = sum(c.passed and c.kind == kind for c in new)
            out.append(f"  {kind}: {n} asked, {kept} passed the rules")
        for reason, n in Counter(c.reason.value for c in new if c.reason).most_common():
            out.append(f"  rejected, {reason}: {n}")
        if self.failed:
            out.append(
                f"  {len(self.failed)} LM call(s) failed (a rerun retries them); first: {self.failed[0]}"
            )
        out.append(
            f"{self.accepted} of {self.total} candidates accepted in {state_dir(self.root)}/review.csv"
        )
        out += [str(m) for m in self.merges]
        return out


def plan_targets(questions: int, has_web: bool) -> dict[Kind, int]:
    """How many questions of each kind ``--questions`` asks for."""
    unanswerable = round(questions * UNANSWERABLE_SHARE)
    return {"kb": questions - unanswerable, ("web" if has_web else "none"): unanswerable}


def plan_passages(
    passages: Mapping[str, Sequence[SourcePassage]],
    existing: Sequence[Candidate],
    wanted: Mapping[Kind, int],
    seed: int,
) -> tuple[dict[Kind, int], dict[Kind, list[SourcePassage]]]:
    """How many questions of each kind are still missing (``wanted`` minus the candidates that passed
    the rules), and the passages to try for them, in order: never one tried already, at most
    :func:`~.synthesis.candidates.passages_to_try` for the missing questions (for web questions a pool
    :data:`WEB_POOL_FACTOR` times larger, from which :func:`generate` picks the least covered)."""
    tried = {(c.kind, c.passage_id) for c in existing}
    targets: dict[Kind, int] = {}
    plan: dict[Kind, list[SourcePassage]] = {}
    for kind, n in wanted.items():
        targets[kind] = max(n - sum(c.passed and c.kind == kind for c in existing), 0)
        # Unanswerable questions take the knowledge-base passages in another order than answerable ones.
        order = passage_order(passages["web" if kind == "web" else "kb"], seed + (kind == "none"))
        untried = [p for p in order if (kind, p.id) not in tried]
        pool = WEB_POOL_FACTOR if kind == "web" else 1
        plan[kind] = untried[: passages_to_try(targets[kind]) * pool]
    return targets, plan


def _accepted(candidates: list[Candidate], decisions: Mapping[str, str]) -> list[Candidate]:
    """The candidates accepted by the review file, or (rows it does not have yet) by the rules."""
    return [c for c in candidates if decisions.get(c.id, "accept" if c.passed else "reject") == "accept"]


def _splits(passages, existing: list[Candidate], seed: int) -> dict[str, str]:
    """Every document's split. Documents with the same title (one subject: a person's several
    passages, or namesakes) share a split, so that a question's hardest negatives, passages on its
    subject without its answer, are in its own split and the grader learns from them. Documents that
    fed candidates already keep their split."""
    fixed = {doc_key("web" if c.kind == "web" else "kb", c.doc_id): c.split for c in existing}
    split_of: dict[str, str] = {}
    for side in ("kb", "web"):
        subject_of = {p.doc_key: f"{side}:{p.title.strip().casefold()}" for p in passages[side]}
        fixed_subjects: dict[str, str] = {}
        for key, split in fixed.items():
            if key in subject_of:
                fixed_subjects.setdefault(subject_of[key], split)
        subjects = assign_splits(sorted(set(subject_of.values())), seed, fixed_subjects)
        split_of.update({key: fixed.get(key, subjects[subject]) for key, subject in subject_of.items()})
    return split_of


def synthesize(
    settings: Settings,
    *,
    questions: int = 50,
    seed: int = 0,
    accept_all: bool = False,
    apply_review: bool = False,
    lm: dspy.BaseLM | None = None,
    retrievers: Callable[[Domain], Mapping[str, Retriever]] | None = None,
    progress: bool = True,
) -> SynthesisReport:
    """Synthesize up to ``questions`` questions for the domain of ``settings`` (see the module doc).

    With ``apply_review`` nothing is generated: the accepted rows of the review file are merged. With
    ``accept_all`` the candidates that pass the rules are merged right away. ``lm`` defaults to the one
    ``settings`` name, built only when there is something to ask; ``retrievers`` (the store's "kb" and
    "web" retrievers of a domain) default to the domain's Chroma collections, ingested if needed.
    """
    domain = load_domain(settings.resolved_domain_dir)
    root = domain.root
    existing = load_candidates(root)
    decisions = read_decisions(root)  # a malformed review file fails before any work
    report = SynthesisReport(root)
    if not apply_review:
        passages = source_passages(domain)
        split_of = _splits(passages, existing, seed)
        targets, plan = plan_passages(passages, existing, plan_targets(questions, bool(domain.web)), seed)
        # Synthetic records in the files are candidates' (the merge writes them from candidates only).
        hand_written = [r for r in [*domain.qa, *domain.relevance] if r.source != "synthetic"]
        seen = {question_key(r.question) for r in hand_written}
        seen |= {question_key(c.question) for c in existing if c.passed}

        def open_store() -> Mapping[str, Retriever]:
            if retrievers is not None:
                return retrievers(domain)
            backends = open_backends(settings, progress=progress, domain=domain)
            return {
                "kb": backends.retriever("kb"),
                **({"web": backends.retriever("web")} if domain.web else {}),
            }

        generation = Generation()
        try:
            if any(targets[k] and plan[k] for k in plan):
                model = lm or build_lm(settings)
                with dspy.context(lm=model), watch_lm():
                    generate(
                        plan,
                        targets,
                        passages=passages,
                        split_of=split_of,
                        retrievers=open_store,
                        seen=seen,
                        seed=seed,
                        progress=progress,
                        out=generation,
                        on_candidate=lambda candidate: append_candidate(root, candidate),
                    )
        finally:  # what was asked before an error is kept: a rerun does not ask it again
            existing = [*existing, *generation.candidates]
            write_candidates(root, existing)
            write_review(root, existing, decisions)
        report.candidates, report.failed = generation.candidates, generation.failed
    accepted = _accepted(existing, decisions)
    report.total, report.accepted = len(existing), len(accepted)
    if accept_all or apply_review:
        report.merges = merge_accepted(root, accepted)
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_prog("synthesize", "optimize.synthesize"),
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="docs/synthesize.md: the rules, the review file, and ingest -> synthesize -> compile.",
    )
    add_storage_arguments(parser)
    add_lm_arguments(parser)
    add_web_search_argument(parser)
    parser.add_argument(
        "--questions",
        type=at_least(1),
        default=50,
        metavar="N",
        help=f"questions wanted in all, {UNANSWERABLE_SHARE:.0%}% of them ones the knowledge base cannot "
        "answer (default 50); a rerun asks only for the ones still missing",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--accept-all",
        action="store_true",
        help="merge every candidate that passes the rules (and the review file's decisions) into "
        "qa.jsonl and relevance.jsonl right away, without a person's review",
    )
    mode.add_argument(
        "--apply-review",
        action="store_true",
        help="ask nothing: merge the rows accepted in synthetic/review.csv into qa.jsonl and relevance.jsonl",
    )
    parser.add_argument("--seed", type=int, default=0, help="passage sampling and document splits")
    return parser


@interruptible
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        settings = settings_from_args(args)
        report = synthesize(
            settings,
            questions=args.questions,
            seed=args.seed,
            accept_all=args.accept_all,
            apply_review=args.apply_review,
        )
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except (CRAGRunError, LMDownError) as exc:
        print(f"{error_line(exc)} (what was made so far is kept; rerun to go on)", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    if not (args.accept_all or args.apply_review):
        print(
            f"next: review {state_dir(report.root)}/review.csv (decision: accept or reject), then "
            f"python -m optimize.synthesize --domain-dir {report.root} --apply-review"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
