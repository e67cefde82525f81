"""Hybrid retrieval (crag_dspy.hybrid): identifier-keeping tokens, reciprocal rank fusion, and the
retriever over a real embedded Chroma with the bundled embedding model (no LM)."""

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from crag_dspy.app import open_backends
from crag_dspy.domain import CorpusDoc
from crag_dspy.hybrid import HybridRetriever, bm25_cache_root, reciprocal_rank_fusion, tokenize
from crag_dspy.settings import Settings
from crag_dspy.store import ChromaRetriever, ingest_documents, open_client

ROOT = Path(__file__).resolve().parents[1]

CODES = {
    "E0308": "mismatched types: the expression has another type than the one expected",
    "E0382": "use of a moved value: the value was moved into another binding before this use",
    "E0425": "an unresolved name was used: the identifier is not in scope here",
    "E0499": "a variable was borrowed as mutable more than once at a time",
    "E0502": "a variable was borrowed as mutable while it was also borrowed as immutable",
    "E0277": "a type does not implement a trait that the code requires",
}
DOCS = [
    *(
        CorpusDoc(id=code, title=f"Compiler error {code}", text=f"Error {code}: {text}.")
        for code, text in CODES.items()
    ),
    CorpusDoc(
        id="quirks",
        title="USB input devices",
        text="Some gamepads need a kernel parameter: add usbhid.quirks=0x0079:0x0011:0x4 to the boot "
        "command line and reboot.",
    ),
    CorpusDoc(
        id="keyboards",
        title="USB keyboards",
        text="Keyboards that drop keys often work better on a USB 2 port; no kernel option is needed.",
    ),
    CorpusDoc(
        id="mice",
        title="USB mice",
        text="A mouse that stutters can be given a higher polling rate with an option of its driver.",
    ),
]
DEVICE_QUERY = "0x0079:0x0011"  # a vendor:product id as a user pastes it: nothing for an embedder to mean


# --- tokens -----------------------------------------------------------------------------------------


def test_identifiers_survive_whole_and_in_parts():
    tokens = tokenize("Set usbhid.quirks=0x0079:0x0011:0x4 and --max-connections=10 on Python 3.11.")
    for token in ("usbhid.quirks", "usbhid", "quirks", "0x0079", "0x0011", "0x4"):
        assert token in tokens
    for token in ("--max-connections", "max-connections", "max", "connections", "10"):
        assert token in tokens
    assert "3.11" in tokens and "python" in tokens and "set" in tokens
    assert tokenize("Error E0425, see /etc/fstab") == ["error", "e0425", "see", "etc/fstab", "etc", "fstab"]


def test_stopwords_possessives_and_thousands_go():
    assert tokenize("What is the occupation of Robert Jonckheere's son?") == [
        "occupation",
        "robert",
        "jonckheere",
        "son",
    ]
    assert tokenize("It costs 1,240 Velds; C++ and C# too.") == ["costs", "1240", "velds", "c++", "c#", "too"]
    assert tokenize("what is the") == [] and tokenize("") == []


# --- fusion -----------------------------------------------------------------------------------------


def test_rrf_sums_reciprocal_ranks_and_breaks_ties_by_best_rank_then_first_ranking():
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "d", "a"]], k=60)
    assert [item for item, _ in fused] == ["a", "c", "b", "d"]
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 63) == scores["c"]
    assert scores["b"] == pytest.approx(1 / 62) == scores["d"]
    # Found by both beats first in one only; a repeated id counts once; empty rankings are fine.
    assert [i for i, _ in reciprocal_rank_fusion([["x", "y"], ["y", "z"]])] == ["y", "x", "z"]
    assert reciprocal_rank_fusion([["a", "a"], []]) == [("a", pytest.approx(1 / 61))]
    assert [i for i, _ in reciprocal_rank_fusion([["p", "q"], ["r", "q"]], k=1)] == ["q", "p", "r"]


# --- the retriever ----------------------------------------------------------------------------------


@pytest.fixture()
def client(tmp_path):
    return open_client(Settings(chroma_path=tmp_path / "chroma"))


def ingest(client, embedder, docs=DOCS):
    return ingest_documents(client, "t__kb", docs, embedder, chunk_words=120, progress=False)


