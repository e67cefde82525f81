"""Binary relevance judgements (document grading and strip filtering) as compilable DSPy predictors.

Small local models follow DSPy's default ``[[ ## field ## ]]`` chat format poorly for yes/no
decisions and spend ~15 output tokens on markers. :class:`LabelAdapter` asks for one word and reads
its token probabilities instead; the measurement behind this choice is in ``docs/grader.md``.
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.adapters.base import Adapter
from dspy.adapters.chat_adapter import ChatAdapter
from dspy.utils.exceptions import AdapterParseError

from .calibration import Calibration
from .faults import classify_lm_error, describe_error
from .scoring import NO_WORDS, YES_WORDS, clamp_score, yes_probability
from .untrusted import neutralize

__all__ = ["ADAPTERS", "BinaryJudge", "Judgement", "LabelAdapter"]

_judging = contextvars.ContextVar("crag_dspy_judging", default=False)


class _ExpectedTruncation(logging.Filter):
    """Judges cap output at a few tokens on purpose (only the first decides); DSPy's "response was
    truncated" warning is noise for them, and stays on for every other call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_judging.get() and "truncated" in record.getMessage())


logging.getLogger("dspy.clients.lm").addFilter(_ExpectedTruncation())


def _fence(value: Any) -> str:
    # Passages are untrusted; a fence keeps them visibly data and stops a passage from closing its field.
    return f"<<<\n{neutralize(str(value))}\n>>>"


class LabelAdapter(Adapter):
    """Chat format for signatures with one bool output: inputs as labelled blocks, answer one word.

    The one-word answer makes its first token the decision, so P(yes) can be read from the token
    log-probabilities, and the call generates ~2 tokens instead of ~15.
    """

    def format_field_description(self, signature) -> str:
        lines = ["Inputs:"]
        for name, f in signature.input_fields.items():
            desc = f.json_schema_extra.get("desc", "")
            lines.append(f"- {name}: {desc}" if desc and desc != f"${{{name}}}" else f"- {name}")
        return "\n".join(lines)

    def format_field_structure(self, signature) -> str:
        ((name, f),) = signature.output_fields.items()
        return (
            f"Output: {name} - {f.json_schema_extra.get('desc', '')}. Reply with exactly one word: yes or no."
        )

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
                blocks.append(f"{name}: {value}" if name == "question" else f"{name}:\n{_fence(value)}")
        if suffix:
            blocks.append(suffix)
        return "\n\n".join(blocks)

    def format_assistant_message_content(self, signature, outputs, missing_field_message=None) -> str:
        (name,) = signature.output_fields
        value = outputs.get(name)
        if value is None:
            return missing_field_message or ""
        if isinstance(value, str):
            value = value.strip().lower() in YES_WORDS
        return "yes" if value else "no"

    def parse(self, signature, completion: str) -> dict[str, Any]:
        (name,) = signature.output_fields
        words = completion.strip().split()
        word = words[0].strip("\"'`.,:*").lower() if words else ""
        if word in YES_WORDS:
            return {name: True}
        if word in NO_WORDS:
            return {name: False}
        raise AdapterParseError(
            adapter_name="LabelAdapter",
            signature=signature,
            lm_response=completion,
            message="Expected the answer 'yes' or 'no'.",
        )


ADAPTERS: dict[str, type[Adapter]] = {"label": LabelAdapter, "chat": ChatAdapter}


@dataclass
class Judgement:
    """One yes/no decision with its score; ``score`` is None when the LM never gave a usable answer."""

    score: float | None
    label: bool | None
    score_source: str  # "logprobs" | "label" | "error"
    attempts: int
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    raw_score: float | None = None  # the model's own P(yes), before the judge's calibration
    lm_error: BaseException | None = None  # set when the LM itself failed (not just its output)


class BinaryJudge(dspy.Module):
    """Wrap a one-bool-output signature: ask once, read P(yes) from logprobs, retry unparseable output.

    The inner ``predict`` is a bare ``dspy.Predict`` so that teleprompters can compile it and its demos
    survive ``save``/``load`` (compiled sub-modules vanish from saved state; bare predictors do not).
    ``calibration`` maps P(yes) to the reported score; it is fitted by ``optimize.compile`` and is the
    identity until then.
    """

    def __init__(
        self,
        signature: type[dspy.Signature],
        *,
        adapter: str = "label",
        use_logprobs: bool = True,
        retries: int = 2,
    ):
        super().__init__()
        self.predict = dspy.Predict(signature)
        self.calibration = Calibration()
        (self.output_name,) = signature.output_fields
        self.adapter_name = adapter
        self.use_logprobs = use_logprobs
        self.retries = retries

    def _config(self, attempt: int) -> dict[str, Any]:
        config: dict[str, Any] = {"max_tokens": 3 if self.adapter_name == "label" else 40}
        if self.use_logprobs:
            config.update(logprobs=True, top_logprobs=10)
        if attempt:
            # A retry must not be answered from the cache with the same bad output.
            config.update(rollout_id=attempt, temperature=0.7)
        return config

    def forward(self, **inputs: Any) -> dspy.Prediction:
        started = time.perf_counter()
        errors: list[str] = []
        lm_error: BaseException | None = None
        adapter = ADAPTERS[self.adapter_name]()
        for attempt in range(self.retries + 1):
            try:
                token = _judging.set(True)
                try:
                    with dspy.context(adapter=adapter):
                        pred = self.predict(**inputs, config=self._config(attempt))
                finally:
                    _judging.reset(token)
            except Exception as exc:  # noqa: BLE001 - any LM/provider/parse failure is retried, then reported
                errors.append(describe_error(exc))
                if classify_lm_error(exc) != "output":
                    # DSPy already retried this with backoff; asking again would only multiply the wait.
                    lm_error = exc
                    break
                continue
            label = pred.get(self.output_name)
            if not isinstance(label, bool):
                errors.append(f"unparseable {self.output_name}: {label!r}")
                continue
            # Popped so that bootstrapped demos (which copy the prediction) never carry provider logprobs.
            p_yes = yes_probability(pred._store.pop("logprobs", None)) if self.use_logprobs else None
            if p_yes is None:
                # A parsed label is not a probability, so it is not calibrated either.
                score = raw = 1.0 if label else 0.0
                source = "label"
            else:
                raw = clamp_score(p_yes)
                score, source = clamp_score(self.calibration(raw)), "logprobs"
            judgement = Judgement(
                score, label, source, attempt + 1, errors, time.perf_counter() - started, raw_score=raw
            )
            return dspy.Prediction(**{self.output_name: label}, score=score, judgement=judgement)
        judgement = Judgement(
            None, None, "error", len(errors), errors, time.perf_counter() - started, lm_error=lm_error
        )
        return dspy.Prediction(**{self.output_name: None}, score=None, judgement=judgement)
