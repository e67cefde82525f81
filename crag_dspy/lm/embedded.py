"""The embedded LLM: llama.cpp (xllamacpp) served in-process on a loopback port.

Serving the model behind llama.cpp's OpenAI-compatible endpoint, instead of calling it directly, lets
the embedded model and any hosted OpenAI-compatible server share one code path (``dspy.LM`` via
LiteLLM), including token log-probabilities and llama.cpp's prompt-prefix KV cache.
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from .weights import EMBEDDED_MODELS, WeightsError, ensure_weights

__all__ = ["EmbeddedServer", "start_embedded_server"]

log = logging.getLogger(__name__)


@dataclass
class EmbeddedServer:
    """A running llama.cpp server; keep a reference for as long as the model is used."""

    model_name: str
    model_path: Path
    port: int
    _server: object

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        # Dropping the last reference stops xllamacpp's main loop.
        self._server = None


MISSING_ENGINE = "The embedded LLM needs the llama.cpp engine: pip install 'crag-dspy[local]'"

_lock = threading.Lock()
_servers: dict[tuple, EmbeddedServer] = {}


def _free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_embedded_server(
    model_name: str, cache_dir: Path, *, n_threads: int, n_ctx: int, n_parallel: int = 1
) -> EmbeddedServer:
    """Start (once per process and configuration) the embedded model and return its handle.

    The server is shared: loading 1 GB of weights twice in one process would double memory and start-up
    time for nothing.
    """
    if model_name not in EMBEDDED_MODELS:
        raise WeightsError(f"Unknown embedded model {model_name!r}; choose one of {sorted(EMBEDDED_MODELS)}.")
    key = (model_name, n_threads, n_ctx, n_parallel)
    with _lock:
        if key in _servers:
            return _servers[key]
        try:
            import xllamacpp
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise WeightsError(MISSING_ENGINE) from exc
        path = ensure_weights(EMBEDDED_MODELS[model_name], cache_dir)
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.model_alias = model_name
        params.n_ctx = n_ctx * n_parallel  # llama.cpp splits the context across slots
        params.n_parallel = n_parallel
        params.cpuparams.n_threads = n_threads
        params.cpuparams_batch.n_threads = n_threads
        params.verbosity = -1  # llama.cpp's per-request info logs would flood the user's terminal
        params.port = _free_loopback_port()
        log.info("starting embedded model %s on 127.0.0.1:%d", model_name, params.port)
        server = EmbeddedServer(model_name, path, params.port, xllamacpp.Server(params))
        _servers[key] = server
        return server


@atexit.register
def _stop_all() -> None:
    with _lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
