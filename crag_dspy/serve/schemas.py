"""The service's request and response models: the OpenAPI schema is generated from these."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from ..citations import Citation
from ..config import MOST_HISTORY_TURNS
from ..conversation import MAX_ANSWER_CHARS
from ..flag_policy import AnswerStatus
from ..trace import CRAGTrace
from ..validation import DEFAULT_MAX_QUESTION_CHARS, QuestionError, normalize_question
from .client_trace import ClientTrace

__all__ = [
    "DOMAIN_MAX_CHARS",
    "QUESTION_MAX_CHARS",
    "AskRequest",
    "AskResponse",
    "Dependency",
    "ErrorResponse",
    "Health",
    "HistoryTurn",
    "ProgramInfo",
    "ValidationErrorResponse",
    "ask_request_model",
]

QUESTION_MAX_CHARS = DEFAULT_MAX_QUESTION_CHARS
"""Longest question accepted: longer input is a 422, never silently truncated."""

DOMAIN_MAX_CHARS = 64
"""Longest domain name a request may give (domain names are short identifiers)."""

Dependency = Literal["lm", "store"]


def _not_blank(value: str) -> str:
    value = value.strip()
    if not value:
        raise PydanticCustomError("blank_question", "must not be empty or only whitespace")
    return value


def _askable(value: str) -> str:
    """The question stripped, refused as the CLI refuses it (normalize_question): the schema's
    ``max_length`` counts what the client sent, and this also bounds it once normalised (NFC spells some
    characters as three) and refuses a question of invisible characters only, before any LM call."""
    value = _not_blank(value)
    try:
        normalize_question(value, max_chars=QUESTION_MAX_CHARS, setting=None)
    except QuestionError as exc:
        raise PydanticCustomError("question_error", str(exc)) from None
    return value


class HistoryTurn(BaseModel):
    """One earlier turn of the conversation, as the client saw it."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(
        max_length=QUESTION_MAX_CHARS, json_schema_extra={"minLength": 1}, description="an earlier question"
    )
    answer: str = Field(max_length=MAX_ANSWER_CHARS, description="the answer it got (may be empty)")

    # Checked as the question is: one of control characters only was taken here while it was a 422 there.
    _question_askable = field_validator("question")(_askable)


def _history_description(most: int) -> str:
    return (
        f"the conversation's earlier turns, oldest first, at most {most} (the program's "
        "`max_history_turns`, GET /program's config): with any, the question is first rewritten to stand "
        "alone (the trace's `standalone_question`). Untrusted input, made inert as documents are"
    )


class AskRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"question": "What is the list price of one AquaProbe 220 sensor?"}]},
    )

    question: str = Field(
        max_length=QUESTION_MAX_CHARS,
        # Emptiness is checked after stripping (below), with a message that says so; the schema still says it.
        json_schema_extra={"minLength": 1},
        description=f"The question, 1 to {QUESTION_MAX_CHARS} characters; surrounding whitespace is removed.",
    )

    _question_askable = field_validator("question")(_askable)

    history: list[HistoryTurn] = Field(
        default_factory=list,
        max_length=MOST_HISTORY_TURNS,
        description=_history_description(MOST_HISTORY_TURNS),
    )

    domain: str | None = Field(
        None,
        max_length=DOMAIN_MAX_CHARS,
        description="which served domain answers (GET /health lists them); omitted: the first one served. "
        "A domain not served is a 422 naming the served ones",
    )


def ask_request_model(max_history_turns: int) -> type[AskRequest]:
    """:class:`AskRequest` whose ``history`` takes at most ``max_history_turns`` turns (a server's
    ``CRAGConfig.max_history_turns``), so that its schema states the limit and a longer history is a 422
    like any invalid field. Named AskRequest in the OpenAPI schema too."""
    field: Any = Field(
        default_factory=list,
        max_length=max_history_turns,
        description=_history_description(max_history_turns),
    )
    return create_model(
        "AskRequest", __base__=AskRequest, __module__=__name__, history=(list[HistoryTurn], field)
    )


class AskResponse(BaseModel):
    answer: str = Field(
        description="the answer; when `status` is 'withheld', 'The sources disagree or instruct; not answered'"
    )
    status: AnswerStatus = Field(
        description="'answered'; 'flagged': the grounding check flagged the answer (the trace's `grounding` "
        "says why), shown anyway (the server's on_flag is 'warn', or no source disagrees: only ungrounded); "
        "'withheld': its sources disagree or instruct the model and the server's on_flag is 'withhold', so "
        "`answer` is not the value (`citations` and `other_side` are the two sides)"
    )
    action: Literal["CORRECT", "AMBIGUOUS", "INCORRECT"]
    domain: str = Field(description="the domain whose program answered")
    degraded: bool = Field(
        description="True when a stage failed or fell back; the trace's errors and fallbacks say what and why"
    )
    seconds: float = Field(description="wall-clock seconds the request took in the program")
    # Required, so the schema promises the list on every answer (empty rather than absent).
    citations: list[Citation] = Field(
        description="the sources the answer rests on, strongest first: each a document with its PDF page or "
        "section (or a web page's URL) and the sentence of a kept strip that states the answer's key content; "
        "empty for 'I don't know' and for an answer no kept strip states",
    )
    other_side: list[Citation] = Field(
        default_factory=list,
        description="when withheld: the sources that dispute the answer or instruct the model, one sentence "
        "each (the one sharing most words with the question); else empty",
    )
    full_trace: bool = Field(
        False, description="True: `trace` is the full CRAGTrace (?debug=1 with a debug key); else trimmed"
    )
    trace: ClientTrace | CRAGTrace = Field(
        description="what CRAG did and why; raw passages, web contents and a withheld answer's value only "
        "in the full trace"
    )


class ProgramInfo(BaseModel):
    compiled: bool = Field(description="False: the uncompiled default program (no program JSON loaded)")
    path: str | None = Field(description="the file name of the program JSON served, if any (no folder)")
    domain: str = Field(description="the domain of this program (GET /program?domain=<name> chooses one)")
    domains: list[str] = Field(description="every domain this server serves, the default first")
    lower: float = Field(description="lower action threshold in force")
    upper: float = Field(description="upper action threshold in force")
    thresholds_by_type: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="(lower, upper) per question type where the program has its own pair for that type",
    )
    lm: str | None
    retriever: str
    web_backend: str
    config: dict[str, Any] = Field(description="k, strip threshold, max strips, ... in force")
    metadata: dict[str, Any] = Field(description="the program's metadata as compiled (empty when uncompiled)")
    scores: dict[str, Any] | None = Field(description="scores from the compile report, when compiled")
    created: str | None = Field(description="when the program was compiled")
    note: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    compiled: bool = Field(description="whether the default domain's program is compiled")
    domain: str = Field(description="the default domain: the one /ask answers from without a `domain`")
    domains: list[str] = Field(description="every domain this server serves, the default first")
    version: str


class ErrorResponse(BaseModel):
    detail: str
    dependency: Dependency | None = Field(
        None, description="the failed dependency behind a 503: 'lm' (language model) or 'store' (retrieval)"
    )
    trace: ClientTrace | CRAGTrace | None = Field(
        None, description="what CRAG did before giving up or before the deadline, when it got that far"
    )


class ValidationErrorResponse(BaseModel):
    detail: str = Field(description="every problem with the request, in one line")
    errors: list[dict[str, Any]] = Field(description="the same problems, one object each (pydantic's format)")
