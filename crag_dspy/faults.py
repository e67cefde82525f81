"""How CRAG fails: the typed errors of a question that cannot be answered, and LM fault classification.

Transient LM faults (timeouts, connection errors, rate limits, 5xx) are retried by DSPy itself
(``dspy.LM(num_retries=...)``: exponential backoff 1 s, 2 s, 4 s ..., honouring ``Retry-After``), so a
failed call that reaches CRAG has already been retried. CRAG then takes each stage's fallback (see
``docs/reliability.md``) and counts the failure: two failed calls in a row, or one that cannot get
better by waiting (authentication, billing, configuration), mean the LM is down, and the question stops
with :class:`LMUnavailableError` instead of spending minutes in backoff on every remaining stage. A
request the server refuses (HTTP 400 or 404: a wrong path in the base URL, a proxy refusing the model
name) counts as a failed call too: an LM that refuses everything is down, not a model that knows nothing.
So does a reply that is no chat completion at all (HTTP 2xx with an HTML page from a proxy or gateway,
or JSON of another shape), or an empty one (no choice, or a message whose content is null): an LM that
answers only such replies is down too. A completion whose *text*
the adapter cannot parse is another matter: the LM answered, and a new rollout may do better.

A batch run (:func:`watch_lm`) applies the rule across questions, and needs the failures in a row to
come from two questions or more (:func:`asking` says which question a call is for): one question whose
every call fails is that question's error, and the run goes on.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.exceptions import (
    ContextWindowExceededError,
    LMAuthError,
    LMBillingError,
    LMConfigurationError,
    LMInvalidRequestError,
    LMProviderError,
    LMUnexpectedError,
    LMUnsupportedModelError,
    is_retryable_lm_error,
)

from .adapters import mark_unfinished_replies
from .lm_transport import patch_lm_transport
from .redaction import redact

if TYPE_CHECKING:
    from .trace import CRAGTrace

__all__ = [
    "CONSECUTIVE_LM_FAILURES",
    "FAILED_CALLS",
    "MAX_RETRY_WAIT_S",
    "CRAGRunError",
    "FailureStreak",
    "LMDownError",
    "LMFault",
    "LMHealth",
    "LMUnavailableError",
    "LMWatch",
    "RetrievalError",
    "RunCancelled",
    "asking",
    "classify_lm_error",
    "describe_error",
    "raise_if_lm_down",
    "watch_lm",
]

CONSECUTIVE_LM_FAILURES = 2
"""Failed LM calls in a row (each already retried by DSPy) after which a question stops."""

LMFault = Literal["fatal", "unavailable", "refused", "unreadable", "output"]

FAILED_CALLS: frozenset[LMFault] = frozenset({"fatal", "unavailable", "refused", "unreadable"})
"""The kinds of :func:`classify_lm_error` that are a failed LM call (counted towards "the LM is down");
the rest (``output``) is an answer that could not be used."""

MAX_RETRY_WAIT_S = 60.0
"""The longest one LM call waits in all between its attempts (each ``Retry-After`` or backoff wait
counts). A retry whose wait would take the call past it is not waited for: the call fails at once (the
LM is unavailable for it) instead of sleeping an hour, or 59 s on every retry.

