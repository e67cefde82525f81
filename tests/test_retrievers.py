"""Other libraries' retrievers as CRAG's retriever (issue 61): dspy.retrievers.Embeddings, a plain
function, LangChain and LlamaIndex retrievers. The last two are optional packages: stand-ins with their
interface (base class module and name, ``invoke``/``retrieve``, ``Document``/``NodeWithScore``) test the
adapters here, and the real classes are tested when the package is installed."""

import dspy
import numpy as np
import pytest
from dspy.utils.dummies import DummyLM
from fakes import ListRetriever, ListWebSearch

from crag_dspy import CRAG, Passage
from crag_dspy.retrievers import (
    DSPyRetriever,
    FunctionRetriever,
    LangChainRetriever,
    LlamaIndexRetriever,
    as_retriever,
    to_passage,
)
from crag_dspy.web import NoWebSearch

FERRY = "The night ferry to Velm Island leaves at 23:40 from pier four."
BAKERY = "The bakery on Quay Street opens at 06:00."
QUESTION = "When does the night ferry to Velm Island leave?"


def test_items_become_passages_by_one_rule():
    text = to_passage(FERRY, 2)
    assert (text.text, text.title, text.rank, text.similarity) == (FERRY, "", 2, 0.0)
    assert text.id == to_passage(FERRY, 0).id != to_passage(BAKERY, 0).id  # stable per text
    full = to_passage(
        {
            "content": FERRY,
            "id": "c1",
            "doc_id": "timetable.pdf",
            "title": "Timetable",
            "score": 0.8,
            "page": "3",
        },
        0,
    )
    assert (full.id, full.doc_id, full.title, full.similarity, full.page) == (
        "c1",
        "timetable.pdf",
        "Timetable",
        0.8,
        3,
    )
    passage = Passage("p", "d", "t", FERRY, 5, 0.5)
    assert to_passage(passage, 1) == Passage("p", "d", "t", FERRY, 1, 0.5)
    with pytest.raises(TypeError, match="needs its text under one of"):
        to_passage({"body": FERRY}, 0)
    with pytest.raises(TypeError, match="returned a int"):
        to_passage(3, 0)


def test_a_plain_function_is_a_retriever_and_crag_wraps_it():
    def search(query: str, k: int) -> list[str | dict]:
        return [FERRY, {"text": BAKERY, "title": "Bakery"}, "unused"][:k]

    crag = CRAG(search, NoWebSearch())
    assert isinstance(crag.retriever, FunctionRetriever) and crag.retriever.name == "search"
    got = crag.retriever.retrieve("ferry", 2)
    assert [(p.text, p.title, p.rank) for p in got] == [(FERRY, "", 0), (BAKERY, "Bakery", 1)]
    own = ListRetriever([])
    assert as_retriever(own) is own  # the protocol itself is used as it is
    with pytest.raises(TypeError, match="expected a list of passages"):
        FunctionRetriever(lambda q, k: FERRY).retrieve("q", 1)


def test_a_function_retriever_drives_crag_with_dummy_lm():
    lm = DummyLM(
        {"document:": {"relevant": "yes"}, "strip:": {"keep": "yes"}, "context:": {"answer": "23:40"}}
    )
    crag = CRAG(lambda query, k: [FERRY], NoWebSearch(), lm=lm)
    prediction = crag(question=QUESTION)
    assert (prediction.answer, prediction.trace.action, prediction.trace.retriever) == (
        "23:40",
        "CORRECT",
        "<lambda>",
    )


def words_embedder(texts: list[str]) -> np.ndarray:
    """A bag-of-words embedder (no model): enough for dspy's Embeddings to rank by shared words."""
    vocabulary = sorted({w for t in [FERRY, BAKERY, QUESTION] for w in t.lower().split()})
    return np.array([[float(w in t.lower().split()) for w in vocabulary] for t in texts])


def test_dspy_embeddings_is_a_retriever_with_its_scores_and_corpus_indices():
    embeddings = dspy.retrievers.Embeddings(corpus=[BAKERY, FERRY], embedder=words_embedder, k=2)
    crag = CRAG(embeddings, ListWebSearch())
    assert isinstance(crag.retriever, DSPyRetriever)
    got = crag.retriever.retrieve(QUESTION, 1)
    assert [(p.text, p.id, p.doc_id, p.rank) for p in got] == [(FERRY, "corpus-1", "corpus-1", 0)]
    assert 0.5 < got[0].similarity <= 1.0  # the cosine dspy ranked by, not a placeholder
    assert len(crag.retriever.retrieve(QUESTION, 5)) == 2  # its own k caps what it returns


