"""The first stage of a follow-up: rewrite it with the conversation into a standalone question."""

from __future__ import annotations

from ..conversation import Turn, history_text
from ..generation import before_marker
from ..grounding import defused_note
from ..redaction import redact
from ..run import QuestionRun
from .base import Stage
from .calls import predict_with_retries

__all__ = ["Condense", "clean_standalone"]

_MAX_STANDALONE_CHARS = 2000


def clean_standalone(raw: object) -> str:
    """A condenser's reply as one question on one line, without quotes or a run-in marker ("" for none)."""
    # Keys an LM echoed are redacted as in clean_query: the standalone question is traced and may be the
    # web search query.
    text = redact(" ".join(before_marker(raw or "").split())).strip("\"'")
    return text[:_MAX_STANDALONE_CHARS]


class Condense(Stage[str]):
    """The question every later stage reads: the follow-up rewritten to stand alone with the history
    (``turns``, oldest first), or the question as asked when the rewrite fails (a fallback says so).

    Never run without history: a question that has none is its own standalone question, with no LM call.
    """

    name = "condense"
    uses = ("condenser",)
    reads = ("lm_calls.retries",)

    def compute(self, question: str, turns: list[dict[str, str]]) -> str:
        # The text is made inert here, inside the cached computation, so that its defused note is kept
        # with the value and replayed into every run that reuses it.
        text, removed = history_text([Turn(**turn) for turn in turns])
        if removed:
            self.run.trace.defused.append(defused_note("history", removed))
        retries = self.program.config.lm_calls.retries
        pred = predict_with_retries(
            self.program.condenser, "question condensing", self.run, retries, history=text, question=question
        )
        standalone = clean_standalone(pred.standalone_question if pred is not None else "")
        if not standalone:
            self.run.fallback(
                "condensing the follow-up with the history failed; answered the question as asked"
            )
            return question
        return standalone

    def record(self, value: str, run: QuestionRun) -> None:
        run.trace.standalone_question = value
        run.emit("standalone", question=value)