``CRAG_LM_RETRIES`` (at most 5) backs off 31 s at most, so the cap changes nothing without a
``Retry-After``."""

_RETRY_WAITED: ContextVar[float] = ContextVar("crag_dspy_retry_waited", default=0.0)
"""Seconds the LM call running in this context (thread or task) has waited between its attempts."""


def _patch_dspy_retries() -> None:
    """Make DSPy's retry loop wait no longer than :data:`MAX_RETRY_WAIT_S` in all, per LM call.

    DSPy sleeps for any finite ``Retry-After`` hint, uncapped, and the LM timeout does not bound the
    sleep: one 429 with ``Retry-After: 3600`` held ``ask`` (and a ``serve`` worker) for an hour, and a
    hint just under a per-wait cap (59 s) was waited for on every retry of every call: about 4 minutes
    before a question learnt that the LM is down. DSPy gives no setting for this, so its retry predicate
    is wrapped (idempotently): a retry whose wait (DSPy's own ``_delay``: the hint, else the backoff)
    would take the call's waits past the cap is not made, and the error reaches CRAG as a failed call,
    which counts towards "the LM is down".
    """
    from dspy.clients import execution

    original = execution._retryable
    if getattr(original, "_crag_capped", False):
        return

    def retryable(state: Any, exc: Exception, attempt: int, retries: int) -> bool:
        if not original(state, exc, attempt, retries):
            return False
        # DSPy's loop asks after each failed attempt, in the calling thread or task: attempt 0 is a new call.
        waited = _RETRY_WAITED.get() if attempt else 0.0
        wait = execution._delay(exc, attempt)
        if waited + wait > MAX_RETRY_WAIT_S:
            exc.crag_waited_s = waited  # type: ignore[attr-defined]  # for describe_error
            return False
        _RETRY_WAITED.set(waited + wait)
        return True

    retryable._crag_capped = True  # type: ignore[attr-defined]
    execution._retryable = retryable


def waits_too_long(exc: BaseException) -> bool:
    """Whether ``exc`` asks (``Retry-After``) for a wait that would take its call's waits (those already
    made, when the retry loop refused it) past :data:`MAX_RETRY_WAIT_S`."""
    hint = getattr(exc, "retry_after", None)
    try:
        return hint is not None and float(hint) + getattr(exc, "crag_waited_s", 0.0) > MAX_RETRY_WAIT_S
    except (TypeError, ValueError, OverflowError):
        return False


# At import: every dspy.LM a CRAG program calls (built here or passed in by a library user) is capped.
_patch_dspy_retries()

# At import, like the retry cap above: every LM call a CRAG program makes is bounded (a total deadline,
# a reply size cap, and a final 2xx only: see crag_dspy/lm_transport.py).
patch_lm_transport()
# Likewise: a reply cut at max_tokens or by a content filter says so to CRAG's adapters.
mark_unfinished_replies()


_QUESTION: ContextVar[str | None] = ContextVar("crag_dspy_question", default=None)


@contextmanager
def asking(question: str) -> Iterator[None]:
    """Mark the LM calls made inside the block (and in threads that copy its context) as ``question``'s,
    so that a batch's :class:`LMWatch` can tell one question failing from an LM that is down."""
    token = _QUESTION.set(question)
    try:
        yield
    finally:
        _QUESTION.reset(token)


class CRAGRunError(RuntimeError):
    """A question could not be answered; ``trace`` records everything done up to the failure."""

    def __init__(self, message: str, trace: CRAGTrace):
        super().__init__(message)
        self.trace = trace


class RunCancelled(CRAGRunError):
    """The run's caller stopped waiting (a deadline passed, an async task was cancelled): the run ended
    before its next stage instead of spending the LM on an answer nobody reads."""


class RetrievalError(CRAGRunError):
    """The internal-knowledge store failed during a question (e.g. the Chroma server went away).

    Raised rather than degraded: without internal knowledge CRAG would answer from the web alone and
    present it as a normal answer, hiding an outage the operator must see.
    """


class LMUnavailableError(CRAGRunError):
    """The LM is down (unreachable, refusing, or failing call after call), or it gave no usable answer.

    ``stage`` names the stage whose call failed last.
    """

    def __init__(self, message: str, trace: CRAGTrace, stage: str):
        super().__init__(message, trace)
        self.stage = stage


