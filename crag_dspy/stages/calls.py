"""How stages call the LM and read untrusted text: retries, concurrency, one judgement per text shown."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import dspy

from ..faults import classify_lm_error, describe_error
from ..generation import text_config, text_format
from ..grounding import defused_note
from ..judges.llm import BinaryJudge, Judgement
from ..run import QuestionRun
from .base import part_state, state_key

__all__ = ["count_lm_outcome", "each_call", "judge_once", "predict_with_retries", "untrusted"]

T = TypeVar("T")
R = TypeVar("R")


def each_call(call: Callable[[T], R], items: Sequence[T], concurrency: int) -> Iterator[R]:
    """``call`` over ``items``, yielding the results in order, with up to ``concurrency`` calls in
    flight. Each call runs in a copy of this thread's context, so that DSPy's settings
    (``dspy.context(lm=...)``), usage tracking and callbacks' parent spans carry over. The caller closes
    the iterator when it stops early (the LM is down): calls not yet started are cancelled."""
    limit = min(concurrency, len(items))
    if limit <= 1:
        yield from map(call, items)
        return
    with ThreadPoolExecutor(limit, thread_name_prefix="crag-call") as pool:
        futures = [pool.submit(contextvars.copy_context().run, call, item) for item in items]
        try:
            for future in futures:
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def judge_once(judge: BinaryJudge, name: str, run: QuestionRun, **inputs: str) -> tuple[Judgement, bool]:
    """``judge``'s judgement of ``inputs`` and whether the LM was asked for it (then the caller counts
    its outcome, once the trace holds what it judged). ``name`` names the judge (``"grader"`` or
    ``"strip_filter"``). The LM is asked once per distinct text a judge in one state is shown, through
    the run's stage cache (two chunks of one document with the same title and best sentence, a web
    result that repeats a passage): a repeat reuses the first P(yes), calibrated with its own lexical
    evidence."""
    asked = False

    def ask() -> Judgement:
        nonlocal asked
        asked = True
        return judge(**inputs).judgement

    if name not in run.states:
        run.states[name] = state_key(part_state(judge))
    shown = tuple(sorted(judge.shown_inputs(inputs)[0].items()))
    first = run.cache.get(("judge", run.states[name], name, shown), ask)
    if asked:
        return first, True
    return replace(first, score=judge.rescore(first, inputs), evidence=judge.evidence(inputs)), False


def count_lm_outcome(judgement: Judgement, stage: str, run: QuestionRun) -> None:
    """Count a judgement's LM call towards "the LM is down" (:class:`~crag_dspy.faults.LMHealth`)."""
    if judgement.lm_error is not None:
        run.lm.failed(stage, judgement.lm_error)
    else:
        run.lm.succeeded()


def predict_with_retries(
    predictor: dspy.Predict, what: str, run: QuestionRun, retries: int, **inputs: Any
) -> dspy.Prediction | None:
    """``predictor``'s prediction in the bare text format, with ``retries`` new rollouts after an
    unusable output; None (errors in the trace) when every attempt failed or the LM failed."""
    for attempt in range(retries + 1):
        try:
            with text_format():
                pred = predictor(**inputs, config=text_config(attempt))
        except Exception as exc:  # noqa: BLE001 - recorded, retried, then degraded
            run.error(f"{what} attempt {attempt + 1} failed: {describe_error(exc)}")
            if classify_lm_error(exc) != "output":
                run.lm.failed(what, exc)  # DSPy already retried it with backoff; may stop the run
                return None
            continue
        run.lm.succeeded()
        return pred
    return None


def untrusted(items: list, sanitize: Callable[[Any], tuple[Any, Any]], run: QuestionRun) -> list:
    """Passages or web results made inert (see ``untrusted.py``); defused injections are traced."""
    clean = []
    for item in items:
        item, removed = sanitize(item)
        note = defused_note(getattr(item, "doc_id", None) or item.url, removed) if removed else None
        if note and note not in run.trace.defused:  # the witness search may read a page again
            run.trace.defused.append(note)
        clean.append(item)
    return clean
