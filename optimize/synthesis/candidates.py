"""Generate candidate questions from a domain's passages with the LM, judge them by the rules, and find
their relevance negatives in the store.

A candidate is one question the LM wrote about a passage (it writes three in one reply): the question
(and gold answer), the rule that rejected it if any (:mod:`.rules`), its split (its document's, :mod:`.splits`) and, for an answerable
question, the passages its relevance pairs use. Candidates are kept in ``synthetic/candidates.jsonl``:
a passage tried once is never asked about again, so a rerun only fills what is missing.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import dspy
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel, ConfigDict
from tqdm.auto import tqdm

from crag_dspy.adapters import ListAdapter
from crag_dspy.domain import CorpusDoc, Domain
from crag_dspy.faults import describe_error, raise_if_lm_down
from crag_dspy.protocols import Passage, Retriever
from crag_dspy.store import planned_chunks
from signatures import WriteQuestions, WriteUnanswerableQuestions

from .rules import Reason, answer_in, copied_share, question_key, reject_reason

__all__ = [
    "ATTEMPTS_PER_QUESTION",
    "HARD_NEGATIVE_POOL",
    "KB_CHECK_DEPTH",
    "MAX_TOKENS",
    "QUESTIONS_PER_PASSAGE",
    "WEB_POOL_FACTOR",
    "Candidate",
    "Generation",
    "Kind",
    "Negative",
    "SourcePassage",
    "doc_key",
    "generate",
    "least_covered_first",
    "passage_order",
    "passages_to_try",
    "question_writers",
    "source_passages",
]

log = logging.getLogger(__name__)

Kind = Literal["kb", "web", "none"]
"""kb: answered by a knowledge-base passage; web: answered only by a web.jsonl passage; none: not
answerable from the domain (gold "I don't know") -- the same kinds as the bundled qa.jsonl."""
HARD_NEGATIVE_POOL = 10
"""Passages retrieved per question to find hard negatives among (top-ranked ones without the answer)."""
KB_CHECK_DEPTH = 5
"""Knowledge-base passages retrieved for a web question: its answer in one of them means it is not
web-only (the program would find it internally)."""
QUESTIONS_PER_PASSAGE = 3
"""Questions the LM writes per passage, in one reply (what the writers' signatures ask for; more lines
are not read). The passage is read (prefilled) once for all of them: on the embedded model, three
questions in one call took 2.4 s each against 3.2 s asked one by one (the same 7 popqa-dev passages),
and the later questions of a reply ask for other facts than the subject's name, which the first one
often asks for (docs/synthesize.md)."""
ATTEMPTS_PER_QUESTION = 3
"""Questions written at most per question still wanted: the rules reject some, but a model whose
replies all fail must not be asked about every passage of a large corpus."""
WEB_POOL_FACTOR = 4
"""Web passages looked at per attempt: the pool is ranked by how little the knowledge base covers each
one (:func:`least_covered_first`), and the attempts go to the least covered."""
EASY_NEGATIVE_SHARE = 0.5
"""Share of questions that also get one easy negative (a random passage of another document), so that
the grader sees both kinds of "no" while positives stay close to half of the pairs."""


@dataclass(frozen=True)
class SourcePassage:
    """A passage as the store indexes it: ``text`` is what the grader reads (title, newline, chunk)."""

    id: str
    side: Literal["kb", "web"]
    doc_id: str
    text: str

    @property
    def doc_key(self) -> str:
        return doc_key(self.side, self.doc_id)

    @property
    def title(self) -> str:
        return self.text.split("\n", 1)[0]


def doc_key(side: str, doc_id: str) -> str:
    """A document's key across corpus and web (their ids may collide): ``kb:<id>`` or ``web:<id>``."""
    return f"{side}:{doc_id}"