def test_an_identifier_query_dense_ranks_low_comes_first(client, embedder):
    ingest(client, embedder)
    dense = [p.doc_id for p in ChromaRetriever(client, "t__kb", embedder).retrieve(DEVICE_QUERY, len(DOCS))]
    hybrid = HybridRetriever(client, "t__kb", embedder)
    assert hybrid.name == "hybrid:t__kb" and hybrid.count() == len(DOCS)
    top = hybrid.retrieve(DEVICE_QUERY, 3)
    assert dense.index("quirks") > 0 and top[0].doc_id == "quirks"
    assert [p.rank for p in top] == [0, 1, 2] and top[0].title == "USB input devices"
    assert hybrid.retrieve(DEVICE_QUERY, 0) == []


class FirstDenseHitOnly:
    """A collection whose dense query proposes one chunk: the other passages are BM25's alone."""

    def __init__(self, collection):
        self._collection = collection

    def __getattr__(self, name):
        return getattr(self._collection, name)

    def query(self, **kwargs):
        return self._collection.query(**{**kwargs, "n_results": 1})


def test_passages_carry_their_dense_similarity_even_when_only_bm25_found_them(client, embedder):
    ingest(client, embedder)
    dense = {p.doc_id: p for p in ChromaRetriever(client, "t__kb", embedder).retrieve(DEVICE_QUERY, 50)}
    hybrid = HybridRetriever(client, "t__kb", embedder)
    hybrid._collection = FirstDenseHitOnly(hybrid._collection)
    passages = hybrid.retrieve(DEVICE_QUERY, 2)
    # Tied fused scores (each first in one ranking): the dense hit first, then BM25's, fetched with its
    # embedding for its similarity.
    assert [p.doc_id for p in passages] == [next(iter(dense)), "quirks"]
    for passage in passages:
        assert passage.similarity == pytest.approx(dense[passage.doc_id].similarity, abs=1e-5)
        assert (passage.text, passage.title, passage.id) == (
            dense[passage.doc_id].text,
            dense[passage.doc_id].title,
            dense[passage.doc_id].id,
        )
    assert len(HybridRetriever(client, "t__kb", embedder).retrieve("E0425", 4)) == 4


def test_a_query_of_stopwords_is_the_dense_ranking(client, embedder):
    ingest(client, embedder)
    dense = [p.id for p in ChromaRetriever(client, "t__kb", embedder).retrieve("what is it", 5)]
    assert [p.id for p in HybridRetriever(client, "t__kb", embedder).retrieve("what is it", 5)] == dense


def test_the_index_is_cached_reused_and_rebuilt_when_the_collection_changes(client, embedder, tmp_path):
    cache = tmp_path / "chroma" / "bm25"
    ingest(client, embedder)
    first = HybridRetriever(client, "t__kb", embedder, cache_dir=cache)
    assert first.built and [f.name.startswith("t__kb-") for f in cache.iterdir()] == [True]
    (old,) = cache.iterdir()
    again = HybridRetriever(client, "t__kb", embedder, cache_dir=cache)
    assert not again.built and again.retrieve(DEVICE_QUERY, 1)[0].doc_id == "quirks"

    changed = [d for d in DOCS if d.id != "quirks"] + [
        CorpusDoc(id="limits", title="Server limits", text="Raise --max-connections=500 for busy sites.")
    ]
    ingest(client, embedder, changed)
    rebuilt = HybridRetriever(client, "t__kb", embedder, cache_dir=cache)
    assert (
        rebuilt.built and [f.name for f in cache.iterdir()] != [old.name] and len(list(cache.iterdir())) == 1
    )
    assert rebuilt.retrieve("--max-connections", 1)[0].doc_id == "limits"
    # A retriever opened before the ingest notices (a dense hit it does not know) and catches up.
    assert first.retrieve("--max-connections", 1)[0].doc_id == "limits"
    assert DEVICE_QUERY not in [p.text for p in first.retrieve(DEVICE_QUERY, 3)]
    assert not first.refresh()


def test_an_unreadable_cache_is_rebuilt(client, embedder, tmp_path):
    ingest(client, embedder)
    HybridRetriever(client, "t__kb", embedder, cache_dir=tmp_path / "bm25")
    (folder,) = (tmp_path / "bm25").iterdir()
    (folder / "data.csc.index.npy").write_bytes(b"not numpy")
    retriever = HybridRetriever(client, "t__kb", embedder, cache_dir=tmp_path / "bm25")
    assert retriever.built and retriever.retrieve(DEVICE_QUERY, 1)[0].doc_id == "quirks"


