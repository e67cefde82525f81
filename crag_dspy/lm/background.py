"""A chat engine that loads in a background thread while the process does its other start-up work.

Every command on the embedded model used to load the LLM's weights (~4 s on 2 cores: reading and
repacking 1 GB in native code, which releases the GIL) and then, at the first retrieval, the embedding
model (~5-8 s, mostly Python imports), one after the other. Loading the LLM in a thread overlaps the
two: ``crag-dspy ask`` on the embedded defaults starts ~4 s sooner (``docs/performance.md``). The
server answers on its port at once; a request that arrives before the model is loaded waits for it;
when no request needs the model (every answer came from DSPy's cache), closing stops the load instead
of waiting for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .ik_engine import Completion, EngineError
from .openai_server import ChatEngine

__all__ = ["BackgroundEngine"]

log = logging.getLogger(__name__)


class BackgroundEngine:
    """A :class:`~crag_dspy.lm.openai_server.ChatEngine` whose engine is made by ``load`` in a
    daemon thread; :meth:`chat` waits for it. ``load`` is given a callable that says True once
    :meth:`close` was called, to stop loading early.

    If ``load`` fails, every call raises :class:`~crag_dspy.lm.ik_engine.EngineError` with the reason,
    so the failure reaches whoever asks (and the trace) instead of dying in the thread.
    """

    def __init__(self, load: Callable[[Callable[[], bool]], ChatEngine], *, name: str = "engine"):
        self._name = name
        self._engine: ChatEngine | None = None
        self._error: BaseException | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._load, args=(load,), name=f"load-{name}", daemon=True)
        self._thread.start()

    def _load(self, load: Callable[[Callable[[], bool]], ChatEngine]) -> None:
        started = time.perf_counter()
        try:
            self._engine = load(self._closing.is_set)
        except BaseException as exc:  # noqa: BLE001 - kept and raised to every caller of chat()
            self._error = exc
            if not self._closing.is_set():
                log.warning("the %s could not be loaded: %s", self._name, exc)
        else:
            log.debug("%s loaded in %.1f s (in the background)", self._name, time.perf_counter() - started)

    @property
    def loaded(self) -> bool:
        """Whether loading has finished, successfully or not."""
        return not self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """Whether loading has finished without an engine (and was not stopped by :meth:`close`)."""
        return self.loaded and self._engine is None and not self._closing.is_set()

    def wait(self) -> ChatEngine:
        """The engine, once loaded; raises :class:`EngineError` if loading failed."""
        self._thread.join()
        if self._closing.is_set():
            raise EngineError(f"the {self._name} is closed")
        if self._engine is None:
            raise EngineError(f"the {self._name} could not be loaded: {self._error}") from self._error
        return self._engine

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Completion:
        return self.wait().chat(messages, **kwargs)

    def close(self) -> None:
        """Stop a load in progress (``load`` is told to) and wait for it, then close the engine."""
        self._closing.set()
        self._thread.join()
        engine, self._engine = self._engine, None
        close = getattr(engine, "close", None)
        if close is not None:
            close()