def classify_lm_error(exc: BaseException) -> LMFault:
    """``fatal``: waiting will not help (bad key, billing, unknown model); ``unavailable``: transient
    and already retried with backoff by DSPy; ``refused``: the server refused the request (HTTP 400,
    404), which neither waiting nor a new rollout changes; ``unreadable``: the server said 2xx but its
    reply is no chat completion (not JSON, or not a completion object: a proxy's HTML page; or an empty
    one, without a choice or content: :mod:`crag_dspy.lm_transport`), or the
    final status is no reply at all (1xx, or a 3xx redirect, which is not followed), which a new rollout
    does not change either; ``output``: the LM answered but unusably (text the adapter
    cannot parse, or the prompt is too long for it), which a new rollout may fix, or which is this
    question's alone."""
    if isinstance(exc, (LMAuthError, LMBillingError, LMConfigurationError, LMUnsupportedModelError)):
        return "fatal"
    # DSPy's native client raises a provider error carrying the reply's HTTP status when a 2xx reply is
    # not JSON, and an "unexpected" error when its JSON is no completion object ("choices must be an
    # array"); an adapter's parse error (the completion's text) is neither.
    # So does the transport for a final status that is no reply (1xx, or a 3xx: redirects are not followed).
    status = getattr(exc, "status", None)
    if isinstance(exc, LMProviderError) and isinstance(status, int) and status < 400:
        return "unreadable"
    if isinstance(exc, LMUnexpectedError):
        return "unreadable"
    # Builtin network errors come from LM clients that are not LiteLLM (custom dspy.BaseLM subclasses).
    if is_retryable_lm_error(exc) or isinstance(exc, (ConnectionError, TimeoutError)):
        return "unavailable"
    if isinstance(exc, LMInvalidRequestError) and not isinstance(exc, ContextWindowExceededError):
        return "refused"
    return "output"


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """One line for traces: the error type and the first line of its message, keys redacted.

    DSPy's LM errors carry multi-line "To fix" advice after the first line; a trace needs what happened.
    """
    lines = str(exc).strip().splitlines()
    # Redacted before it is cut: a secret cut in two (or a URL cut before its "@") would no longer match.
    first = redact(_user_words(lines[0]))[:limit] if lines else ""
    if waits_too_long(exc):
        waited = getattr(exc, "crag_waited_s", 0.0)
        cap = (
            f"past the {MAX_RETRY_WAIT_S:g} s cap on one call's waits ({waited:g} s waited already)"
            if waited
            else f"longer than the {MAX_RETRY_WAIT_S:g} s cap"
        )
        first = (
            f"asked to retry after {float(getattr(exc, 'retry_after', 0)):g} s, {cap}: not retried; {first}"
        )[:limit]
    return f"{type(exc).__name__}: {first}".rstrip(": ")


_READ_TIMEOUT = re.compile(r"no bytes for ([\d.]+)s; this is lm15's read timeout.*?(?:longer|$)")


def _user_words(line: str) -> str:
    """``line`` with DSPy's internal advice replaced by the setting a user changes: its read-timeout
    message names ``Timeouts(read=...)``, an API of its client that no CRAG user calls."""
    return _READ_TIMEOUT.sub(
        r"no reply for \1 s (the LM timeout, CRAG_LM_TIMEOUT_S: raise it if the model needs longer)", line
    )


class FailureStreak:
    """The rule that says an LM is down, shared by one question (:class:`LMHealth`) and a whole batch
    (:class:`LMWatch`): a fatal error, or ``CONSECUTIVE_LM_FAILURES`` failed calls in a row (each already
    retried by DSPy, refused by the server, or answered with a reply that is no completion) from at
    least ``questions`` different questions. A response resets the streak, an unusable answer included:
    the LM answered.

    Args:
        questions: how many different questions the failures in a row must come from: 1 for one
            question's own run; 2 for a batch, where one question whose every call fails (a prompt the
            provider chokes on) is that question's error and not an outage.
    """

    def __init__(self, questions: int = 1) -> None:
        self.in_a_row = 0
        self.questions = questions
        self._failing: set[Hashable] = set()
        self._kinds: set[LMFault] = set()

    def record(self, exc: BaseException | None, question: Hashable = None) -> str | None:
        """Count one call (``exc``: how it failed, None when it got a response; ``question``: which
        question it was for, None for a call of no question, which counts as its own); why the LM is
        down now, or None."""
        kind = classify_lm_error(exc) if exc is not None else None
        if kind not in FAILED_CALLS:
            self.in_a_row = 0
            self._kinds.clear()
            self._failing.clear()
            return None
        self.in_a_row += 1
        self._kinds.add(kind)
        self._failing.add(question if question is not None else object())
        if kind == "fatal":
            return "refuses the requests"
        if self.in_a_row >= CONSECUTIVE_LM_FAILURES and len(self._failing) >= self.questions:
            calls = f"{self.in_a_row} calls" + (
                f" of {len(self._failing)} questions" if self.questions > 1 else ""
            )
            if self._kinds == {"refused"}:
                return (
                    f"refused {calls} in a row, each refused by the server (a wrong path in the base URL, or a "
                    "model it does not serve?)"
                )
            if self._kinds == {"unreadable"}:
                return (
                    f"answered {calls} in a row with a reply that is no chat completion or an empty one (an "
                    "HTML page from a proxy or gateway, another service at the base URL, or a completion with "
                    "no choice or no content?)"
                )
            return f"failed {calls} in a row, each after retries with backoff"
        return None


