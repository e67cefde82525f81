"""Lean chat formats for small local models: inputs as labelled blocks, the reply is the value itself.

DSPy's ``ChatAdapter`` wraps every output in ``[[ ## field ## ]]`` headers and a closing
``[[ ## completed ## ]]`` marker: ~14 generated tokens per call that carry nothing when a signature
has one output. On the embedded model a generated token costs ~85 ms, so the markers alone cost
~1.2 s per answer or query rewrite. These adapters ask for the bare value instead; the measurement
behind the judges' format is in ``docs/grader.md``.

They also read a reply written in another adapter's format (:func:`wrapped_value`): DSPy's own test
double ``dspy.utils.DummyLM`` formats its scripted outputs as ``ChatAdapter`` (or the adapter it is
given) writes them, and a model tuned on DSPy's formats may do the same.
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

from dspy.adapters.base import Adapter
from dspy.utils.exceptions import AdapterParseError

from .untrusted import neutralize

__all__ = [
    "NO_WORDS",
    "YES_WORDS",
    "LabelAdapter",
    "ListAdapter",
    "TextAdapter",
    "reply_limit",
    "wrapped_value",
]

# The words a judge's one-word reply is read as: the label format's vocabulary, also where the judges
# look for P(yes) among the first token's log-probabilities (crag_dspy.judges.scoring).
YES_WORDS = frozenset({"yes", "true", "y"})
NO_WORDS = frozenset({"no", "false", "n"})

_NOTHING = object()

MOST_CHARS_PER_TOKEN = 16
"""Characters one generated token may stand for, generously (English averages about 4): a reply longer
than ``max_tokens`` times this did not stop where it was asked to (:func:`reply_limit`)."""
LEAST_REPLY_LIMIT = 4096
"""The reply limit in characters when ``max_tokens`` is small (a judge asks for 1 to 3 tokens): a
server that adds a sentence of reasons to its "yes" still answered."""
DEFAULT_MAX_TOKENS = 4096
"""The ``max_tokens`` assumed for the limit when a call sets none."""


def reply_limit(lm_kwargs: dict[str, Any], lm: Any = None) -> int:
    """The most characters a reply to a call with ``lm_kwargs`` (falling back to ``lm.kwargs``) may hold:
    ``max_tokens`` (or ``max_completion_tokens``) times :data:`MOST_CHARS_PER_TOKEN`, at least
    :data:`LEAST_REPLY_LIMIT`."""
    return max((asked_tokens(lm_kwargs, lm) or DEFAULT_MAX_TOKENS) * MOST_CHARS_PER_TOKEN, LEAST_REPLY_LIMIT)


def asked_tokens(lm_kwargs: dict[str, Any], lm: Any = None) -> int | None:
    """The ``max_tokens`` (or ``max_completion_tokens``) a call with ``lm_kwargs`` asks for, falling back
    to ``lm.kwargs``; None when neither sets one."""
    defaults = getattr(lm, "kwargs", None) or {}
    for source in (lm_kwargs, defaults):
        asked = source.get("max_tokens") or source.get("max_completion_tokens")
        if isinstance(asked, int) and asked > 0:
            return asked
    return None


FINISH_REASON = "finish_reason"
"""Key of a reply given as a dict (with ``logprobs``) that did not stop by itself: why it stopped."""
_UNFINISHED = frozenset({"length", "content_filter"})
REFUSAL = "refusal"
"""The :func:`finish_reason` of a reply that is the LM's refusal (OpenAI's ``message.refusal`` or a refusal
content part) and holds no text; its text is the refusal."""


class UnfinishedText(str):
    """A reply's text that did not stop by itself; :attr:`finish_reason` says why. A ``str``, so a caller
    of ``dspy.LM`` that expects text gets text."""

    finish_reason: str


def finish_reason(output: Any) -> str | None:
    """Why the reply ``output`` (text or DSPy's output dict) stopped, when not by itself; else None."""
    if isinstance(output, dict):
        return output.get(FINISH_REASON)
    return getattr(output, "finish_reason", None)


def _unfinished(output: Any, reason: str) -> Any:
    if isinstance(output, dict):
        return {**output, FINISH_REASON: reason}
    if isinstance(output, str):
        text = UnfinishedText(output)
        text.finish_reason = reason
        return text
    return output


def _refusal_text(response: Any) -> str | None:
    """The refusal an lm15 ``response`` holds instead of any text, or None."""
    # By name at run time, as crag_dspy.lm_transport does: type checkers stay out of DSPy's vendored lm15.
    types = importlib.import_module("dspy._vendor.lm15.types")
    RefusalPart, TextPart = types.RefusalPart, types.TextPart
    parts = getattr(getattr(response, "message", None), "parts", ()) or ()
    if any(isinstance(part, TextPart) and part.text.strip() for part in parts):
        return None
    refusals = [part.text for part in parts if isinstance(part, RefusalPart)]
    return " ".join(refusals) if refusals else None


def mark_unfinished_replies() -> None:
    """Keep, on each reply DSPy returns, why the LM stopped when it did not stop by itself: cut at
    ``max_tokens`` ("length"), by the provider's filter ("content_filter"), or refusing (:data:`REFUSAL`,
    the refusal as its text) (:func:`finish_reason`).
    DSPy only logs a warning for a cut reply and returns its text like any other, so a cut answer ("The
    Zorblax pump moves") was shown as answered (probe 6). Idempotent; DSPy's ``execution._result``, which
    turns each response into outputs, is private: dspy is pinned below 3.5."""
    from dspy.clients import execution

    original = execution._result
    if getattr(original, "_crag_marked", False):
        return

    def result(lm: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        made = original(lm, response, *args, **kwargs)
        reason = getattr(response, "finish_reason", None)
        refused = _refusal_text(response)
        if refused is not None:
            # DSPy drops the refusal and reads no text: "The LM returned an empty or null response".
            made.outputs = [
                _unfinished(({**out, "text": refused} if isinstance(out, dict) else refused), REFUSAL)
                for out in made.outputs
            ]
        elif reason in _UNFINISHED:
            made.outputs = [_unfinished(out, reason) for out in made.outputs]
        return made

    result._crag_marked = True  # type: ignore[attr-defined]
    execution._result = result


_FENCE = re.compile(r"^```[a-zA-Z]*\n(.*?)\n?```$", re.DOTALL)


def wrapped_value(name: str, completion: str) -> Any:
    """The value of output ``name`` when ``completion`` wraps it in one of DSPy's own formats: a JSON
    object holding it (``JSONAdapter``; fenced in a code block or not), a ``[[ ## name ## ]]`` block
    (``ChatAdapter``, DummyLM's default) or a ``<name>`` element (``XMLAdapter``). None when it wraps
    nothing: the reply is the bare value (or unusable, which the caller reports)."""
    text = completion.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = _NOTHING  # not JSON after all: maybe a block below, else the caller reports it
        if isinstance(parsed, dict) and name in parsed:
            return parsed[name]
    header = f"[[ ## {name} ## ]]"
    if header in text:
        return text.split(header, 1)[1].split("[[", 1)[0].strip()
    element = re.search(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", text, re.DOTALL)
    return element.group(1).strip() if element else None


class _FieldsAdapter(Adapter):
    """Shared format of signatures with exactly one output field: the instructions, the inputs listed
    with their descriptions, and one labelled block per input (the question plain, the rest fenced in
    ``<<<``/``>>>`` so that they read as data)."""

    # Whether fenced inputs are made inert here (judges read raw passages and strips); see TextAdapter.
    neutralize_inputs = True
    # Whether a reply cut at max_tokens is unusable: yes for text, whose end is lost; a label is read
    # from its first token, and judges ask for one to three tokens, so their replies are always "cut".
    cut_reply_is_unusable = False

    def _fence(self, value: Any) -> str:
        text = neutralize(str(value)) if self.neutralize_inputs else str(value)
        return f"<<<\n{text}\n>>>"

    def _output(self, signature) -> tuple[str, str]:
        if len(signature.output_fields) != 1:
            raise ValueError(
                f"{type(self).__name__} needs a signature with one output field, "
                f"{signature.__name__} has {list(signature.output_fields)}"
            )
        ((name, f),) = signature.output_fields.items()
        return name, f.json_schema_extra.get("desc", "")

    def _call_postprocess(self, processed_signature, original_signature, outputs, lm, lm_kwargs):
        """DSPy's parsing of ``outputs``, after refusing a reply far longer than the call's ``max_tokens``
        allows (:func:`reply_limit`) as unusable output (an :class:`AdapterParseError`: retried as a new
        rollout, then the stage's fallback). A server or gateway that ignores ``max_tokens`` can send
        megabytes of text per call, and everything after the call (parsing, the grounding check, the
        trace) would read all of it; such a reply is no answer to what was asked."""
        limit = reply_limit(lm_kwargs, lm)
        for output in outputs:
            text = output.get("text") if isinstance(output, dict) else output
            reason = finish_reason(output)
            if reason in ("content_filter", REFUSAL) or (reason == "length" and self.cut_reply_is_unusable):
                why = (
                    "the provider's content filter stopped the reply"
                    if reason == "content_filter"
                    else f"the LM refused: {str(text)[:200]}"
                    if reason == REFUSAL
                    else f"the reply was cut at max_tokens ({asked_tokens(lm_kwargs, lm) or 'the LM default'})"
                )
                raise self._unparsed(original_signature, str(text or "")[:200], f"Unusable reply: {why}.")
            if isinstance(text, str) and len(text) > limit:
                raise self._unparsed(
                    original_signature,
                    f"{text[:200]}...",
                    f"The reply holds {len(text)} characters, more than {limit} ({MOST_CHARS_PER_TOKEN} per "
                    "token asked for): the LM did not stop at max_tokens.",
                )
        return super()._call_postprocess(processed_signature, original_signature, outputs, lm, lm_kwargs)

    def _unparsed(self, signature, completion: str, message: str) -> AdapterParseError:
        return AdapterParseError(
            adapter_name=type(self).__name__, signature=signature, lm_response=completion, message=message
        )

    @staticmethod
    def _body(name: str, completion: str, end: str) -> str:
        """The reply without DSPy's header for ``name`` and from ``end`` on: a model trained on DSPy's
        format may still open with the header or close with a marker."""
        return completion.replace(f"[[ ## {name} ## ]]", "").split(end, 1)[0]

    def format_field_description(self, signature) -> str:
        lines = ["Inputs:"]
        for name, f in signature.input_fields.items():
            desc = f.json_schema_extra.get("desc", "")
            lines.append(f"- {name}: {desc}" if desc and desc != f"${{{name}}}" else f"- {name}")
        return "\n".join(lines)

    def format_task_description(self, signature) -> str:
        return signature.instructions

    def format_system_message(self, signature) -> str:
        return (
            f"{self.format_task_description(signature)}\n\n{self.format_field_description(signature)}\n"
            f"{self.format_field_structure(signature)}"
        )

    def format_user_message_content(self, signature, inputs, prefix="", suffix="", main_request=False) -> str:
        blocks = [prefix] if prefix else []
        for name in signature.input_fields:
            if name in inputs:
                value = inputs[name]
                blocks.append(f"{name}: {value}" if name == "question" else f"{name}:\n{self._fence(value)}")
        if suffix:
            blocks.append(suffix)
        return "\n\n".join(blocks)

    def format_assistant_message_content(self, signature, outputs, missing_field_message=None) -> str:
        name, _ = self._output(signature)
        value = outputs.get(name)
        if value is None:
            return missing_field_message or ""
        return self._render(value)

    def _render(self, value: Any) -> str:
        """A demo's output value as the model should write it."""
        raise NotImplementedError


class LabelAdapter(_FieldsAdapter):
    """For signatures with one bool output: the answer is one word, yes or no.

    The one-word answer makes its first token the decision, so P(yes) can be read from the token
    log-probabilities, and the call generates one token instead of ~15.
    """

    def format_field_structure(self, signature) -> str:
        name, desc = self._output(signature)
        return f"Output: {name} - {desc}. Reply with exactly one word: yes or no."

    def _render(self, value: Any) -> str:
        if isinstance(value, str):
            value = value.strip().lower() in YES_WORDS
        return "yes" if value else "no"

    def parse(self, signature, completion: str) -> dict[str, Any]:
        """The label of a one-word reply ("Yes", "no.", "**Yes**", "true"), or of a reply in another
        adapter's format (:func:`wrapped_value`: a JSON object, a ``[[ ## name ## ]]`` block)."""
        name, _ = self._output(signature)
        value = wrapped_value(name, completion)
        if isinstance(value, bool):  # a JSON true/false
            return {name: value}
        words = str(completion if value is None else value).strip().split()
        word = words[0].strip("\"'`.,:*").lower() if words else ""
        if word in YES_WORDS:
            return {name: True}
        if word in NO_WORDS:
            return {name: False}
        raise self._unparsed(signature, completion, "Expected the answer 'yes' or 'no'.")


class TextAdapter(_FieldsAdapter):
    """For signatures with one short text output (a query, an answer): the reply is the value alone,
    its first non-empty line (these outputs are a few words; a second line is the model rambling).

    Inputs are fenced but not neutralized: the answerer's context is assembled from strips that were
    made inert one by one (``untrusted.py``) and tagged ``[internal]``/``[web]``, tags that
    neutralizing would erase.
    """

    neutralize_inputs = False
    cut_reply_is_unusable = True

    def format_field_structure(self, signature) -> str:
        name, desc = self._output(signature)
        return f"Output: {name} - {desc}. Reply with the {name} only, on one line."

    def _render(self, value: Any) -> str:
        return str(value)

    def parse(self, signature, completion: str) -> dict[str, Any]:
        name, _ = self._output(signature)
        value = wrapped_value(name, completion)
        text = self._body(name, completion, "[[") if value is None else str(value)
        line = next((line.strip() for line in text.splitlines() if line.strip()), "")
        if not line:
            raise self._unparsed(signature, completion, f"Expected the {name} as text, got nothing.")
        return {name: line}


_LIST_MARKER = re.compile(r"^\s*(?:[-*\u2022]|\d{1,2}[.)])\s+")
"""A bullet or number a model may put before a list item ("- ", "2. "): not part of the item."""


class ListAdapter(_FieldsAdapter):
    """For signatures with one output that is a short list (``list[str]``): the reply is one item per
    line, nothing else.

    Data synthesis asks for three questions and their answers in one reply, as ``question | answer``
    lines: 42 tokens for three on the embedded model, where ``name: value`` lines (``question_1: ...``,
    ``answer_1: ...``) take 63 and DSPy's ``[[ ## field ## ]]`` blocks more, and a generated token
    costs ~85 ms there (docs/synthesize.md). Inputs are fenced and made inert, as for the judges.
    """

    def format_field_structure(self, signature) -> str:
        name, desc = self._output(signature)
        return f"Output: {name} - {desc}. Reply with one item per line, nothing else."

    def _render(self, value: Any) -> str:
        return "\n".join(map(str, value)) if isinstance(value, list | tuple) else str(value)

    def parse(self, signature, completion: str) -> dict[str, Any]:
        name, _ = self._output(signature)
        text = self._body(name, completion, "[[ ## completed ## ]]")
        items = [_LIST_MARKER.sub("", line).strip() for line in text.splitlines()]
        items = [item for item in items if item]
        if not items:
            raise self._unparsed(signature, completion, f"Expected the {name}, one per line, got nothing.")
        return {name: items}