# --- LangChain and LlamaIndex: stand-ins with their interface ------------------------------------------


def stand_in_base(module: str) -> type:
    """A class named ``BaseRetriever`` defined, as far as Python can tell, in ``module``."""
    return type("BaseRetriever", (), {"__module__": module})


class Document:
    """LangChain's Document: page_content, metadata, id."""

    def __init__(self, page_content: str, metadata: dict, id: str | None = None):
        self.page_content, self.metadata, self.id = page_content, metadata, id


class LangChainStandIn(stand_in_base("langchain_core.retrievers")):
    def __init__(self, documents):
        self.documents = documents
        self.queries = []

    def invoke(self, input: str):
        self.queries.append(input)
        return self.documents


class Node:
    """LlamaIndex's TextNode: get_content(), node_id, ref_doc_id, metadata."""

    def __init__(self, text: str, node_id: str, metadata: dict):
        self.text, self.node_id, self.ref_doc_id, self.metadata = text, node_id, "doc-" + node_id, metadata

    def get_content(self) -> str:
        return self.text


class NodeWithScore:
    def __init__(self, node: Node, score: float | None):
        self.node, self.score = node, score


class LlamaIndexStandIn(stand_in_base("llama_index.core.base.base_retriever")):
    def __init__(self, nodes):
        self.nodes = nodes

    def retrieve(self, str_or_query_bundle):  # one argument: LlamaIndex's own signature
        return self.nodes


def test_a_langchain_retriever_is_recognised_and_its_documents_read():
    retriever = LangChainStandIn(
        [
            Document(FERRY, {"source": "timetable.pdf", "title": "Timetable", "page": 2}, id="d1"),
            Document(BAKERY, {"relevance_score": 0.3}),
        ]
    )
    crag = CRAG(retriever, NoWebSearch())
    assert isinstance(crag.retriever, LangChainRetriever)
    first, second = crag.retriever.retrieve(QUESTION, 4)
    assert retriever.queries == [QUESTION]
    assert (first.id, first.title, first.source, first.page, first.similarity) == (
        "d1",
        "Timetable",
        "timetable.pdf",
        2,
        0.0,
    )
    assert (second.text, second.similarity) == (BAKERY, 0.3)
    assert len(crag.retriever.retrieve(QUESTION, 1)) == 1


def test_a_llamaindex_retriever_is_recognised_before_its_one_argument_retrieve_is_taken_for_ours():
    retriever = LlamaIndexStandIn(
        [
            NodeWithScore(Node(FERRY, "n1", {"title": "Timetable"}), 0.9),
            NodeWithScore(Node(BAKERY, "n2", {}), None),
        ]
    )
    crag = CRAG(retriever, NoWebSearch())
    assert isinstance(crag.retriever, LlamaIndexRetriever)
    got = crag.retriever.retrieve(QUESTION, 4)
    assert [(p.id, p.doc_id, p.title, p.similarity) for p in got] == [
        ("n1", "doc-n1", "Timetable", 0.9),
        ("n2", "doc-n2", "", 0.0),
    ]


def test_something_that_is_no_retriever_is_refused_naming_what_is_accepted():
    with pytest.raises(TypeError, match=r"retrieve\(query, k\).*dspy.retrievers.Embeddings.*LangChain"):
        CRAG(42, NoWebSearch())


def test_a_real_langchain_retriever_when_langchain_is_installed():
    retrievers = pytest.importorskip("langchain_core.retrievers")
    documents = pytest.importorskip("langchain_core.documents")

    class Fixed(retrievers.BaseRetriever):
        def _get_relevant_documents(self, query, *, run_manager):
            return [documents.Document(page_content=FERRY, metadata={"title": "Timetable"})]

    crag = CRAG(Fixed(), NoWebSearch())
    assert isinstance(crag.retriever, LangChainRetriever)
    assert [(p.text, p.title) for p in crag.retriever.retrieve(QUESTION, 3)] == [(FERRY, "Timetable")]


def test_a_real_llamaindex_retriever_when_llamaindex_is_installed():
    base = pytest.importorskip("llama_index.core.retrievers")
    schema = pytest.importorskip("llama_index.core.schema")

    class Fixed(base.BaseRetriever):
        def _retrieve(self, query_bundle):
            return [schema.NodeWithScore(node=schema.TextNode(text=FERRY, id_="n1"), score=0.7)]

    crag = CRAG(Fixed(), NoWebSearch())
    assert isinstance(crag.retriever, LlamaIndexRetriever)
    assert [(p.text, p.id, p.similarity) for p in crag.retriever.retrieve(QUESTION, 3)] == [
        (FERRY, "n1", 0.7)
    ]
