"""Generation: how the free-text predictors (query rewriter, reviser, answerers) are called, and how
their replies are cleaned up. CRAG (``module.py``) and the baselines (``baselines.py``) share it:
they call their answerers in the same format and give a bare-number answer its unit the same way.

- **Calling**: :func:`text_format` (the bare-value reply format, :class:`~crag_dspy.adapters.TextAdapter`)
  and :func:`text_config` (a retry is a new rollout).
- **Clean-up of replies**: :func:`before_marker` cuts a completion marker a small model ran into a
  value, :func:`clean_query` turns a rewriter's or reviser's reply into one search query, and
  :func:`clean_answer` an answerer's reply into the answer; both redact keys an LM echoed.
- **Answer form**: :func:`attach_unit` gives a bare-number answer the unit its context states
  ("260" -> "260 velds").

The clean-up and answer-form functions are pure functions of strings (or of a prediction's fields):
no model, no state, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import dspy

from .adapters import TextAdapter
from .redaction import redact

__all__ = [
    "attach_unit",
    "before_marker",
    "clean_answer",
    "clean_query",
    "is_bare_number",
    "text_config",
    "text_format",
]


def text_format():
    """A DSPy context in which free-text predictors reply with the bare value (:class:`TextAdapter`),
    unless the caller chose an adapter with ``dspy.context(adapter=...)`` or ``dspy.configure``.

    DSPy's default ``[[ ## field ## ]]`` format costs a small model ~15 output tokens of markers per
    reply and leaks them into answers (docs/experiments.md); a chosen adapter is the caller's call.
    """
    return dspy.context(adapter=dspy.settings.adapter or TextAdapter())


def text_config(attempt: int = 0) -> dict[str, Any]:
    """The ``config`` of one attempt: a retry is a new rollout, so that the DSPy cache cannot answer it
    with the output that just failed."""
    return {"rollout_id": attempt, "temperature": 0.7} if attempt else {}


def before_marker(value: object) -> str:
    """``value`` as text, cut before an adapter's ``[[`` marker: small models sometimes run the
    completion marker into a value ("6 months [[ ## completed")."""
    return str(value).split("[[", 1)[0]


def clean_query(pred: dspy.Prediction | None) -> str:
    """A rewriter's or reviser's query on one line, without quotes or stray separators ("" for none),
    keys redacted (:func:`~crag_dspy.redaction.redact`)."""
    raw = before_marker(pred.query) if pred is not None and pred.query else ""
    # An LM may echo a key it saw (in an error, a prompt, its context): the query is sent to the web
    # search backend (a third party) and shown in every trace, so it is redacted here, once, before both.
    # Redacted before it is cut, so that a key cut in half cannot escape the key shapes.
    return redact(" ".join(raw.split())).strip(" ;\"'")[:300]


def clean_answer(pred: dspy.Prediction | None) -> str:
    """An answerer's answer without a run-in marker or surrounding whitespace ("" for none), keys
    redacted as in :func:`clean_query`: the answer is printed, returned over HTTP and kept in traces."""
    return redact(before_marker(pred.answer)).strip() if pred is not None and pred.answer else ""


# "260", "1,240", "1 240", "0.2", "12.5" (thousands separators: comma, space, narrow no-break space).
_BARE_NUMBER = re.compile(r"\d{1,3}(?:[,\u202f\u00a0 ]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
# A unit word starts with a lower-case letter or a unit sign: "velds", "mg/L", "°C", "µS/cm", "km".
_UNIT_WORD = re.compile(r"[a-z°µ][\w/°µ-]*")
# Words that end a unit rather than extend it: "260 velds per night" -> "260 velds", "16 weeks of leave"
# -> "16 weeks", "founded in 2004 in Lisbrook" -> no unit.
_ENDS_UNIT = frozenset(
    """a about above across after against among an and any are around as at be because before behind
    below between beyond but by can could did do does during each every for from had has have if in into
    is it its may might must near of off on or out over per since should so than that the their then this
    those through to toward towards under until up versus via vs was were when where which while who will
    with within without would""".split()  # noqa: SIM905 - a word list reads better as text
)
_MAX_UNIT_WORDS = 2  # "3 working days", "25 expedited units"; longer runs are a phrase, not a unit


def is_bare_number(answer: str) -> bool:
    """True for an answer that is a number alone ("260", "1,240", "0.2"), not a year (1900-2099)."""
    text = answer.strip().rstrip(".")
    if not _BARE_NUMBER.fullmatch(text):
        return False
    return not (len(text) == 4 and text.isdigit() and 1900 <= int(text) <= 2099)


def _unit_after(context: str, end: int) -> str:
    """The unit words right after position ``end`` of ``context`` ("" if none)."""
    words: list[str] = []
    for token in context[end:].split(None, _MAX_UNIT_WORDS)[:_MAX_UNIT_WORDS]:
        word = token.rstrip(".,;:!?)\"'")
        if not _UNIT_WORD.fullmatch(word) or word in _ENDS_UNIT:
            break
        words.append(word)
        # Punctuation ends the phrase; a symbol ("mg/L", "°C") or an abbreviation ("g", "km") is a whole
        # unit, while a word may be half of one ("working days", "expedited units").
        if word != token or not word.isalpha() or len(word) <= 2:
            break
    return " ".join(words)


def attach_unit(answer: str, context: str) -> str:
    """``answer`` followed by its unit when it is a bare number that the context states with one unit.

    Asked for a short answer, a small model (the embedded one) often replies with the number alone ("260" for
    "What is the hotel cap per night?", "16" for a leave of 16 weeks) although the context says "260
    velds per night". A bare number is a worse answer for a reader, and the gold answers of the bundled
    domains carry units, so it also counts as wrong. Telling the model to keep units in its instruction
    made it worse, not better (docs/compile.md); reading the unit off the context it answered from is
    exact.

    Every place the number stands alone in ``context`` must give the same unit ("16 weeks" twice); if
    they disagree ("16 weeks", "16 channels"), if none has a unit, or if the answer is not a bare
    number, the answer is returned unchanged. Years are left alone ("in 2014 the company...").
    """
    if not is_bare_number(answer):
        return answer
    number = answer.strip().rstrip(".")
    pattern = re.compile(rf"(?<![\w.,-]){re.escape(number)}(?![\w%-]|[.,]\d)")
    units = {_unit_after(context, match.end()) for match in pattern.finditer(context)}
    if len(units) != 1:
        return answer
    unit = units.pop()
    return f"{number} {unit}" if unit else answer
