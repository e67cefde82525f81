"""Binary relevance judgements (document grading and strip filtering) as compilable DSPy predictors.

Small local models follow DSPy's default ``[[ ## field ## ]]`` chat format poorly for yes/no
decisions and spend ~15 output tokens on markers. :class:`LabelAdapter` asks for one word and reads
its token probabilities instead; the measurement behind this choice is in ``docs/grader.md``.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dspy

from ..adapters import LabelAdapter
from ..faults import classify_lm_error, describe_error
from .calibration import Calibration
from .evidence import FITTED_FEATURES, evidence_features
from .scoring import UnusableLogprobs, clamp_score, yes_probability

__all__ = ["BinaryJudge", "Judgement"]

_judging = contextvars.ContextVar("crag_dspy_judging", default=False)


class _ExpectedTruncation(logging.Filter):
    """Judges cap output at a few tokens on purpose (only the first decides); DSPy's "response was
    truncated" warning is noise for them, and stays on for every other call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_judging.get() and "truncated" in record.getMessage())


logging.getLogger("dspy.clients.lm").addFilter(_ExpectedTruncation())


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
    shown: dict[str, Any] | None = None  # the inputs the LM saw, when the judge's view changed them
    view_error: str | None = None  # the view failed and the LM saw the whole inputs
    evidence: dict[str, float] | None = None  # lexical evidence the calibration weighed (whole inputs)


class BinaryJudge(dspy.Module):
    """Wrap a one-bool-output signature: ask once, read P(yes) from logprobs, retry unparseable output.

    The inner ``predict`` is a bare ``dspy.Predict`` so that teleprompters can compile it and its demos
    survive ``save``/``load`` (compiled sub-modules vanish from saved state; bare predictors do not).
    ``calibration`` maps P(yes) to the reported score; it is fitted by ``optimize.compile`` and is the
    identity until then; a calibration that weighs lexical evidence reads it from the whole inputs,
    not the view. ``view`` (e.g. :class:`~crag_dspy.judges.view.SentenceFocus`) maps the inputs to what
    the LM is shown, so every caller (CRAG, the compile, the evaluation) judges the same view.
    """

    def __init__(
        self,
        signature: type[dspy.Signature],
        *,
        use_logprobs: bool = True,
        retries: int = 2,
        view: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ):
        super().__init__()
        self.predict = dspy.Predict(signature)
        self.view = view
        self.calibration = Calibration()
        (self.output_name,) = signature.output_fields
        self.use_logprobs = use_logprobs
        self.retries = retries

    def _config(self, attempt: int) -> dict[str, Any]:
        # The first token decides, so the first attempt generates only that one; a retry allows a few
        # more in case the model opened with markup ("**Yes").
        config: dict[str, Any] = {"max_tokens": 3 if attempt else 1}
        if self.use_logprobs:
            config.update(logprobs=True, top_logprobs=10)
        if attempt:
            # A retry must not be answered from the cache with the same bad output.
            config.update(rollout_id=attempt, temperature=0.7)
        return config

    def cache_state(self) -> tuple[Any, ...]:
        """What its judgements depend on, for caches of them: its DSPy state (demos, instructions,
        calibration), how it asks the LM and what its view shows."""
        return self.dump_state(), self.use_logprobs, self.retries, getattr(self.view, "key", None)

    def shown_inputs(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """What the LM is shown for ``inputs``, and why the view failed (then it is shown everything)."""
        if self.view is None:
            return inputs, None
        try:
            return self.view(inputs), None
        except Exception as exc:  # noqa: BLE001 - a broken view must not cost the judgement
            return inputs, describe_error(exc)

    def evidence(self, inputs: dict[str, Any], *, weighed_only: bool = True) -> dict[str, float] | None:
        """The lexical evidence of ``inputs`` (the question and the whole judged text) that the
        calibration weighs, None when it weighs none; with ``weighed_only`` False, the features a new
        calibration is fitted on (:data:`~crag_dspy.judges.evidence.FITTED_FEATURES`)."""
        if weighed_only and not self.calibration.uses_evidence:
            return None
        question, text = (str(inputs[name]) for name in list(self.predict.signature.input_fields)[:2])
        return evidence_features(
            question, text, self.calibration.weights if weighed_only else FITTED_FEATURES
        )

    def rescore(self, judgement: Judgement, inputs: dict[str, Any]) -> float | None:
        """``judgement``'s score under this judge's current calibration, without asking the LM again
        (the compile compares calibrations fitted on one set of LM answers this way)."""
        if judgement.score_source != "logprobs" or judgement.raw_score is None:
            return judgement.score  # a parsed label or a failure is never calibrated
        return clamp_score(self.calibration(judgement.raw_score, self.evidence(inputs)))

    def forward(self, **inputs: Any) -> dspy.Prediction:
        started = time.perf_counter()
        errors: list[str] = []
        lm_error: BaseException | None = None
        adapter = LabelAdapter()
        evidence = self.evidence(inputs)
        shown, view_error = self.shown_inputs(inputs)
        changed = {k: v for k, v in shown.items() if inputs.get(k) != v} or None
        # What this call saw and weighed, recorded the same way on success and on failure.
        seen = {"shown": changed, "view_error": view_error, "evidence": evidence}
        inputs = shown
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
            try:
                p_yes = yes_probability(pred._store.pop("logprobs", None)) if self.use_logprobs else None
            except UnusableLogprobs as exc:  # unusable output, as an unparseable label: a new rollout
                errors.append(describe_error(exc))
                continue
            if p_yes is None:
                # A parsed label is not a probability, so it is not calibrated either.
                score = raw = 1.0 if label else 0.0
                source = "label"
            else:
                raw = clamp_score(p_yes)
                score, source = clamp_score(self.calibration(raw, evidence)), "logprobs"
            judgement = Judgement(
                score,
                label,
                source,
                attempt + 1,
                errors,
                time.perf_counter() - started,
                raw_score=raw,
                **seen,
            )
            return dspy.Prediction(**{self.output_name: label}, score=score, judgement=judgement)
        judgement = Judgement(
            None,
            None,
            "error",
            len(errors),
            errors,
            time.perf_counter() - started,
            lm_error=lm_error,
            **seen,
        )
        return dspy.Prediction(**{self.output_name: None}, score=None, judgement=judgement)