def test_concurrent_queries_get_their_own_answers(client, embedder):
    ingest(client, embedder)
    hybrid = HybridRetriever(client, "t__kb", embedder)
    queries = [*CODES, DEVICE_QUERY] * 4
    serial = {q: [p.id for p in hybrid.retrieve(q, 3)] for q in set(queries)}
    start = threading.Barrier(8)

    def ask(query, wait=False):
        if wait:
            start.wait(timeout=30)  # the first eight start at the same moment
        return query, [p.id for p in hybrid.retrieve(query, 3)]

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, q, i < 8) for i, q in enumerate(queries)]
        for future in futures:
            query, ids = future.result(timeout=60)
            assert ids == serial[query]


# --- settings and the app ---------------------------------------------------------------------------


def test_the_setting_chooses_the_apps_retriever(tmp_path, embedder, monkeypatch):
    assert Settings().retrieval == "dense"
    monkeypatch.setenv("CRAG_RETRIEVAL", "hybrid")
    assert Settings().retrieval == "hybrid"
    monkeypatch.setenv("CRAG_RETRIEVAL", "sparse")
    with pytest.raises(ValueError, match="retrieval"):
        Settings()
    monkeypatch.delenv("CRAG_RETRIEVAL")
    root = tmp_path / "codes"
    root.mkdir()
    (root / "corpus.jsonl").write_text("".join(d.model_dump_json(exclude_none=True) + "\n" for d in DOCS))
    settings = Settings(domain_dir=root, chroma_path=tmp_path / "chroma", retrieval="hybrid")
    backends = open_backends(settings, progress=False)
    kb = backends.retriever("kb")
    assert isinstance(kb, HybridRetriever) and kb.retrieve(DEVICE_QUERY, 1)[0].doc_id == "quirks"
    assert (tmp_path / "chroma" / "bm25").is_dir()
    dense = open_backends(settings.model_copy(update={"retrieval": "dense"}), progress=False)
    assert isinstance(dense.retriever("kb"), ChromaRetriever)


def test_bm25_cache_root_is_beside_the_embedded_store_or_in_the_cache_for_a_server(tmp_path):
    assert bm25_cache_root(Settings(chroma_path=tmp_path / "c")) == tmp_path / "c" / "bm25"
    server = Settings(chroma_host="chroma.internal", chroma_port=8001, cache_dir=tmp_path)
    assert bm25_cache_root(server) == tmp_path / "bm25" / "chroma.internal-8001"


# --- the benchmark ----------------------------------------------------------------------------------


def test_the_recall_benchmark_compares_both_retrievers(tmp_path, capsys):
    root = tmp_path / "codes"
    root.mkdir()
    (root / "corpus.jsonl").write_text("".join(d.model_dump_json(exclude_none=True) + "\n" for d in DOCS))
    qa = [
        {"id": "q1", "question": f"Which device is {DEVICE_QUERY}?", "answers": ["gamepads"], "split": "test"},
        {"id": "q2", "question": "What is E0425?", "answers": ["unresolved name"], "split": "test",
         "evidence": [{"doc_id": "E0425", "quote": "unresolved"}, {"doc_id": "web-1"}]},
        {"id": "q3", "question": "Unknown?", "answers": ["I don't know"], "split": "test"},
        {"id": "q4", "question": "E0308?", "answers": ["mismatched types"], "split": "val"},
    ]  # fmt: skip
    (root / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qa))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import retrieval_recall
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "r.json"
    assert retrieval_recall.main(["--domain-dir", str(root), "--k", "1", "3", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert results["questions"] == 2 and [r["k"] for r in results["by_k"]] == [1, 3]
    at1 = results["by_k"][0]
    assert at1["answer"]["hybrid"]["k"] == 2 and at1["answer"]["dense"]["n"] == 2
    assert at1["evidence"]["dense"]["n"] == 1  # only q2 names a corpus document
    assert 0 <= at1["answer"]["mcnemar_p"] <= 1
    assert "McNemar" in capsys.readouterr().out
    assert not list(Path("/tmp").glob("crag-recall-*/chroma.sqlite3"))  # the temporary store is gone
