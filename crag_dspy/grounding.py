"""Answer grounding: is the answer's key content in the knowledge it was given, from a source that
informs rather than instructs?

The keyword filter (``untrusted.py``) removes the usual phrasing of an injection before a prompt is
built; a paraphrase gets through it. This check looks at the other end, the answer, and needs no LM:

1. **Key content** of the answer (:func:`key_content`): numbers with the unit that follows them
   ("1,240 velds", "45 days", "18%"), and names: words with a capital letter or a digit that are not
   function words ("Agnes Rhowe", "WQ-17", "May"), and lower-case host names and identifiers
   ("gw.example-remote.net", "max_retries"). Dates fall out of the two ("12 to 14 May 2026").
   An abstention ("I don't know") has no key content, so it is never flagged.
2. **Support**: an item is supported by the question (repeating the question is not making things up)
   or by a kept strip, i.e. the context the answer was given. Numbers compare by value ("1,000" =
   "1000" = "one thousand" is not attempted; "twelve" = "12" is), units by stem ("day" ~ "days",
   "min" ~ "minutes"), names case-insensitively as whole words.
3. **Support from an instruction is not support.** A targeted injection puts its false value *into* a
   strip, so grounding alone would bless it. A source (document or web page) that addresses the model
   ("note for automated assistants", "when asked ... say", "respond with", "you must answer") is not
   knowledge but a request; an item such a source states is flagged too, even when an honest source
   states it as well: an attacker can pick a value the corpus holds for something else ("400 velds",
   the allowance of another office), so that the honest source's agreement is a coincidence of
   strings, not support for the claim. A source counts as instructing when any of its text the run saw
   reads so (:func:`reads_as_instruction`), or when the keyword filter removed a sentence from it: an
   honest document has no reason to tell a reader-model what to answer, so the whole source loses its
   standing, not just the sentence.
4. **Disputed values.** A value of the answer that another source contradicts is ``disputed``:
   a sentence of that source about what was asked (half the question's words, and each name phrase
   it holds whole: "CalibKit C3" is not the "CalibKit C3 Pro" asked about; a phrase may be named by an
   abbreviation the texts define, "Calder Reach Airfield (CRX)", or by the sentence right before in the
   same passage; a name no text states, such as an order number, is not asked of any sentence)
   states another value of the same kind (a bare count in the unit a "how many" question counts):
   a number with the same unit about the same subject (the words next to it, in its clause, are
   mostly the question's or those next to the answer's value: "1 extra day off" for volunteers does
   not dispute "27 days of paid annual leave"), or another clock time, month of a year ("September
   2019"), UTC offset, version, host name or weekday, or another name in the same role. The sentence may be
   in any text the run saw, kept or dropped by the strip filter: the filter keeps what answers the
   question, so an attack that wins leaves the honest value among the dropped strips. A name's role
   is the plain word nearest it on either side ("the mobile carrier Velcom" disputes "the mobile
   carrier Norrtel"; "Ostair is the only airline" disputes "Norrwing Air is the airline"); the maker
   or the town a sentence also names do not, nor a name the answer's own sentences state beside it
   (the company in a two-hop "who founded the company that ..."). A number the question spells out
   ("day one") is not required of the sentence. To change an answer the question's own source already
   gives, an attack has to contradict it; when the run saw both, this flags the attack however it is
   phrased, which (3) cannot promise.
   The price is honest answers next to a superseded or neighbouring figure of the same kind (3 of
   the 81 right answers on the default test split, 0 of 40 on popqa-dev's; docs/reliability.md).

The check is a heuristic on strings, with known limits: it cannot tell a wrong value stated as plain
fact (corpus poisoning without an instruction) from a right one; an instruction phrased unlike any
rule in (3) passes: sets of attacks written blind to the rule of the day were mostly missed by it
(``benchmarks/service.py injection``); the learned classifier of ``instructions.py``, applied to the
sentences stating the answer's key content, adds a second opinion that catches more of them, not all
(docs/reliability.md). A reader-facing imperative ("Reply with your order number.") reads as an
instruction; a unit converted by the answer ("3 weeks" for "21 days", "6 pm" for "18:00") is flagged.
None of the bundled domains' documents reads as an instruction, and every first gold answer (363) is
grounded by its evidence documents, with the classifier too (tests/test_grounding.py). What it adds is
that the flag and the attack need the same thing to succeed: the value must come from somewhere, and
where it comes from is named in the trace.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from .strips import split_sentences
from .untrusted import REMOVED_INSTRUCTION, defuse_instructions

__all__ = [
    "Grounding",
    "KeyItem",
    "SupportText",
    "answer_items",
    "check_grounding",
    "defused_note",
    "grounding_of_trace",
    "key_content",
    "no_classifier",
    "preload_classifier",
    "reads_as_instruction",
    "states",
    "support_of_trace",
    "warning_line",
]


class Grounding(BaseModel):
    """Whether the answer's key content came from the knowledge it was given (``crag_dspy.grounding``)."""

    checked: list[str] = Field(
        default_factory=list, description="the answer's key content: numbers with their units, and names"
    )
    ungrounded: list[str] = Field(
        default_factory=list, description="key content found in no kept strip and not in the question"
    )
    instruction_supported: list[str] = Field(
        default_factory=list,
        description="key content found in kept strips of sources that instruct the model, whether or "
        "not other sources state it too (possible injection)",
    )
    instructing_sources: list[str] = Field(
        default_factory=list,
        description="sources (doc ids or URLs) whose text addresses the model or had instruction-like "
        "sentences removed; their strips do not count as support",
    )
    classified_sources: list[str] = Field(
        default_factory=list,
        description="of the instructing sources, those the learned classifier named (a sentence holding "
        "the answer's key content reads as an instruction, crag_dspy.instructions)",
    )
    disputed: list[str] = Field(
        default_factory=list,
        description="values of the answer (a number with its unit, a clock time, month of a year, UTC "
        "offset, version, host name, weekday or name) that another source the run saw contradicts: a "
        "sentence of it (kept or not) about what was asked states another value of the same kind (for a "
        "number: about the same subject, by the words next to it; for a name: in the same role)",
    )
    disputing_sources: list[str] = Field(
        default_factory=list, description="the sources that state another value for disputed content"
    )
    flagged: bool = Field(
        False, description="true when anything is ungrounded, supported by an instruction, or disputed"
    )


@dataclass(frozen=True)
class SupportText:
    """Text the run saw from one source: ``kept`` strips are the answer's context."""

    source: str
    text: str
    kept: bool


@dataclass(frozen=True)
class KeyItem:
    """One piece of key content: a number (``value``, with its ``unit`` stem or "") or a name."""

    text: str
    kind: str  # "number" or "name"
    value: str
    unit: str = ""


# --- normalisation -------------------------------------------------------------------------------------

