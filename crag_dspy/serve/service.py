"""One loaded CRAG program answering questions, with every failure attributed to a dependency.

The module is shared by all requests; each call builds its own trace (``CRAG.new_run``) and runs in its
own DSPy context, so concurrent requests never mix traces, LM usage or the failure accounting below.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from .. import __version__
from ..app import LoadedProgram
from ..program import program_config
from ..protocols import Passage, Retriever
from ..trace import CRAGTrace
from .schemas import AskResponse, Dependency, Health, ProgramInfo

__all__ = ["DependencyError", "ProgramService"]

log = logging.getLogger(__name__)


class DependencyError(RuntimeError):
    """A dependency failed so that no answer could be given; ``dependency`` names it ('lm' or 'store')."""

    def __init__(self, dependency: Dependency, message: str, trace: CRAGTrace | None = None):
        super().__init__(message)
        self.dependency = dependency
        self.trace = trace


class _GuardedRetriever:
    """Attributes any retrieval failure (Chroma, embeddings) to the store; CRAG cannot answer without it."""

    def __init__(self, inner: Retriever):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)

    def retrieve(self, query: str, k: int) -> list[Passage]:
        try:
            return self.inner.retrieve(query, k)
        except Exception as exc:
            raise DependencyError("store", f"the document store failed: {type(exc).__name__}: {exc}") from exc


class _LMCalls(BaseCallback):
    """Counts one request's LM calls that returned and that raised (DSPy calls this around every LM call,
    cache hits included)."""

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.last_error = ""

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        if exception is None:
            self.succeeded += 1
        else:
            self.failed += 1
            self.last_error = f"{type(exception).__name__}: {str(exception)[:300]}"


class ProgramService:
    """Serve ``loaded``: answer questions and describe the program.

    CRAG degrades on its own when a grade, a strip, the rewrite, the web search or the answer fails, and
    says so in the trace; such answers are returned with ``degraded=True``. Only when nothing useful can
    come back is a :class:`DependencyError` raised: the store failed (no documents to judge), or the LM
    failed on every call of the request (no grade and no answer came from a model).
    """

    def __init__(self, loaded: LoadedProgram):
        self.loaded = loaded
        crag = loaded.crag
        if not isinstance(crag.retriever, _GuardedRetriever):
            crag.retriever = _GuardedRetriever(crag.retriever)
        self.crag = crag

    def ask(self, question: str) -> AskResponse:
        calls = _LMCalls()
        started = time.perf_counter()
        with dspy.context(callbacks=[*(dspy.settings.get("callbacks") or []), calls]):
            prediction = self.crag(question=question)
        seconds = round(time.perf_counter() - started, 4)
        trace: CRAGTrace = prediction.trace
        if calls.failed and not calls.succeeded:
            raise DependencyError(
                "lm",
                f"the language model failed on all {calls.failed} calls: {calls.last_error}",
                trace,
            )
        log.info("%s in %.1f s: %r", trace.action, seconds, question[:80])
        return AskResponse(
            answer=trace.answer or "",
            action=trace.action,
            degraded=bool(trace.errors or trace.fallbacks),
            seconds=seconds,
            trace=trace,
        )

    def health(self) -> Health:
        return Health(compiled=self.loaded.compiled, domain=self.loaded.domain, version=__version__)

    def info(self) -> ProgramInfo:
        crag, document = self.crag, self.loaded.document
        lm = crag.lm or dspy.settings.lm
        metadata = dict(document["metadata"]) if document else {}
        if document:
            note = f"compiled program {self.loaded.path.name} for domain {self.loaded.domain!r}"
        else:
            note = (
                "uncompiled default program: thresholds and prompts are the defaults; "
                "compile one for this domain with `python -m optimize.compile` and serve it with --program"
            )
        return ProgramInfo(
            compiled=self.loaded.compiled,
            path=str(self.loaded.path) if self.loaded.path else None,
            domain=self.loaded.domain,
            lower=crag.thresholds.lower,
            upper=crag.thresholds.upper,
            lm=getattr(lm, "model", None) if lm is not None else None,
            retriever=crag.retriever.name,
            web_backend=getattr(crag.web_search, "name", type(crag.web_search).__name__),
            config=program_config(crag),
            metadata=metadata,
            scores=metadata.get("scores"),
            created=document.get("created") if document else None,
            note=note,
        )