class LMHealth:
    """Decides, for one question, when the LM is down (:class:`FailureStreak`). Never shared between
    threads, like the question's trace it writes to."""

    def __init__(self, trace: CRAGTrace):
        self.trace = trace
        self.streak = FailureStreak()

    def succeeded(self) -> None:
        self.streak.record(None)

    def failed(self, stage: str, exc: BaseException) -> None:
        """Count an LM call that failed after DSPy's retries; raise :class:`LMUnavailableError` (the
        message also goes into the trace's errors) once the LM is down."""
        why = self.streak.record(exc)
        if why is None:
            return
        message = f"the LM {self.trace.lm_model} {why}; stopped at stage {stage!r}: {describe_error(exc)}"
        self.trace.errors.append(message)
        raise LMUnavailableError(message, self.trace, stage) from exc


class LMDownError(RuntimeError):
    """A batch run (an evaluation, a compile) stopped because its LM is down (:class:`LMWatch`).

    Not a :class:`CRAGRunError`: a batch counts one failed question as a wrong answer and goes on, but
    an LM outage would fail every remaining question, each after minutes of backoff.
    """


class LMWatch(BaseCallback):
    """:class:`LMHealth`'s rule over a whole batch run: every LM call of the run (any question, any
    thread, baselines and judges included) reports here through DSPy's callbacks, and a fatal error or
    ``CONSECUTIVE_LM_FAILURES`` failed calls in a row (each already retried by DSPy) from two questions
    or more (:func:`asking`) mean the LM is down. Any call that gets a response resets the count, so one
    bad question (an unusable answer, failed calls, every call failing) is that question's wrong answer,
    not an outage. Install it with :func:`watch_lm`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, tuple[str, str | None]] = {}
        self.streak = FailureStreak(questions=2)
        self.down: str | None = None
        """Why the LM counts as down now (None while it answers)."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        # Callbacks run in the caller's context: the question is the one the call is made for.
        with self._lock:
            self._models[call_id] = (getattr(instance, "model", type(instance).__name__), _QUESTION.get())

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        with self._lock:
            model, question = self._models.pop(call_id, ("?", None))
            why = self.streak.record(exception, question)
            self.down = None if why is None else f"the LM {model} {why} ({describe_error(exception)})"

    def check(self) -> None:
        """Raise :class:`LMDownError` when the LM counts as down."""
        down = self.down
        if down is not None:
            raise LMDownError(f"{down}; the run stopped")


@contextmanager
def watch_lm() -> Iterator[LMWatch]:
    """Watch every LM call made inside the block (threads started from it too, when they copy the
    context, as :func:`optimize.parallel.map_questions` does); reuses a watch already installed."""
    current = dspy.settings.callbacks or []
    found = next((c for c in current if isinstance(c, LMWatch)), None)
    if found is not None:
        yield found
        return
    watch = LMWatch()
    with dspy.context(callbacks=[*current, watch]):
        yield watch


def raise_if_lm_down() -> None:
    """In a batch run under :func:`watch_lm`: raise :class:`LMDownError` once the LM counts as down
    (a no-op outside one). Call it between questions, and before counting a failed question wrong."""
    for callback in dspy.settings.callbacks or []:
        if isinstance(callback, LMWatch):
            callback.check()