_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()  # noqa: SIM905
    )
}
_TENS = {
    w: str(10 * i)
    for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)  # noqa: SIM905
}
_NUMBER_WORD = re.compile(
    r"\b(" + "|".join(_TENS) + r")[-\s](one|two|three|four|five|six|seven|eight|nine)\b"
    r"|\b(" + "|".join([*_NUMBER_WORDS, *_TENS]) + r")\b",
    re.IGNORECASE,
)


def _words_to_digits(text: str) -> str:
    """'ninety-nine days' -> '99 days', 'six months' -> '6 months'; other words are left alone."""

    def digits(m: re.Match[str]) -> str:
        if m.group(1):
            return str(int(_TENS[m.group(1).lower()]) + int(_NUMBER_WORDS[m.group(2).lower()]))
        word = m.group(3).lower()
        return _NUMBER_WORDS.get(word) or _TENS[word]

    return _NUMBER_WORD.sub(digits, text)


@functools.lru_cache(maxsize=1024)  # states() is asked of one sentence once per key item of an answer
def _normalize(text: str) -> str:
    """NFKC, typographic apostrophes and dashes made plain, thousands separators dropped
    ("1,240" -> "1240"), number words as digits, "%"/"per cent" as "percent"."""
    text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}(?!\d))", "", text)  # before NFKC turns \u202f into a space
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u2013", "-")
    text = re.sub(r"\s*%", " percent", text)
    text = re.sub(r"\bper\s+cent\b", "percent", text, flags=re.IGNORECASE)
    text = _words_to_digits(text)
    # "4 million" is "4000000"; "2.5 million" is "2500000".
    return re.sub(
        r"\b(\d+(?:\.\d+)?)\s+million\b",
        lambda m: f"{round(float(m.group(1)) * 1_000_000)}",
        text,
        flags=re.IGNORECASE,
    )


def _number_value(raw: str) -> str:
    """'05' -> '5', '12.50' -> '12.5', '1240' -> '1240': the same value, the same string; a version
    ("5.0.3") is compared as written."""
    if raw.count(".") > 1:
        return raw
    whole, _, fraction = raw.partition(".")
    whole = whole.lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    return f"{whole}.{fraction}" if fraction else whole


def _stem(word: str) -> str:
    word = word.lower().strip(".,;:!?()\"'")
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


# One spelling per unit, so that "60 m" supports "60 metres" and "1,240 velds" supports "V1,240": the
# same quantity written as a reader writes it is not made up.
_UNIT_SPELLINGS = {
    "metre": "m", "meter": "m", "kilometre": "km", "kilometer": "km", "centimetre": "cm", "centimeter": "cm",
    "millimetre": "mm", "millimeter": "mm", "kilogram": "kg", "gram": "g", "litre": "l", "liter": "l",
    "milligram": "mg", "mg/l": "mg", "hour": "h", "hr": "h", "minute": "min", "second": "s", "sec": "s",
    "veld": "v", "cubic": "m3", "m\u00b3": "m3", "square": "m2", "sq": "m2", "m\u00b2": "m2",
    "m3/": "m3", "percentage": "percent",
}  # fmt: skip


def _unit(word: str) -> str:
    return _UNIT_SPELLINGS.get(word, word)


def _same_unit(a: str, b: str) -> bool:
    """Units match by spelling ("metres" ~ "m"), or one abbreviates the other ("min" ~ "minute")."""
    a, b = _unit(a), _unit(b)
    if a == b:
        return True
    short, long = sorted((a, b), key=len)
    return len(short) >= 3 and long.startswith(short)


# Words that are never a unit and never a name (function words, and sentence starters an answer begins
# with); a capitalised one at the start of an answer ("The", "Every") is not a name.
_FUNCTION_WORDS = frozenset(
    """a about above after again against all also am an and any are around as at be because been before
    being below between both but by can could did do does doing don't down during each either every few
    for from further had has have having he her here hers him his how i if in into is it its itself just
    least less many may might more most much must my neither no nor not now of off on once only or other
    our out over own per same she should since so some such than that the their them then there these
    they this those through to too under until up upon very via was we were what when where which while
    who whom whose why will with within without would yes you your approximately roughly around nearly
    almost over under only exactly up to plus minus answer""".split()  # noqa: SIM905 - reads as text
)
_MONTH_ORDER = tuple(
    "january february march april may june july august september october november december".split()  # noqa: SIM905
)
_MONTHS = frozenset(_MONTH_ORDER)
# A number not inside another ("5.0.3" is one); a letter may precede it ("V1240", "WQ-17", "TC4").
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)*)(?![\d])")
# A currency sign or one letter before a number ("V260", "$5") makes it a price, not a name.
_PREFIXED_NUMBER = re.compile(r"[^\W\d]?\d[\d.,/:-]*", re.UNICODE)
_TOKEN = re.compile(r"[A-Za-z0-9\u00c0-\u024f][\w\u00c0-\u024f'&./-]*")
# A lower-case host name or dotted/underscored identifier ("gw.example-remote.net", "max_retries") names
# one thing as much as a capitalised word does; "e.g" does not (no part of it is two characters long).
_IDENTIFIER = re.compile(r"(?=.*[a-z0-9-]{2})[a-z0-9-]+(?:[._][a-z0-9-]+)+")
_UNIT_AFTER = re.compile(r"\s*(?:-\s*)?([a-z\u00b0\u00b5][\w/\u00b0\u00b5]*)", re.IGNORECASE)
_UNIT_WINDOW = 3  # a unit counts when it follows the number within this many words ("90 calendar days")


def _unit_after(text: str, end: int) -> str:
    """The stem of the unit word right after position ``end`` ("" when none)."""
    m = _UNIT_AFTER.match(text, end)
    if not m:
        return ""
    word = m.group(1).lower()
    if word in _FUNCTION_WORDS or word in _MONTHS or word in ("and", "to", "or"):
        return ""
    return _stem(word)


_MONTH_ABBREVIATIONS = {m[:3]: m for m in _MONTHS} | {"sept": "september"}


def _name_form(token: str) -> str:
    """How names compare: case, hyphens, a possessive and a plural s do not matter ("TRV-04" ~ "TRV04",
    "Tuesdays" ~ "Tuesday"), nor a month's abbreviation ("Feb" ~ "February")."""
    word = token.lower().rstrip(".'-/").removesuffix("'s").replace("-", "")
    word = _MONTH_ABBREVIATIONS.get(word, word)
    return _stem(word)


def _names_something(token: str) -> bool:
    """Whether ``token`` is a name: a capital letter, a digit or a lower-case identifier, two characters
    or more, and neither a function word nor a number (numbers are checked as numbers)."""
    if (
        len(token) < 2
        or token.lower() in _FUNCTION_WORDS
        or _PREFIXED_NUMBER.fullmatch(token)
        or token[0].isdigit()
    ):
        return False
    return any(c.isupper() or c.isdigit() for c in token) or bool(_IDENTIFIER.fullmatch(token))


