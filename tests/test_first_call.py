"""The first call's model loads (issue 61): the grounding check's embedding model is loaded only for an
answer that stands, and while the LM writes it; a load in progress is shared, a failed one raises where
the model is used. Control flow with stand-in models: the seconds are measured by
docs/measurements/first_call.py, never asserted here."""

import threading

import numpy as np
import pytest
from dspy.utils.dummies import DummyLM
from fakes import ListRetriever

from crag_dspy import CRAG
from crag_dspy import embeddings as embeddings_module
from crag_dspy.embeddings import Embedder, EmbeddingError
from crag_dspy.web import NoWebSearch

FERRY = "The night ferry to Velm Island leaves at 23:40 from pier four."
QUESTION = "When does the night ferry to Velm Island leave?"


class SpyClassifier:
    """The grounding check's classifier and its embedder, counting what is asked of them."""

    def __init__(self):
        self.sentences: list[str] = []
        self.preloads = 0
        self.embedder = self

    def preload(self) -> None:
        self.preloads += 1

    def __call__(self, sentences):
        self.sentences += list(sentences)
        return [False] * len(sentences)


@pytest.fixture
def spy(monkeypatch):
    classifier = SpyClassifier()
    monkeypatch.setattr("crag_dspy.instructions.default_classifier", lambda: classifier)
    return classifier


def dummy(answer: str) -> DummyLM:
    return DummyLM(
        {"document:": {"relevant": "yes"}, "strip:": {"keep": "yes"}, "context:": {"answer": answer}}
    )


def test_an_answer_that_stands_is_classified_and_its_model_preloaded_first(spy):
    prediction = CRAG(ListRetriever([("ferry", FERRY)]), NoWebSearch(), lm=dummy("23:40"))(question=QUESTION)
    assert prediction.answer == "23:40"
    assert spy.preloads == 1 and len(spy.sentences) == 1 and "23:40" in spy.sentences[0]  # its sentence


def test_an_answer_replaced_by_i_dont_know_never_reaches_the_classifier(spy):
    # 19:15 is in no kept strip: abstain_ungrounded answers "I don't know", so no embedding is needed.
    prediction = CRAG(ListRetriever([("ferry", FERRY)]), NoWebSearch(), lm=dummy("19:15 from pier four"))(
        question=QUESTION
    )
    assert prediction.answer == "I don't know" and prediction.trace.lm_answer == "19:15 from pier four"
    assert spy.sentences == []


def test_no_answer_to_write_loads_nothing(spy):
    lm = DummyLM({"document:": {"relevant": "no"}})
    prediction = CRAG(ListRetriever([("ferry", FERRY)]), NoWebSearch(), lm=lm)(question=QUESTION)
    assert prediction.answer == "I don't know" and (spy.preloads, spy.sentences) == (0, [])


class FakeModel:
    def encode(self, texts, **kwargs):
        return np.ones((len(texts), 2)) / np.sqrt(2)


def test_a_preloaded_model_is_loaded_once_and_shared_with_the_caller_that_waits(monkeypatch):
    monkeypatch.setattr(embeddings_module, "_MODELS", {})
    release, loads = threading.Event(), []

    def slow_load(path):
        loads.append(path)
        release.wait(5)
        return FakeModel()

    monkeypatch.setattr(embeddings_module, "_load_model", slow_load)
    embedder = Embedder("fake-model")
    embedder.preload()
    assert embeddings_module.is_loaded("fake-model")  # loading: a second preload starts nothing
    embedder.preload()
    release.set()
    assert np.allclose(embedder.encode(["a", "b"]), 0.5**0.5)
    assert loads == ["fake-model"]


def test_a_preload_that_fails_raises_where_the_model_is_used(monkeypatch):
    monkeypatch.setattr(embeddings_module, "_MODELS", {})
    attempts = []

    def broken(path):
        attempts.append(path)
        raise EmbeddingError(f"Cannot load embedding model {path!r}: no weights")

    monkeypatch.setattr(embeddings_module, "_load_model", broken)
    embedder = Embedder("broken-model")
    embedder.preload()
    for thread in threading.enumerate():
        if thread.name == "crag-embedder-preload":
            thread.join(5)
    assert not embeddings_module.is_loaded("broken-model")
    with pytest.raises(EmbeddingError, match="no weights"):
        embedder.encode(["a"])
    assert attempts == ["broken-model", "broken-model"]  # tried again by the caller, who gets the error
