"""The embedded LLM: a llama.cpp engine served in-process on a loopback port.

Serving the model behind an OpenAI-compatible endpoint, instead of calling it directly, lets the
embedded model and any hosted OpenAI-compatible server share one code path (``dspy.LM`` via LiteLLM),
including token log-probabilities and a prompt-prefix KV cache. Two engines can serve it:

- ``ik_llama`` (``ik-llama-cpp-python``): the ik_llama.cpp fork, whose CPU kernels evaluate prompts
  1.5-1.7x faster per call on the project's machine (``docs/performance.md``); served by
  :mod:`crag_dspy.lm.openai_server` over :class:`~crag_dspy.lm.ik_engine.IkEngine`;
- ``xllamacpp``: upstream llama.cpp with its own server.

``auto`` (the default) takes ik_llama when it is installed: its wheels exist for CPython 3.10-3.13
on Linux (glibc 2.28+), macOS arm64 and Windows; elsewhere xllamacpp serves.

Either server requires a key made at random when it starts (:attr:`EmbeddedServer.api_key`): a
loopback port is open to every local user and process, and the key is known only to the ``dspy.LM``
that :func:`~crag_dspy.lm.factory.build_lm` hands it to.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import socket
import threading
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from .weights import EMBEDDED_MODELS, WeightsError, ensure_weights

__all__ = [
    "ENGINES",
    "ENGINE_CHOICES",
    "PACKAGES",
    "EmbeddedServer",
    "resolve_engine",
    "start_embedded_server",
]

Engine = Literal["ik_llama", "xllamacpp"]
ENGINES: tuple[Engine, ...] = ("ik_llama", "xllamacpp")
ENGINE_CHOICES: tuple[str, ...] = ("auto", *ENGINES)  # what a user may ask for
_MODULES: dict[Engine, str] = {"ik_llama": "ik_llama_cpp", "xllamacpp": "xllamacpp"}
PACKAGES: dict[Engine, str] = {"ik_llama": "ik-llama-cpp-python", "xllamacpp": "xllamacpp"}
# Prompts the ik_llama engine keeps in its KV cache at once: one per prompt family and some spare.
_IK_SLOTS = 8

log = logging.getLogger(__name__)


@dataclass
class EmbeddedServer:
    """A running llama.cpp server; keep a reference for as long as the model is used."""

    model_name: str
    model_path: Path
    port: int
    engine: Engine
    _server: object
    api_key: str = field(default="", repr=False)  # never in a repr, a log line or a trace

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def served_name(self) -> str:
        """The model name requests carry; it is part of DSPy's cache key, so answers computed by one
        engine (whose numerics differ in the last digits) are never served as the other's."""
        return self.model_name if self.engine == "xllamacpp" else f"{self.model_name}+{self.engine}"

    @property
    def failed(self) -> bool:
        """Whether its model failed to load (ik_llama loads in the background): it answers only 503."""
        if self.engine != "ik_llama" or self._server is None:
            return False
        _, engine = self._server
        return engine.failed

    def close(self) -> None:
        server, self._server = self._server, None
        if self.engine == "ik_llama" and server is not None:
            openai_server, engine = server
            openai_server.close()
            engine.close()
        # xllamacpp: dropping the last reference stops its main loop.


MISSING_ENGINE = "The embedded LLM needs a llama.cpp engine: pip install 'crag-dspy[local]'"


def resolve_engine(choice: str) -> Engine:
    """The engine that serves ``choice`` ("auto", "ik_llama" or "xllamacpp"); raises
    :class:`WeightsError` naming the install command when it is not installed."""
    if choice == "auto":
        for engine in ENGINES:
            if find_spec(_MODULES[engine]) is not None:
                return engine
        raise WeightsError(MISSING_ENGINE)
    if choice not in ENGINES:
        raise WeightsError(f"Unknown embedded engine {choice!r}; choose auto, {' or '.join(ENGINES)}.")
    if find_spec(_MODULES[choice]) is None:
        raise WeightsError(f"The embedded engine {choice!r} is not installed: pip install {PACKAGES[choice]}")
    return choice


_lock = threading.Lock()
_servers: dict[tuple, EmbeddedServer] = {}


def _new_key() -> str:
    return f"crag-{secrets.token_urlsafe(32)}"


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_embedded_server(
    model_name: str,
    cache_dir: Path,
    *,
    n_threads: int,
    n_ctx: int,
    n_parallel: int = 1,
    engine: str = "auto",
) -> EmbeddedServer:
    """Start (once per process and configuration) the embedded model and return its handle.

    The server is shared: loading 1 GB of weights twice in one process would double memory and start-up
    time for nothing. With ik_llama it answers on its port at once while the weights load in the
    background (:mod:`crag_dspy.lm.background`); requests wait for them.
    """
    if model_name not in EMBEDDED_MODELS:
        raise WeightsError(f"Unknown embedded model {model_name!r}; choose one of {sorted(EMBEDDED_MODELS)}.")
    chosen = resolve_engine(engine)
    key = (model_name, n_threads, n_ctx, n_parallel, chosen)
    with _lock:
        if key in _servers and not _servers[key].failed:
            return _servers[key]
        if key in _servers:  # e.g. out of memory at the time: a later start may load it
            _servers.pop(key).close()
        path = ensure_weights(EMBEDDED_MODELS[model_name], cache_dir)
        start = _start_ik_llama if chosen == "ik_llama" else _start_xllamacpp
        server = start(model_name, path, n_threads=n_threads, n_ctx=n_ctx, n_parallel=n_parallel)
        _servers[key] = server
        return server


def _start_ik_llama(
    model_name: str, path: Path, *, n_threads: int, n_ctx: int, n_parallel: int
) -> EmbeddedServer:
    from .background import BackgroundEngine
    from .ik_engine import IkEngine
    from .openai_server import OpenAIServer

    # One request at a time, as llama.cpp's single slot: prompt evaluation already uses every core.
    # The weights load while the caller goes on (opening the store, loading the embedding model).
    engine = BackgroundEngine(
        lambda stopping: IkEngine(
            path, n_threads=n_threads, n_ctx=n_ctx * n_parallel, slots=_IK_SLOTS, cancelled=stopping
        ),
        name=f"embedded model {model_name}",
    )
    key = _new_key()
    server = OpenAIServer(engine, model_name, api_key=key)
    log.info("starting embedded model %s (ik_llama) on 127.0.0.1:%d", model_name, server.port)
    return EmbeddedServer(model_name, path, server.port, "ik_llama", (server, engine), key)


def _start_xllamacpp(
    model_name: str, path: Path, *, n_threads: int, n_ctx: int, n_parallel: int
) -> EmbeddedServer:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = model_name
    params.n_ctx = n_ctx * n_parallel  # llama.cpp splits the context across slots
    params.n_parallel = n_parallel
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.verbosity = -1  # llama.cpp's per-request info logs would flood the user's terminal
    params.port = _free_loopback_port()
    key = _new_key()
    params.api_keys = [key]  # llama.cpp's server then refuses requests without it (401)
    log.info("starting embedded model %s (xllamacpp) on 127.0.0.1:%d", model_name, params.port)
    return EmbeddedServer(model_name, path, params.port, "xllamacpp", xllamacpp.Server(params), key)


@atexit.register
def _stop_all() -> None:
    with _lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