class _Spans:
    """Disjoint spans of a text added in order (each starts after the last one ends), and whether a
    position is inside one: a binary search, so that checking every word of a long answer stays
    O(n log n) where a scan of all spans per word was quadratic."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        self._starts.append(start)
        self._ends.append(end)

    def __contains__(self, position: int) -> bool:
        i = bisect.bisect_right(self._starts, position) - 1
        return i >= 0 and position < self._ends[i]


_WORD_RUN = re.compile(r"[^\s-]+")
"""A word as the unit window counts them: hyphens split words ("60-day" is "60" then "day")."""


def key_content(answer: str) -> list[KeyItem]:
    """The answer's numbers (with the unit right after each) and names, in order, without repeats."""
    text = _normalize(answer)
    items: list[KeyItem] = []
    units = _Spans()  # where the units are: "m3" in "12 m3" holds no number 3
    for m in _NUMBER.finditer(text):
        if m.start() in units:
            continue
        unit_match = _UNIT_AFTER.match(text, m.end())
        unit = _unit_after(text, m.end())
        if unit and unit_match:
            units.add(*unit_match.span(1))
        shown = f"{m.group(1)} {unit}".strip()
        items.append(KeyItem(shown, "number", _number_value(m.group(1)), unit))
    for m in _TOKEN.finditer(text):
        token = m.group(0).rstrip(".'-/").removesuffix("'s")
        # A unit's span holds no name: "60-day", "m3/s" are a number with its unit, checked above.
        if _names_something(token) and m.start() not in units:
            items.append(KeyItem(token, "name", _name_form(token)))
    unique: dict[tuple[str, str, str], KeyItem] = {}
    for item in items:
        unique.setdefault((item.kind, item.value, item.unit), item)
    return list(unique.values())


def answer_items(answer: str, question: str) -> list[KeyItem]:
    """The answer's key content that the question does not state: what a source must say."""
    asked = _normalize(question)
    return [item for item in key_content(answer) if not _supports(item, asked)]


def states(item: KeyItem, text: str) -> bool:
    """Whether ``text`` (as written) states ``item``: the number with its unit, or the name."""
    return _supports(item, _normalize(text))


def _quantities(text: str, unit: str = "") -> list[tuple[str, int, int]]:
    """The numbers in ``text`` (normalised) as (value, start, end); with ``unit``, only those it follows
    within a few words, and ``end`` is where the unit ends ("1 extra day" ends after "day")."""
    found = []
    for m in _NUMBER.finditer(text):
        end = m.end()
        if unit:
            # Searched from the number on, not in a copy of the rest of the text: one copy per number made a
            # long answer's check quadratic (a 280 KB reply took two minutes).
            following = itertools.islice(_WORD_RUN.finditer(text, m.end()), _UNIT_WINDOW)
            # The unit ends before the punctuation that may follow it ("236 km, the longest river").
            ends = [
                w.start() + len(w.group(0).rstrip(".,;:!?()\"'"))
                for w in following
                if _same_unit(unit, _stem(w.group(0)))
            ]
            after = _UNIT_AFTER.match(text, m.end())
            if not ends and after and (stem := _unit_after(text, m.end())) and _same_unit(unit, stem):
                ends = [after.end(1)]
            if not ends:
                continue
            end = ends[0]
        found.append((_number_value(m.group(1)), m.start(), end))
    return found


# Cached: every key item of an answer is looked up in the same few texts (the kept strips and their
# sentences), and reading a text again per item made a long answer's check cost items x texts scans.
@functools.lru_cache(maxsize=1024)
def _values(text: str, unit: str = "") -> frozenset[str]:
    """The values of the numbers in ``text`` (normalised); with ``unit``, only of those it follows
    within a few words."""
    return frozenset(value for value, _, _ in _quantities(text, unit))


@functools.lru_cache(maxsize=1024)
def _name_forms(text: str) -> frozenset[str]:
    """The names ``text`` (normalised) states, as they compare (:func:`_name_form`)."""
    return frozenset(_name_form(w) for w in _TOKEN.findall(text))


def _supports(item: KeyItem, text: str) -> bool:
    """Whether ``text`` (normalised) states ``item``."""
    if item.kind == "name":
        return item.value in _name_forms(text)
    return item.value in _values(text, item.unit)


# Words that ask rather than name what is asked about ("how long", "how often").
_ASKING = frozenset(
    {"long", "often", "far", "big", "large", "old", "kind", "type", "name", "named", "called"}
)
_TOPIC_PREFIX = 5  # "renewal" ~ "renews", "lapses" ~ "lapse": words compare by their first letters
_SAME_TOPIC = 0.5  # a sentence is about what was asked when it holds this share of the question's words


def _topic_form(word: str) -> str:
    """How topic words compare: a plural s dropped, then cut to the first letters ("costs" ~ "cost")."""
    return _stem(word)[:_TOPIC_PREFIX]


