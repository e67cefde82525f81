"""What happens to a flagged answer: shown with a warning (``warn``) or withheld (``withhold``).

The grounding check (:mod:`crag_dspy.grounding`) flags an answer whose value another source disputes
or that only text instructing the model supports. A planted value cannot be told from a true update by
reading text, so ``withhold`` does not guess which side is right: it shows neither value as the answer,
and cites both sides (the answer's sources and the disputing or instructing ones) for a person to read.
An answer flagged only as ungrounded (no source states it) is not a disagreement between sources: it
keeps its warning under both policies (``abstain_ungrounded`` is the setting for it).

Pure and without an LM: it reads a finished run's trace, never changes it (:func:`without_answer` gives a
copy for output that must not carry a withheld answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .citations import Citation, content_words
from .grounding import Grounding
from .strips import split_sentences

__all__ = [
    "WITHHELD_ANSWER",
    "AnswerStatus",
    "FlagVerdict",
    "OnFlag",
    "judge_flag",
    "other_side",
    "sources_disagree_or_instruct",
    "without_answer",
]

OnFlag = Literal["warn", "withhold"]
_Trace = TypeVar("_Trace", bound=Any)  # a CRAGTrace or the client trace: both have the fields used
AnswerStatus = Literal["answered", "flagged", "withheld"]

WITHHELD_ANSWER = "The sources disagree or instruct; not answered"


@dataclass(frozen=True)
class FlagVerdict:
    """A run's answer under a flag policy: ``answer`` is what to show, ``status`` says which case it is
    (``answered``: not flagged; ``flagged``: shown with the grounding warning; ``withheld``: not shown),
    ``citations`` the answer's sources and ``other_side`` the sources disputing it or instructing the
    model (only when withheld: under ``warn`` the warning line names them)."""

    answer: str
    status: AnswerStatus
    citations: list[Citation]
    other_side: list[Citation] = field(default_factory=list)


def sources_disagree_or_instruct(grounding: Grounding | None) -> bool:
    """Whether the flag is about the sources: a disputed value, or one supported by instructing text."""
    return grounding is not None and bool(grounding.disputed or grounding.instruction_supported)


def judge_flag(trace: Any, on_flag: OnFlag, citations: Sequence[Citation] | None = None) -> FlagVerdict:
    """The verdict on a finished run's :class:`~crag_dspy.trace.CRAGTrace` under ``on_flag``;
    ``citations`` are the answer's as the caller may show them (default: the trace's own)."""
    if on_flag not in ("warn", "withhold"):
        raise ValueError(f"on_flag must be 'warn' or 'withhold', got {on_flag!r}")
    cited = list(trace.citations if citations is None else citations)
    grounding = trace.grounding
    if grounding is None or not grounding.flagged:
        return FlagVerdict(trace.answer or "", "answered", cited)
    if on_flag == "warn" or not sources_disagree_or_instruct(grounding):
        return FlagVerdict(trace.answer or "", "flagged", cited)
    return FlagVerdict(WITHHELD_ANSWER, "withheld", cited, other_side(trace))


_WITHHELD_MARK = "[withheld]"


def without_answer(trace: _Trace, answer: str | None = WITHHELD_ANSWER) -> _Trace:
    """A copy of ``trace`` (a CRAGTrace or the client trace) that does not carry its answer: the answer
    becomes ``answer`` (None for a run that failed before its answer was judged), the LM's reply is
    dropped, and a fallback or error quoting either has it replaced by ``[withheld]``. For every output
    of a withheld answer (or of one not yet judged under ``withhold``): a client or script reading
    ``trace.answer`` would show the value withheld. Kept: ``grounding``, which says why (the values it
    lists are labelled disputed or instruction-supported, as ``ask``'s warning line shows them), and the
    sources' text (kept strips, citations), cited for a person to read."""
    values = [v for v in (trace.answer, trace.lm_answer) if v and v.strip()]
    return trace.model_copy(
        update={
            "answer": answer if trace.answer is not None else None,
            "lm_answer": None,
            "fallbacks": [_quoting_none(line, values) for line in trace.fallbacks],
            "errors": [_quoting_none(line, values) for line in trace.errors],
        }
    )


def _quoting_none(line: str, values: list[str]) -> str:
    for value in sorted(values, key=len, reverse=True):
        line = line.replace(value, _WITHHELD_MARK)
    return line


def _other_sources(grounding: Grounding) -> list[str]:
    # An instructing source is the other side only when it bears on the answer's value; one that
    # instructs about something else is named by the warning line, not cited.
    instructing = grounding.instructing_sources if grounding.instruction_supported else []
    return list(dict.fromkeys([*grounding.disputing_sources, *instructing]))


def other_side(trace: Any) -> list[Citation]:
    """The sources of a run that dispute its answer or instruct the model, one citation each: the strip
    or web page of that source the run saw, quoting its sentence sharing most words with the question."""
    if trace.grounding is None:
        return []
    asked = content_words(trace.question)
    found: list[Citation] = []
    for source in _other_sources(trace.grounding):
        record = _record_of(trace, source)
        if record is None:
            continue
        text = getattr(record, "text", None) or getattr(record, "content", "")
        sentences = split_sentences(text) or [text]
        quote = max(sentences, key=lambda s: len(asked & content_words(s)))
        url = getattr(record, "url", None)
        found.append(
            Citation(
                doc_id=getattr(record, "doc_id", None) or url or source,
                title=getattr(record, "title", "") or source,
                source=getattr(record, "source", None) or "web",
                page=getattr(record, "page", None),
                section=getattr(record, "section", None),
                url=url,
                quote=quote,
            )
        )
    return found


def _record_of(trace: Any, source: str) -> Any:
    """The first strip (kept first) or web page of ``trace`` from ``source`` (a doc id or URL)."""
    strips = [*trace.internal_strips, *trace.external_strips]
    candidates = [
        *(s for s in strips if s.kept and s.doc_id == source),
        *(s for s in strips if not s.kept and s.doc_id == source),
        *(r for r in [*trace.web_results, *trace.witness_results] if r.url == source),
    ]
    return candidates[0] if candidates else None