def source_passages(domain: Domain) -> dict[str, list[SourcePassage]]:
    """The domain's passages by side ("kb", "web"), chunked exactly as the store chunks them."""

    def chunks(docs: Sequence[CorpusDoc], side: Literal["kb", "web"]) -> list[SourcePassage]:
        planned = planned_chunks(docs, domain.config.chunk_words)
        return [SourcePassage(cid, side, meta["doc_id"], text) for cid, (text, _, meta) in planned.items()]

    return {"kb": chunks(domain.corpus, "kb"), "web": chunks(domain.web, "web")}


def passage_order(passages: Sequence[SourcePassage], seed: int) -> list[SourcePassage]:
    """``passages`` one document at a time (documents and each document's passages in a seeded
    order), so that the first N questions come from as many documents (and splits) as possible."""
    rng = random.Random(seed)
    by_doc: dict[str, list[SourcePassage]] = {}
    for passage in passages:
        by_doc.setdefault(passage.doc_key, []).append(passage)
    docs = sorted(by_doc)
    rng.shuffle(docs)
    for doc in docs:
        rng.shuffle(by_doc[doc])
    out: list[SourcePassage] = []
    for depth in range(max((len(v) for v in by_doc.values()), default=0)):
        out.extend(by_doc[doc][depth] for doc in docs if depth < len(by_doc[doc]))
    return out