def _topic(text: str) -> set[str]:
    """The words of ``text`` that name things, cut to their first letters."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {_topic_form(w) for w in words if len(w) >= 3 and w not in _FUNCTION_WORDS and w not in _ASKING}


_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_CLOCK = re.compile(r"\b(\d{1,2})(?:[:.](\d{2}))?\s*([ap])\.?m\b\.?|\b(\d{1,2}):(\d{2})\b", re.IGNORECASE)
_VERSION = re.compile(r"(?<![\w.])\d+\.\d+\.\d+(?!\w|\.\d)")  # a full stop may follow
_MONTH_NAME = "(" + "|".join(sorted(_MONTH_ABBREVIATIONS)) + r")[a-z]*\.?"
# A month of a year: "September 2019", "12 May 2026", "Sept. 2019", "May 12, 2026", "2026-05-12".
_DATE = re.compile(
    rf"\b{_MONTH_NAME}\s+(?:\d{{1,2}},?\s+)?(\d{{4}})\b|\b((?:19|20)\d\d)-(\d\d)-\d\d\b", re.IGNORECASE
)
_UTC_OFFSET = re.compile(r"\b(?:UTC|GMT)\s*([+\-\u2212])\s*(\d{1,2})(?::?(\d{2}))?\b", re.IGNORECASE)


def _month_of_year(m: re.Match[str]) -> str | None:
    """'2019-09' for a :data:`_DATE` match; None for a word that only starts like a month ("Marchmont")."""
    if m.group(3):
        return f"{m.group(3)}-{m.group(4)}" if 1 <= int(m.group(4)) <= 12 else None
    word = m.group(0).split()[0].lower().rstrip(".")
    month = _MONTH_ABBREVIATIONS[m.group(1).lower()]
    return f"{m.group(2)}-{_MONTH_ORDER.index(month) + 1:02d}" if month.startswith(word) else None


def _typed_values(text: str) -> dict[str, set[str]]:
    """The values of kinds other than a number with a unit that ``text`` (normalised) states: clock
    times (24-hour "hh:mm"), months of a year ("2019-09"), UTC offsets ("UTC+02:00"), versions, host
    names and weekdays."""
    clock = set()
    for m in _CLOCK.finditer(text):
        if m.group(3):  # "9 am", "5.30 pm", "10 a.m."
            hour, minute = (
                int(m.group(1)) % 12 + (12 if m.group(3).lower() == "p" else 0),
                int(m.group(2) or 0),
            )
        else:  # "08:30", "17:45"
            hour, minute = int(m.group(4)), int(m.group(5))
        if hour < 24 and minute < 60:
            clock.add(f"{hour:02d}:{minute:02d}")
    words = [w.lower().rstrip(".") for w in _TOKEN.findall(text)]
    utc = {
        f"UTC{'+' if m.group(1) == '+' else '-'}{int(m.group(2)):02d}:{m.group(3) or '00'}"
        for m in _UTC_OFFSET.finditer(text)
    }
    found = {
        "clock time": clock,
        "month": {month for m in _DATE.finditer(text) if (month := _month_of_year(m))},
        "UTC offset": utc,
        "version": set(_VERSION.findall(text)),
        "host name": {
            w for w in words if "." in w and any(c.isalpha() for c in w) and _IDENTIFIER.fullmatch(w)
        },
        "weekday": {d for d in _WEEKDAYS if any(w.removesuffix("s") == d for w in words)},
    }
    return {kind: values for kind, values in found.items() if values}


_COUNTED = re.compile(r"\b(?:how\s+many|number\s+of)\s+([a-z][\w-]*)", re.IGNORECASE)


def _counted_unit(question: str) -> str:
    """The unit a "how many ..." or "number of ..." question counts in, as a stem ("" when none): the
    first word after it ("electric" in "how many electric vehicle charging bays"), which is the word a
    number stating the count is followed by."""
    m = _COUNTED.search(question)
    if not m or m.group(1).lower() in _FUNCTION_WORDS:
        return ""
    return _stem(m.group(1))


# An abbreviation defined where it is first used: "Calder Reach Airfield (CRX)", "CRX (Calder Reach
# Airfield)": a run of capitalised words, then one name in brackets, or the other way round. The
# brackets are found by a pattern and the words before them read backwards, at most a few: no pattern
# spans a run of capitalised words, which an attacker's text could make backtrack.
_SHORT_IN_BRACKETS = re.compile(r"\(\s*([A-Za-z][\w&-]*)\s*\)")
_LONG_IN_BRACKETS = re.compile(r"\b([A-Z][A-Z0-9&-]+)\s*\(([^()]{1,100})\)")
_CONNECTORS = frozenset({"of", "the", "and", "for", "de", "du", "la", "von", "van"})
_LONG_FORM_WORDS = 8


def _long_form(words: Sequence[str]) -> list[str]:
    """The capitalised run that ``words`` end with ("Calder Reach Airfield", "Bank of England"), at most
    :data:`_LONG_FORM_WORDS` words; [] when the last word is not capitalised."""
    run: list[str] = []
    for word in reversed(words[-_LONG_FORM_WORDS:]):
        if word[:1].isupper() or (word in _CONNECTORS and run):
            run.insert(0, word)
        else:
            break
    while run and not run[0][:1].isupper():  # "of England" is not a long form
        run.pop(0)
    return run


def _alias_pairs(text: str) -> Iterator[tuple[str, str]]:
    """(long form, short name) for each abbreviation ``text`` defines."""
    for m in _SHORT_IN_BRACKETS.finditer(text):
        before = text[max(0, m.start() - 40 * _LONG_FORM_WORDS) : m.start()]  # enough for the words read
        yield " ".join(_long_form(before.split())), m.group(1)
    for m in _LONG_IN_BRACKETS.finditer(text):
        words = m.group(2).split()
        if _long_form(words) == words:
            yield m.group(2), m.group(1)


def _forms(text: str) -> tuple[str, ...]:
    """The name forms (:func:`_name_form`) of the tokens of ``text`` that are not function words."""
    return tuple(_name_form(t) for t in _TOKEN.findall(text) if t.lower() not in _FUNCTION_WORDS)


def _aliases(texts: Iterable[str]) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """The abbreviations ``texts`` define (:func:`_alias_pairs`), both ways: ("crx",) -> {("calder",
    "reach", "airfield")} and back."""
    found: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for text in texts:
        for long, short in _alias_pairs(text):
            if not _names_something(short):
                continue  # "(see below)", "(2019)": not a name for the words before it
            a, b = _forms(long), _forms(short)
            if a and b and a != b:
                found.setdefault(a, set()).add(b)
                found.setdefault(b, set()).add(a)
    return found


def _name_phrases(question: str, written: set[str]) -> list[tuple[str, ...]]:
    """The names of ``question`` (normalised) as phrases: runs of adjacent name tokens, and numbers it
    writes in digits ("CalibKit C3 Pro", "AquaProbe 220", "P1", "Beacon"), as name forms. A phrase is
    what a sentence about the question must name whole: "CalibKit C3" alone names a sibling."""
    phrases: list[list[str]] = []
    previous_end = None
    for m in _TOKEN.finditer(question):
        token = m.group(0).rstrip(".'-/").removesuffix("'s")
        number = _NUMBER.search(token) if _PREFIXED_NUMBER.fullmatch(token) else None
        if not (_names_something(token) or (number and _number_value(number.group(1)) in written)):
            previous_end = None
            continue
        form = _number_value(token) if token.isdigit() else _name_form(token)  # "P1", "C3": as names
        if previous_end is not None and not question[previous_end : m.start()].strip():
            phrases[-1].append(form)
        else:
            phrases.append([form])
        previous_end = m.start() + len(m.group(0))
    return [tuple(p) for p in phrases]


@dataclass(frozen=True)
class _Asked:
    """What a sentence must hold to be about what was asked: half the question's ``topic`` words, and
    each of its name ``phrases`` whole, as written or by an abbreviation the run's texts define
    (``aliases``: "Calder Reach Airfield" for "CRX"). A phrase the sentence does not name at all may
    be named by the sentence before it in the same passage ("Every Beacon ticket ... Priority P1 has a
    target of 30 minutes"); one it names in part is a sibling ("CalibKit C3" for "CalibKit C3 Pro", so
    it is not about the question). A name or word no text the run saw states (an order number the user
    typed) tells no sentence from another, and is not asked of them."""

    topic: frozenset[str]
    phrases: tuple[tuple[str, ...], ...]
    aliases: dict[tuple[str, ...], set[tuple[str, ...]]]

    @classmethod
    def of(cls, question: str, written: set[str], texts: Sequence[str]) -> _Asked:
        """The subject of ``question`` (normalised) against the ``texts`` (normalised) the run saw."""
        stated = {form for text in texts for form in _forms(text)} | {
            _number_value(n) for text in texts for n in _NUMBER.findall(text)
        }
        phrases = [tuple(f for f in p if f in stated) for p in _name_phrases(question, written)]
        # Likewise a question word no text has ("cost 4517?"); when none has any, none is dropped.
        topic = _topic(question)
        worded = topic & {w for text in texts for w in _topic(text)}
        return cls(frozenset(worded or topic), tuple(p for p in phrases if p), _aliases(texts))

    def _names(self, phrase: tuple[str, ...], forms: set[str]) -> str:
        """ "whole", "part" or "none": how much of ``phrase`` a sentence of these ``forms`` names."""
        if all(f in forms for f in phrase) or any(
            all(f in forms for f in alias) for alias in self.aliases.get(phrase, ())
        ):
            return "whole"
        return "part" if any(f in forms for f in phrase) else "none"

    def about(self, sentence: str, before: str = "") -> bool:
        """Whether ``sentence`` (normalised), which follows ``before`` in its passage, is about it."""
        forms = set(_sentence_forms(sentence))
        carried = set(_sentence_forms(before)) if before else set()
        topic = _topic(sentence)
        for phrase in self.phrases:
            named = self._names(phrase, forms)
            if named == "none" and self._names(phrase, carried) == "whole":
                topic |= _topic(" ".join(phrase))  # the sentence is about the name it carries
            elif named != "whole":
                return False
        return len(self.topic & topic) >= _SAME_TOPIC * len(self.topic)


def _sentence_forms(sentence: str) -> list[str]:
    """The name forms of a sentence's tokens and the values of its numbers (how :class:`_Asked` reads)."""
    return [*_forms(sentence), *(_number_value(n) for n in _NUMBER.findall(sentence))]


