"""One loaded CRAG program answering questions, with every failure attributed to a dependency.

The module is shared by all requests; each call builds its own trace (``CRAG.new_run``) and runs in its
own DSPy context, so concurrent requests never mix traces, LM usage or the failure accounting below.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePath
from typing import Any

import dspy

from ..app import LoadedProgram
from ..events import EventCallback, TokenCallback, run_with_tokens
from ..faults import LMUnavailableError, RetrievalError
from ..flag_policy import OnFlag, judge_flag
from ..program import program_config
from ..trace import CRAGTrace
from ..version import __version__
from .client_trace import client_citations
from .schemas import AskResponse, Dependency, Health, ProgramInfo

__all__ = ["DependencyError", "ProgramService", "without_paths"]

log = logging.getLogger(__name__)


class DependencyError(RuntimeError):
    """A dependency failed so that no answer could be given; ``dependency`` names it ('lm' or 'store')."""

    def __init__(self, dependency: Dependency, message: str, trace: CRAGTrace | None = None):
        super().__init__(message)
        self.dependency = dependency
        self.trace = trace


class ProgramService:
    """Serve ``loaded``: answer questions and describe the program.

    CRAG degrades on its own when a grade, a strip, the rewrite or the web search fails, and says so
    in the trace; such answers are returned with ``degraded=True``. When nothing useful can come back,
    CRAG raises a typed error (docs/reliability.md) that becomes a :class:`DependencyError`: the store
    failed (no documents to judge), or the LM is down or gave no usable answer.
    """

    def __init__(self, loaded: LoadedProgram):
        self.loaded = loaded
        self.crag = loaded.crag

    def warm_up(self) -> None:
        """Load what the first question would otherwise wait for, before the server listens: one
        retrieval loads the query embedder and opens the store's collection (5 s on 2 CPU cores,
        which a first request's first stage event would otherwise wait)."""
        self.crag.retriever.retrieve("warm-up", 1)

    def ask(
        self,
        question: str,
        *,
        history: Sequence[Mapping[str, str]] | None = None,
        on_start: Callable[[CRAGTrace], None] | None = None,
        cancel: threading.Event | None = None,
        on_event: EventCallback | None = None,
        on_token: TokenCallback | None = None,
        on_flag: OnFlag = "warn",
    ) -> AskResponse:
        """Answer ``question`` with the full trace; ``on_start`` gets the trace as the run begins,
        ``history`` holds the conversation's earlier turns (:mod:`crag_dspy.conversation`),
        setting ``cancel`` stops the run as its next stage starts (a deadline passed), ``on_event``
        gets each stage event (:mod:`crag_dspy.events`) in the run's thread, ``on_token`` each piece
        of the answer's draft as the LM writes it (when the LM streams:
        :func:`~crag_dspy.events.run_with_tokens`), and ``on_flag`` says what a flagged answer becomes
        (:mod:`crag_dspy.flag_policy`; the trace keeps what CRAG answered)."""
        started = time.perf_counter()
        inputs: dict[str, Any] = {
            "question": question,
            "history": history,
            "on_start": on_start,
            "cancel": cancel,
            "on_event": on_event,
        }
        try:
            if on_token is None:
                prediction = self.crag(**inputs)
            else:
                prediction = run_with_tokens(self.crag, on_token, **inputs)
        except RetrievalError as exc:
            raise DependencyError("store", str(exc), exc.trace) from exc
        except LMUnavailableError as exc:
            raise DependencyError("lm", str(exc), exc.trace) from exc
        seconds = round(time.perf_counter() - started, 4)
        trace: CRAGTrace = prediction.trace
        log.info("%s in %.1f s", trace.action, seconds)  # the access log names the question by a hash
        verdict = judge_flag(trace, on_flag, client_citations(trace))
        return AskResponse(
            answer=verdict.answer,
            status=verdict.status,
            action=trace.action,
            domain=self.loaded.domain,
            degraded=bool(trace.errors or trace.fallbacks),
            seconds=seconds,
            citations=verdict.citations,
            other_side=verdict.other_side,
            trace=trace,
        )

    def health(self) -> Health:
        """Health as a server of this one program would say it (a server of several lists them all)."""
        domain = self.loaded.domain
        return Health(compiled=self.loaded.compiled, domain=domain, domains=[domain], version=__version__)

    def info(self) -> ProgramInfo:
        crag, document = self.crag, self.loaded.document
        lm = crag.lm or dspy.settings.lm
        # Clients learn nothing of the server's file system: a path becomes its last part.
        metadata = without_paths(dict(document["metadata"])) if document else {}
        if document:
            note = f"compiled program {self.loaded.path.name} for domain {self.loaded.domain!r}"
        else:
            note = (
                "uncompiled default program: thresholds and prompts are the defaults; "
                "compile one for this domain with `crag-dspy compile` and serve it with --program"
            )
        return ProgramInfo(
            compiled=self.loaded.compiled,
            path=self.loaded.path.name if self.loaded.path else None,
            domain=self.loaded.domain,
            domains=[self.loaded.domain],
            lower=crag.thresholds.lower,
            upper=crag.thresholds.upper,
            thresholds_by_type=crag.thresholds.by_type,
            lm=getattr(lm, "model", None) if lm is not None else None,
            retriever=crag.retriever.name,
            web_backend=getattr(crag.web_search, "name", type(crag.web_search).__name__),
            config=without_paths(program_config(crag)),
            metadata=metadata,
            scores=metadata.get("scores"),
            created=document["metadata"].get("created") if document else None,
            note=note,
        )


# POSIX absolute or home-relative, a Windows drive or UNC path, or a file: URL.
_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\|file:)")


def without_paths(value: Any) -> Any:
    """``value`` (JSON-like) with every absolute file path replaced by its last part."""
    if isinstance(value, dict):
        return {key: without_paths(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [without_paths(item) for item in value]
    if isinstance(value, str) and _PATH.match(value):
        return PurePath(value.removeprefix("file:").replace("\\", "/")).name or "-"
    return value