class Negative(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passage: str
    doc_id: str
    kind: Literal["hard", "easy"]


class Candidate(BaseModel):
    """One question the LM wrote about a passage (a line of ``synthetic/candidates.jsonl``)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Kind
    passage_id: str
    doc_id: str
    split: Literal["train", "val", "test"]
    passage: str
    question: str
    answer: str | None
    copied_share: float
    reason: Reason | None = None
    negatives: list[Negative] = []

    @property
    def passed(self) -> bool:
        return self.reason is None


def passages_to_try(questions: int) -> int:
    """Passages asked about at most for ``questions`` wanted: :data:`ATTEMPTS_PER_QUESTION` questions
    written per question wanted, :data:`QUESTIONS_PER_PASSAGE` to a passage."""
    return math.ceil(questions * ATTEMPTS_PER_QUESTION / QUESTIONS_PER_PASSAGE)


def candidate_id(kind: str, passage_id: str, index: int = 0) -> str:
    """A stable id: one candidate per kind, passage (the passage id hashes its document and text) and
    place in the LM's reply (the first keeps the id of a candidate made when a reply held one)."""
    key = f"{kind}\x00{passage_id}" + (f"\x00{index}" if index else "")
    return f"syn-{kind}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


@dataclass
class Generation:
    """What one generation run did: the new candidates, and the attempts that failed (not kept, so a
    rerun tries them again)."""

    candidates: list[Candidate] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


_SHOWN = (
    "Harbour Library\nThe Harbour Library opened in 1987 on Quay Street. It lends about 40,000 books a year "
    "and is run by a board of six volunteers, chaired by Mira Holt. Members may borrow up to eight items "
    "at a time, and a late return costs 20 cents a day."
)
SEPARATOR = " | "
"""Between a question and its answer on a reply's line."""
DEMOS = {
    "answerable": [
        dspy.Example(
            passage=_SHOWN,
            questions=[
                f"How many things can a Harbour Library member take home at once?{SEPARATOR}eight",
                f"Who leads the volunteers that run the Harbour Library?{SEPARATOR}Mira Holt",
                f"What does the Harbour Library charge for each day a book is late?{SEPARATOR}20 cents",
            ],
        )
    ],
    "none": [
        dspy.Example(
            passage=_SHOWN,
            questions=[
                "How much does a year of Harbour Library membership cost?",
                "Who designed the Harbour Library's building?",
                "How many paid staff work at the Harbour Library?",
            ],
        )
    ],
}
"""The worked example shown before every passage: a small model copies the passage's sentences and
answers in whole sentences without one (docs/synthesize.md). An invented passage, so no domain leaks
into another's questions; it comes first in the prompt, a prefix the LM's KV cache keeps."""


MAX_TOKENS = 160
"""Reply tokens for a passage's questions: three questions with their answers took 39-94 tokens on the
embedded model; a model that rambles on is cut off instead of writing the LM's default 512
tokens (a rule rejects what was cut)."""


def question_writers() -> dict[str, dspy.Predict]:
    """The predictors that write answerable ("answerable") and unanswerable ("none") questions."""
    writers = {
        "answerable": dspy.Predict(WriteQuestions, max_tokens=MAX_TOKENS),
        "none": dspy.Predict(WriteUnanswerableQuestions, max_tokens=MAX_TOKENS),
    }
    for name, writer in writers.items():
        writer.demos = list(DEMOS[name])
    return writers


Written = tuple[str, str | None]
"""A question the LM wrote and its answer: "" when the line has none, None for an unanswerable
question (its writer gives none)."""


def _ask(predictor: dspy.Predict, passage: str, answered: bool) -> list[Written] | Reason:
    """The LM's questions for ``passage`` (with their answers when ``answered``), in reply order (those
    it wrote: a reply may stop short), or :attr:`Reason.UNPARSED` when its reply has none (with DSPy's
    cache the same reply would come back: it is a verdict, not a failure)."""
    try:
        with dspy.context(adapter=ListAdapter()):
            reply = predictor(passage=passage)
    except AdapterParseError:
        return Reason.UNPARSED
    written: list[Written] = []
    for line in reply.questions[:QUESTIONS_PER_PASSAGE]:
        question, sep, answer = str(line).partition(SEPARATOR.strip())
        written.append((question.strip(), (answer.strip() if sep else "") if answered else None))
    return written


def least_covered_first(sources: Sequence[SourcePassage], kb: Retriever) -> list[SourcePassage]:
    """``sources`` (web passages) ordered by their similarity to the closest knowledge-base passage,
    lowest first (stable: ties keep their order).

    A web question is kept only when the knowledge base does not hold its answer, and a web passage on a
    subject the knowledge base already covers rarely gives one (on popqa-dev, 1 of 6 tried in document
    order passed). One store query per passage, no LM call, finds the ones worth asking about.
    """
    closest = {s.id: max((p.similarity for p in kb.retrieve(s.text, 1)), default=0.0) for s in sources}
    return sorted(sources, key=lambda s: closest[s.id])


def _negatives(
    source: SourcePassage,
    answer: str,
    retrieved: Iterable[Passage],
    pool: Sequence[SourcePassage],
    split_of: Mapping[str, str],
    rng: random.Random,
) -> list[Negative]:
    """One hard negative (the top retrieved passage of the same split, not the source, without the
    answer) and, for a share of questions, one easy one (a random passage of another document)."""
    split = split_of[source.doc_key]
    hard = next(
        (
            Negative(passage=f"{p.title}\n{p.text}", doc_id=p.doc_id, kind="hard")
            for p in retrieved
            if p.id != source.id
            and split_of.get(doc_key(source.side, p.doc_id)) == split
            and not answer_in(answer, f"{p.title}\n{p.text}")
        ),
        None,
    )
    negatives = [hard] if hard else []
    if rng.random() < EASY_NEGATIVE_SHARE:
        others = [
            p
            for p in pool
            if p.doc_id != source.doc_id
            and split_of.get(p.doc_key) == split
            and not answer_in(answer, p.text)
            and (hard is None or p.text != hard.passage)
        ]
        if others:
            easy = rng.choice(others)
            negatives.append(Negative(passage=easy.text, doc_id=easy.doc_id, kind="easy"))
    return negatives


def generate(
    plan: Mapping[Kind, Sequence[SourcePassage]],
    targets: Mapping[Kind, int],
    *,
    passages: Mapping[str, Sequence[SourcePassage]],
    split_of: Mapping[str, str],
    retrievers: Callable[[], Mapping[str, Retriever]],
    seen: Iterable[str],
    seed: int,
    progress: bool = True,
    out: Generation | None = None,
    on_candidate: Callable[[Candidate], None] | None = None,
) -> Generation:
    """Ask the LM (``dspy.settings.lm``) about the ``plan``'s passages of each kind, in order, until
    ``targets[kind]`` candidates of that kind passed the rules (or the passages run out).

    At most :func:`passages_to_try` passages are asked about; web passages
    are asked about least covered by the knowledge base first (:func:`least_covered_first`).

    ``retrievers`` opens the store (called once, only when there is something to ask): the "kb" and
    ("web" when the domain has one) retrievers that find hard negatives and check web questions
    against the knowledge base. ``seen`` holds the :func:`~.rules.question_key` of questions that
    exist already (hand-written or earlier candidates). Candidates are added to ``out`` as they come,
    so a caller can keep what was made before an error (an LM that went down) stopped the run, and
    passed to ``on_candidate`` (which can save each one at once, for a run that is killed).
    """
    out = out if out is not None else Generation()
    if not any(targets.get(kind, 0) > 0 and plan.get(kind) for kind in plan):
        return out
    stores = retrievers()
    seen = set(seen)
    writers = question_writers()
    for kind, sources in plan.items():
        wanted = targets.get(kind, 0)
        if wanted <= 0 or not sources:
            continue
        writer = writers["none" if kind == "none" else "answerable"]
        if kind == "web":
            sources = least_covered_first(sources, stores["kb"])
        sources = sources[: passages_to_try(wanted)]
        passed = 0
        bar = tqdm(sources, desc=f"synthesize {kind} questions", unit="passage", disable=not progress)
        for source in bar:
            if passed >= wanted:
                break
            raise_if_lm_down()  # a down LM stops the run; one failed call is that passage's loss
            try:
                reply = _ask(writer, source.text, answered=kind != "none")
            except Exception as exc:  # noqa: BLE001 - counted and retried by a rerun, never kept
                out.failed.append(f"{source.id}: {describe_error(exc)}")
                log.warning("questions for passage %s failed: %s", source.id, describe_error(exc))
                continue
            for index, written in enumerate([reply] if isinstance(reply, Reason) else reply):
                if passed >= wanted:
                    break  # the questions asked for are made: the reply's others are not kept
                candidate = _judge(kind, source, index, written, stores, passages, split_of, seen, seed)
                if candidate.passed:
                    passed += 1
                    seen.add(question_key(candidate.question))
                out.candidates.append(candidate)
                if on_candidate is not None:
                    on_candidate(candidate)
            bar.set_postfix(kept=passed)
        bar.close()
    raise_if_lm_down()
    return out


def _judge(
    kind: Kind,
    source: SourcePassage,
    index: int,
    reply: Written | Reason,
    stores: Mapping[str, Retriever],
    passages: Mapping[str, Sequence[SourcePassage]],
    split_of: Mapping[str, str],
    seen: set[str],
    seed: int,
) -> Candidate:
    """The candidate for ``reply`` (the ``index``-th question written for ``source``): rejected with the
    first rule it fails, else with its negatives."""
    cid = candidate_id(kind, source.id, index)
    base = {
        "id": cid,
        "kind": kind,
        "passage_id": source.id,
        "doc_id": source.doc_id,
        "split": split_of[source.doc_key],
        "passage": source.text,
    }
    if isinstance(reply, Reason):
        return Candidate(**base, question="", answer=None, copied_share=0.0, reason=reply)
    question, answer = reply
    in_kb = []
    if kind == "web" and answer and question:
        in_kb = [f"{p.title}\n{p.text}" for p in stores["kb"].retrieve(question, KB_CHECK_DEPTH)]
    reason = reject_reason(question, answer, source.text, seen, in_kb)
    candidate = Candidate(
        **base,
        question=question,
        answer=answer,
        copied_share=round(copied_share(question, source.text), 3),
        reason=reason,
    )
    if reason is None and answer is not None and candidate.split != "test":
        retrieved = stores[source.side].retrieve(question, HARD_NEGATIVE_POOL)
        rng = random.Random(f"{seed}:{cid}")
        candidate.negatives = _negatives(source, answer, retrieved, passages[source.side], split_of, rng)
    return candidate