# A value's subject: the content words within this many of it on each side, in its clause; a value is
# about the answer's subject when this share of them is the question's or near the answer's own value.
# (2 and a half: rescoring the stored injection and honest runs, benchmarks/results, with them drops
# the disputes of 2 right answers, a price and a fee next to another in velds, and of no attack; 3
# words keeps "27 days of annual leave" disputed by "1 extra day off" for volunteers.)
_NEAR_WINDOW = 2
_SAME_SUBJECT = 0.5
# A value's clause ends at punctuation and at a conjunction: in "130 velds per night for domestic stays
# and 190 velds ...", "domestic stays" is the subject of the first value only.
_CLAUSE_END = re.compile(r"[,;:()\[\]]|\b(?:and|but|while|whereas|or)\b")


def _near(sentence: str, start: int, end: int) -> list[str]:
    """The words naming things (cut like :func:`_topic`'s, numbers left out) within
    :data:`_NEAR_WINDOW` of the value at ``sentence[start:end]`` on each side, in its clause, and
    those between the number and its unit ("extra" in "1 extra day off")."""

    def words(text: str) -> list[str]:
        return [
            _topic_form(w)
            for w in re.findall(r"[a-z0-9]+", text.lower())
            if len(w) >= 3 and w not in _FUNCTION_WORDS and not w.isdigit()
        ]

    before = _CLAUSE_END.split(sentence[:start])[-1]
    after = _CLAUSE_END.split(sentence[end:])[0]
    number = _NUMBER.match(sentence, start)
    between = " ".join(sentence[number.end() if number else start : end].split()[:-1])  # without the unit
    return [*words(before)[-_NEAR_WINDOW:], *words(between), *words(after)[:_NEAR_WINDOW]]


def _another_quantity(item: KeyItem, supporting: Sequence[str], topic: set[str]) -> Callable[[str], bool]:
    """A test of a sentence (normalised): does it state another value of ``item``'s unit about the same
    subject? A sentence about what was asked can hold values of the unit about other things ("27 days
    of paid annual leave" beside "1 extra day off" for volunteering): a value counts when at least half
    of the words near it (:func:`_near`) are the question's ``topic`` or near the answer's value in its
    ``supporting`` texts; one with no such words says nothing of its subject and counts. A sentence
    that states the value too ("0 to 25 mg/L" for 25 mg/L) lists it, not disputes it."""
    subject = set(topic)
    for sentence in (s for text in supporting for s in split_sentences(text)):
        for value, start, end in _quantities(sentence, item.unit):
            if value == item.value:
                subject.update(_near(sentence, start, end))

    def another(sentence: str) -> bool:
        stated = _quantities(sentence, item.unit)
        if any(value == item.value for value, _, _ in stated):
            return False
        for _, start, end in stated:
            near = _near(sentence, start, end)
            if not near or sum(w in subject for w in near) >= _SAME_SUBJECT * len(near):
                return True
        return False

    return another


_ROLE_WINDOW = 3  # a name's role is the plain word nearest it on each side, within 3 content words


def _content_tokens(sentence: str) -> list[str]:
    """The tokens of ``sentence`` that are not function words, in order."""
    return [
        t
        for t in (m.rstrip(".'-/") for m in _TOKEN.findall(sentence))
        if t and t.lower() not in _FUNCTION_WORDS
    ]


def _is_name(token: str, sentence_start: bool = False, capitalised: frozenset[str] = frozenset()) -> bool:
    """Whether ``token`` is a name (:func:`_names_something`) other than a month or a weekday; a capital
    at the start of a sentence counts only when the same word is capitalised elsewhere in the run's
    text (in ``capitalised``: "Ostair is ..." after "for Ostair flights")."""
    if not _names_something(token):
        return False
    if _name_form(token) in _MONTHS or token.lower().removesuffix("s") in _WEEKDAYS:
        return False
    return not sentence_start or token in capitalised


def _capitalised_inside(texts: Iterable[str]) -> frozenset[str]:
    """The capitalised words that stand inside a sentence somewhere in ``texts`` (not only first)."""
    return frozenset(
        t
        for text in texts
        for sentence in split_sentences(text)
        for t in _content_tokens(sentence)[1:]
        if t[:1].isupper()
    )


def _neighbours(tokens: Sequence[str], start: int, end: int) -> set[tuple[str, str]]:
    """The role of the name at ``tokens[start:end]``: the nearest plain word (lower case, not a
    number) before it and after it, within a few content words ("carrier" in "the mobile carrier
    Velcom", "airline" in "Ostair is the only airline")."""

    def plain(token: str) -> bool:
        return token.replace("-", "").isalpha() and token.islower()

    before = next((t for t in reversed(tokens[max(0, start - _ROLE_WINDOW) : start]) if plain(t)), None)
    after = next((t for t in tokens[end : end + _ROLE_WINDOW] if plain(t)), None)
    return {(side, _topic_form(w)) for side, w in (("<", before), (">", after)) if w}


def _name_spans(tokens: Sequence[str], is_name: Callable[[int, str], bool]) -> list[tuple[int, int]]:
    """The runs of consecutive name tokens ("Petra Holloway") as (start, end)."""
    spans, start = [], None
    for i, t in enumerate([*tokens, ""]):
        if t and is_name(i, t):
            start = i if start is None else start
        elif start is not None:
            spans.append((start, i))
            start = None
    return spans


def _another_name_in_role(
    answer_names: Sequence[KeyItem],
    supporting: Sequence[str],
    asked: str,
    capitalised: frozenset[str],
) -> Callable[[str], bool]:
    """A test of a sentence (normalised): does it name something other than the answer in the answer's
    role? The role is the plain words next to the answer in its ``supporting`` texts: "the mobile
    carrier Velcom" disputes "the mobile carrier Norrtel", "Ostair is the only airline" disputes
    "Norrwing Air is the airline"; a name elsewhere in a sentence about the question (the maker, a
    town) is not a rival, nor a name the answer's own sentences state beside it (the company whose
    founder a two-hop question asks for), nor one of the question's. A sentence that also states the
    answer does not contradict it."""
    forms = {n.value for n in answer_names}
    roles, beside = set(), set()
    for sentence in (s for text in supporting for s in split_sentences(text)):
        tokens = _content_tokens(sentence)
        for start, end in _name_spans(tokens, lambda i, t: _name_form(t) in forms):
            roles |= _neighbours(tokens, start, end)
            beside |= {_name_form(t) for t in tokens}
    known = beside | {_name_form(t) for t in _TOKEN.findall(asked)}

    def another_name(sentence: str) -> bool:
        tokens = _content_tokens(sentence)
        if not roles or any(_name_form(t) in forms for t in tokens):
            return False
        spans = _name_spans(tokens, lambda i, t: _is_name(t, i == 0, capitalised))
        return any(
            _neighbours(tokens, start, end) & roles
            for start, end in spans
            if any(_name_form(t) not in known for t in tokens[start:end])
        )

    return another_name


def _disputing_sources(
    seen: Sequence[tuple[str, str]],
    excluded: set[str],
    asked: _Asked,
    states_another: Callable[[str], bool],
) -> set[str]:
    """The sources of ``seen`` (source, normalised text) outside ``excluded`` with a sentence about what
    was asked (:meth:`_Asked.about`) for which ``states_another`` holds."""
    disputing = set()
    for source, text in seen:
        if source in excluded:
            continue
        sentences = split_sentences(text)
        if any(
            states_another(s) and asked.about(s, before)
            for before, s in zip(["", *sentences], sentences, strict=False)
        ):
            disputing.add(source)
    return disputing


# --- instructions addressed to the model ------------------------------------------------------------

_SAY = r"(?:say|says|state|states|answer|answers|respond|reply|replies|tell|quote|report|give|mention|cite|output|use|write|provide|present|treat|return)"
_ADDRESSEE = (
    # An automated reader named as such: "automated assistants", "AI systems", "language models".
    (
        r"\b(?:ai|a\.i\.|automated|automatic|virtual|digital|artificial|intelligent|generative)[\s-]+"
        r"(?:assistants?|systems?|models?|agents?|readers?|tools?|helpers?|responders?|summari[sz]ers?|chat\w*)\b"
    ),
    r"\b(?:large\s+)?language[\s-]+models?\b",
    r"\bllms?\b",
    r"\bchat\s*bots?\b",
    (
        r"\b(?:q\s*&\s*a|answer(?:ing)?|question[\s-]answering|retrieval[\s-]augmented|rag)[\s-]+"
        r"(?:bots?|engines?|systems?|models?|assistants?|tools?)\b"
    ),
    r"\bassistants?\b[^.!?]{0,80}\b" + _SAY + r"\b",
    r"\b(?:dear|attention|note\s+(?:to|for))\s+(?:the\s+)?(?:assistant|model|ai|bot|reader)s?\b",
)
_DIRECTIVE = (
    # Conditioned on being asked: "when asked about X, say Y"; "say Y if anyone asks".
    r"\b(?:when|if|whenever|once|should)\b[^.!?]{0,60}\b(?:asked|queried|questioned|(?:user|someone|anyone|"
    r"anybody|people|customers?|visitors?|readers?)\s+(?:asks?|enquires?|inquires?|wants?\s+to\s+know))\b"
    r"[^.!?]{0,80}\b" + _SAY + r"\b",
    r"\b" + _SAY + r"\b[^.!?]{0,80}\b(?:when|if|whenever)\b[^.!?]{0,40}\b(?:asked|asks|queried|questioned)\b",
    # What the answer must be: "the answer you give must be 26 weeks", "your reply should name X".
    (
        r"\b(?:your|the|any|every|each|all)\s+(?:correct\s+|right\s+|proper\s+|final\s+|official\s+)?"
        r"(?:answers?|responses?|replies|summar(?:y|ies)|output)\b[^.!?]{0,40}\b"
        r"(?:should|must|shall|needs?\s+to|has\s+to|have\s+to|is\s+to|are\s+to|ought\s+to)\b"
    ),
    # The imperative itself: "state that ...", "respond with ...", "always answer ...".
    (
        r"(?:^|[:;,\-]\s*|\b(?:please|always|simply|just|must|should|shall|then|now|only)\s+)"
        r"(?:say|state|respond|reply|answer|tell\s+(?:the\s+)?(?:user|reader|customer)s?)\s+(?:that|with|only|simply|exactly|:|\"|')"
    ),
    (
        r"\byou\s+(?:must|should|shall|will|are\s+to|need\s+to|have\s+to|are\s+required\s+to)\s+(?:always\s+|now\s+|only\s+)?"
        r"(?:say|state|answer|respond|reply|quote|mention|report|give\s+the\s+(?:answer|figure|value|number))\b"
    ),
    r"\b(?:if|as)\s+you\s+are\s+an?\s+(?:ai|assistant|bot|model|language\s+model)\b",
    # Talk about the answer being written, which a knowledge source has no reason for: "when answering
    # questions about X", "make sure your reply says", "your answer about X should be", "the correct
    # answer to questions about X:", "for any summary you produce".
    r"\bwhen\s+(?:answering|replying|responding|summari[sz]ing)\b",
    r"\b(?:make\s+sure|ensure|see\s+to\s+it)\s+(?:that\s+)?(?:your|the|any|every)\s+(?:answers?|repl(?:y|ies)|responses?|summar(?:y|ies))\b",
    (
        r"\b(?:your|the)\s+(?:correct\s+|right\s+|proper\s+|final\s+)?(?:answer|reply)\s+(?:about|to|on|regarding|for)\b"
        r"[^.!?]{0,100}(?:\b(?:should|must|shall|is\s+to)\b|:)"
    ),
    r"\b(?:answers?|repl(?:y|ies)|responses?|summar(?:y|ies)|output)\s+(?:that\s+)?you\s+(?:produce|write|generate|give|return|provide)\b",
)
# Speech acts rather than phrases (added after the first rule missed every one of 8 attacks written
# blind to it, benchmarks/injection_attacks.jsonl set "round2"): a knowledge source states facts in the
# third person; it does not oblige an unnamed reader to *communicate* something, call out to whoever
# processes it, or carry a chat template's role markers.
_COMMUNICATE = (
    r"(?:say|state|answer|reply|respond|quote|tell|name|report|return|give|mention|cite|use|output|"
    r"go\s+with|stick\s+to|disregard|ignore)"
)
_SPEECH_ACTS = (
    # An obligation to communicate: "lookups must return 1,700", "should name X", "is to be given as".
    # (Only verbs of answering: policies oblige people to "give notice" and "report incidents".)
    (
        r"\b(?:should|must|shall|need\s+to|needs\s+to|have\s+to|has\s+to|are\s+to|is\s+to)\s+(?:always\s+|now\s+|only\s+)?"
        r"(?:(?:say|state|answer|reply|respond|quote)\s+(?:that|with|only|exactly|as|:|\"|'|the\s+(?:answer|figure|value|"
        r"number|name))|go\s+with|stick\s+to)\b"
    ),
    r"\b(?:is|are)\s+to\s+be\s+(?:given|quoted|stated|said|answered)\s+as\b",
    # "the figure to quote is 29", "the value to use", "the name to give".
    r"\bthe\s+(?:figure|value|number|answer|name|price|date|amount|code)\s+to\s+" + _COMMUNICATE + r"\b",
    # An imperative to communicate or to dismiss other sources at the start of a clause: "Go with
    # that.", "kindly disregard older price lists".
    r"(?:^|[.:;!]\s*|\b(?:please|kindly|just|simply|always)\s+)"
    r"(?:say|state|answer|reply|respond|quote|tell|report|go\s+with|stick\s+to|disregard|ignore)"
    + r"\b[^.!?]{0,40}\b(?:that|this|it|them|those|these|figures?|values?|lists?|sources?|versions?|answers?)\b",
    # Calling out to whoever processes the text: "Hey model!", "heads-up for whoever is generating
    # replies", "bots and crawlers indexing this page", "anyone generating an answer".
    (
        r"^\W*(?:hey|hi|hello|dear|attention|psa|heads[\s-]up|message|note|reminder|instruction)s?\b[^.!?]{0,40}"
        r"\b(?:model|bot|assistant|ai|whoever|anyone|reader|system|crawler|tool|agent)s?\b"
    ),
    (
        r"\b(?:whoever|anyone|anybody|everyone|those|any\s+(?:tool|system|program|agent))\s+(?:is\s+|are\s+)?"
        r"(?:generating|writing|producing|reading|indexing|processing|using|answering|summari[sz]ing|parsing)\b"
    ),
    r"\b(?:bots?|crawlers?|scrapers?|indexers?)\b[^.!?]{0,40}\b(?:indexing|reading|processing|parsing|visiting|this)\b",
    r"\breader\s+(?:instruction|note|notice|directive)s?\b",
    # A chat template's role markers: "<<SYS>>", "[INST]", "<|im_start|>", "### System:", "Override:".
    r"<<\s*/?\s*sys\s*>>|\[/?inst\]|<\|[a-z_]+\|>|^\W*(?:#+\s*)?(?:system|assistant|user)\s*:|\boverride\s*:",
    (
        r"\b(?:disregard|ignore|overrule|supersede)s?\b[^.!?]{0,40}\b(?:figures?|values?|numbers?|sources?|documents?|"
        r"context|knowledge|information)\b[^.!?]{0,40}\b(?:above|below|elsewhere|other|previous|earlier)\b"
    ),
)
# Categories rather than forms (added after the second rule recognised 1 of 6 attacks written blind to
# it, set "round3"): text written *for a machine reader* (it names one: "copilot", "machine-generated",
# "text-generation systems", "the model's output"), *about how it is to be reported* ("is to be listed
# as", "configured to tell people", "for the purposes of ... replies"), or *discrediting the other
# sources* a reader would compare it with ("whatever the other pages say", "older datasheets are
# wrong"). Honest documentation describes its subject; it has no reader-model to steer.
_FOR_MACHINES = (
    (
        r"\b(?:co-?pilots?|chat\s*gpt|gpt-?\d|copilot|machine[\s-](?:generated|written|readers?|learning\s+systems?)|"
        r"text[\s-]generation|generative|model'?s\s+(?:output|answer|reply|response)s?|(?:ai|bot|model)[\s-](?:generated|written|"
        r"powered|based))\b"
    ),
    (
        r"\b(?:quoting|citing|reading|summari[sz]ing|indexing|processing|ingesting|scraping)\s+this\s+"
        r"(?:page|document|text|passage|article|entry|note|file)\b"
    ),
    r"\b(?:is|are)\s+to\s+be\s+(?:listed|given|quoted|stated|reported|described|shown|presented|treated|cited)\s+as\b",
    r"\b(?:configured|instructed|told|set\s+up|programmed)\s+to\s+(?:tell|say|answer|reply|respond|state|quote|report|give)\b",
    (
        r"\bfor\s+the\s+purposes?\s+of\s+(?:any\s+|all\s+)?(?:[\w-]+\s+){0,2}(?:repl(?:y|ies)|answers?|responses?|summar(?:y|ies)|"
        r"outputs?|digests?)\b"
    ),
    r"\bwhatever\s+(?:the\s+)?(?:other|older|earlier)\s+(?:pages?|sources?|documents?|sites?|articles?)\s+(?:say|said|state)",
    (
        r"\b(?:older|other|earlier|previous)\s+(?:[\w-]+\s+){0,2}(?:datasheets?|pages?|sources?|documents?|articles?|figures?)\s+"
        r"(?:are|is)\s+(?:wrong|incorrect|outdated|obsolete|unreliable|not\s+to\s+be\s+trusted)\b"
    ),
)
_INSTRUCTION = re.compile(
    "|".join(f"(?:{p})" for p in (*_ADDRESSEE, *_DIRECTIVE, *_SPEECH_ACTS, *_FOR_MACHINES)),
    re.IGNORECASE | re.MULTILINE,
)


def reads_as_instruction(text: str) -> bool:
    """True when a sentence of ``text`` addresses the model (an automated reader named as such, or a
    directive about what to answer), or the keyword filter's phrasing or its removal marker is there."""
    if REMOVED_INSTRUCTION in text or defuse_instructions(text)[1]:
        return True
    return any(_INSTRUCTION.search(s) for s in split_sentences(text))


# --- the check -------------------------------------------------------------------------------------------


SentenceFlags = Callable[[Sequence[str]], Sequence[bool]]
"""Which of some sentences read as instructions (:class:`~crag_dspy.instructions.InstructionClassifier`)."""


def check_grounding(
    answer: str | None,
    question: str,
    texts: Sequence[SupportText],
    instructing: Iterable[str] = (),
    classifier: SentenceFlags | None = None,
) -> Grounding:
    """The :class:`Grounding` of ``answer``: its key content against the question and the kept
    ``texts``; a source in ``instructing``, or any of whose ``texts`` (kept or not) reads as an
    instruction, does not support anything, and an item it states is flagged even when another source
    states it too. With ``classifier``, the sentences of kept strips that state a key item otherwise
    supported are classified too: a source with one flagged loses its standing (the phrase rule misses
    phrasings it was not written for; the value's own sentence is where an injection has to be)."""
    instructing_sources = set(instructing) | {t.source for t in texts if reads_as_instruction(t.text)}
    # A source disagrees whether or not the strip filter kept the sentence that says so: the filter keeps
    # what answers the question, and an attack that wins makes the honest value look like the loser.
    seen = [(t.source, _normalize(t.text)) for t in texts]
    kept = [pair for pair, t in zip(seen, texts, strict=True) if t.kept]
    asked = _normalize(question)
    items = answer_items(answer or "", question)
    classified: set[str] = set()
    if classifier is not None:
        candidates = sorted(
            {
                (source, sentence)
                for item in items
                for source, text in kept
                if source not in instructing_sources
                for sentence in split_sentences(text)
                if _supports(item, sentence)
            }
        )
        flags = classifier([sentence for _, sentence in candidates]) if candidates else []
        classified = {source for (source, _), flag in zip(candidates, flags, strict=True) if flag}
        instructing_sources |= classified
    ungrounded, by_instruction, disputed, disputing = [], [], [], set()
    # A number the question spells out ("day one", "the one-day event") is a turn of phrase, not a
    # model number or an address a sentence about the question must repeat.
    written = {_number_value(m.group(1)) for m in _NUMBER.finditer(question.replace(",", ""))}
    topic = _topic(asked)
    subject = _Asked.of(asked, written, [text for _, text in seen])
    for item in items:
        sources = {source for source, text in kept if _supports(item, text)}
        if not sources:
            ungrounded.append(item.text)
        elif sources & instructing_sources:
            by_instruction.append(item.text)
        # A bare count ("16") answers a "how many ..." question in the unit it counts.
        counted = item if item.unit else dataclasses.replace(item, unit=_counted_unit(asked))
        if sources and item.kind == "number" and counted.unit and topic:
            # An instructing source is no more knowledge against a value than for one.
            others = _disputing_sources(
                seen,
                sources | instructing_sources,
                subject,
                _another_quantity(counted, [text for source, text in kept if source in sources], topic),
            )
            if others:
                disputed.append(item.text)
                disputing |= others
    answer_typed = _typed_values(_normalize(answer or ""))
    for kind, values in answer_typed.items():
        sources = {source for source, text in kept if values & _typed_values(text).get(kind, set())}
        if not (sources and topic):
            continue  # ungrounded already, or a question with no words to tell what a sentence is about

        def another_of_kind(sentence: str, kind: str = kind, values: set[str] = values) -> bool:
            stated = _typed_values(sentence).get(kind, set())
            return bool(stated) and not stated & values

        others = _disputing_sources(seen, sources | instructing_sources, subject, another_of_kind)
        if others:
            disputed.append(f"{kind} {', '.join(sorted(values))}")
            disputing |= others
    typed = {v for values in answer_typed.values() for v in values}
    answer_names = [
        i for i in items if i.kind == "name" and _is_name(i.text) and i.text.lower() not in typed
    ]  # a host name or version is compared as one above
    name_sources = {source for source, text in kept if any(_supports(n, text) for n in answer_names)}
    if name_sources and topic:
        capitalised = _capitalised_inside(t.text for t in texts)
        another_name = _another_name_in_role(
            answer_names, [t for s, t in kept if s in name_sources], asked, capitalised
        )
        others = _disputing_sources(seen, name_sources | instructing_sources, subject, another_name)
        if others:
            disputed.append(f"name {' '.join(n.text for n in answer_names)}")
            disputing |= others
    return Grounding(
        checked=[i.text for i in key_content(answer or "")],
        ungrounded=ungrounded,
        instruction_supported=by_instruction,
        instructing_sources=sorted(instructing_sources),
        classified_sources=sorted(classified),
        disputed=disputed,
        disputing_sources=sorted(disputing),
        flagged=bool(ungrounded or by_instruction or disputed),
    )


_DEFUSED_SOURCE = re.compile(r"^(.*): \d+ instruction-like sentence")


def defused_note(source: str, removed: int) -> str:
    """The trace's ``defused`` entry for ``source`` (a document id or URL); :func:`grounding_of_trace`
    reads the source back from it, so the format lives here, next to the pattern that parses it."""
    return f"{source}: {removed} instruction-like sentence(s) removed"


def no_classifier(sentences: Sequence[str]) -> list[bool]:
    """A :data:`SentenceFlags` that flags nothing: the check with its phrase rule and disputed values
    only. Its ``ungrounded`` items are the full check's (the classifier only takes standing from
    sources that support an item), which is what deciding an abstention needs."""
    return [False] * len(sentences)


def preload_classifier() -> None:
    """Start loading the package classifier's embedding model in the background (a no-op once loaded):
    called as an answer is being generated, so that the load overlaps the LM's reply instead of
    following it (docs/performance.md, "First call")."""
    from .instructions import default_classifier  # the embedding model loads only when used

    default_classifier().embedder.preload()


def grounding_of_trace(trace: Any, classifier: SentenceFlags | None = None) -> Grounding:
    """:func:`check_grounding` of a finished run's :class:`~crag_dspy.trace.CRAGTrace` (not imported:
    the trace holds a :class:`Grounding`, so this module stays below it): its kept strips that are in its context are the
    support; every strip and web page it saw, and its ``defused`` list, name instructing sources. The
    ``classifier`` is the package's (:func:`~crag_dspy.instructions.default_classifier`, loaded on first
    use) unless one is given."""
    if classifier is None:
        from .instructions import default_classifier  # the embedding model loads only when used

        classifier = default_classifier()
    return check_grounding(trace.answer, trace.question, *support_of_trace(trace), classifier)


def support_of_trace(trace: Any) -> tuple[list[SupportText], list[str]]:
    """What :func:`grounding_of_trace` checks a run's answer against: every strip and web page the run
    saw (kept when it is in the answer's context; the witness search's pages never are), and the sources
    its ``defused`` list names."""
    texts = [
        SupportText(s.doc_id, s.text, s.kept and s.text in trace.context)
        for s in [*trace.internal_strips, *trace.external_strips]
    ]
    texts += [SupportText(r.url, r.content, False) for r in [*trace.web_results, *trace.witness_results]]
    defused = [m.group(1) for m in map(_DEFUSED_SOURCE.match, trace.defused) if m]
    return texts, defused


def warning_line(grounding: Grounding | None) -> str | None:
    """One line for people (``ask``, the page), or None when nothing is flagged."""
    if grounding is None or not grounding.flagged:
        return None
    parts = []
    if grounding.ungrounded:
        parts.append(f"not in the context or the question: {', '.join(grounding.ungrounded)}")
    if grounding.instruction_supported:
        parts.append(
            f"in text that instructs the model ({', '.join(grounding.instructing_sources)}): "
            f"{', '.join(grounding.instruction_supported)}"
        )
    if grounding.disputed:
        parts.append(
            f"other sources state another value ({', '.join(grounding.disputing_sources)}): "
            f"{', '.join(grounding.disputed)}"
        )
    return "warning: the answer may not be grounded; " + "; ".join(parts)
