"""Store faults on a real embedded Chroma: interrupted ingestion, empty collections, outages mid-question.

test_store.py covers idempotent reruns, changed documents replacing their chunks and missing
collections; test_chroma_server.py covers a real Chroma server going away.
"""

import re
import socket
import time

import pytest
from fake_servers import FakeChroma
from fakes import ListWebSearch, ScriptedLM

from crag_dspy import CRAG, store
from crag_dspy.app import open_backends
from crag_dspy.domain import CorpusDoc, load_domain
from crag_dspy.faults import RetrievalError
from crag_dspy.settings import Settings
from crag_dspy.store import (
    ChromaRetriever,
    StoreError,
    content_hash,
    ingest_documents,
    ingest_gaps,
    open_client,
    planned_chunks,
    query_rows,
)

DOCS = [
    CorpusDoc(id=f"doc-{i}", title=f"Policy {i}", text=f"Policy {i} sets the limit at {i * 10} velds.")
    for i in range(150)  # more than two ingest batches of 64
]


@pytest.fixture()
def client(tmp_path):
    return open_client(Settings(chroma_path=tmp_path / "chroma"))


class FailingEmbedder:
    """The real embedder, failing on its n-th call: an interruption in the middle of an ingest."""

    def __init__(self, embedder, fail_on_call: int):
        self._embedder, self._fail_on, self._calls = embedder, fail_on_call, 0
        self.name = embedder.name

    def encode(self, texts, **kwargs):
        self._calls += 1
        if self._calls == self._fail_on:
            raise ConnectionError("store connection lost mid-batch")
        return self._embedder.encode(texts, **kwargs)


def stored_doc_ids(client, name="t__kb") -> list[str]:
    return [m["doc_id"] for m in client.get_collection(name).get(include=["metadatas"])["metadatas"]]


def test_interrupted_ingest_is_a_clear_error_and_a_rerun_completes_without_duplicates(client, embedder):
    with pytest.raises(StoreError, match=r"ingesting collection 't__kb' \(rerun ingest to resume"):
        ingest_documents(client, "t__kb", DOCS, FailingEmbedder(embedder, 2), chunk_words=120, progress=False)
    partial = stored_doc_ids(client)
    assert 0 < len(partial) < len(DOCS)  # the first batch made it in: a real mid-way interruption
    report = ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    assert report.unchanged == len(partial) and report.added == len(DOCS) - len(partial)
    ids = stored_doc_ids(client)
    assert sorted(ids) == sorted(d.id for d in DOCS)  # every document once: nothing lost, nothing doubled


def test_interrupted_reingest_of_a_changed_corpus_never_loses_a_document(client, embedder):
    ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    changed = [d.model_copy(update={"text": d.text + " Revised."}) for d in DOCS]
    with pytest.raises(StoreError):
        ingest_documents(
            client, "t__kb", changed, FailingEmbedder(embedder, 2), chunk_words=120, progress=False
        )
    assert set(stored_doc_ids(client)) == {d.id for d in DOCS}  # old chunks stay until the new ones are in
    ingest_documents(client, "t__kb", changed, embedder, chunk_words=120, progress=False)
    texts = client.get_collection("t__kb").get(include=["documents"])["documents"]
    assert len(texts) == len(DOCS) and all(t.endswith("Revised.") for t in texts)


def test_empty_collection_is_a_clear_error_and_is_ingested_by_open_backends(tmp_path, embedder):
    domain = tmp_path / "tiny"
    domain.mkdir()
    (domain / "corpus.jsonl").write_text(
        '{"id": "a", "title": "Leave", "text": "Staff get 27 days of leave."}\n', encoding="utf-8"
    )
    settings = Settings(chroma_path=tmp_path / "chroma", domain_dir=domain)
    client = open_client(settings)
    # What an ingest interrupted before its first batch leaves behind:
    client.create_collection("tiny__kb", metadata={"embedding_model": embedder.name}, embedding_function=None)
    with pytest.raises(StoreError, match="Collection 'tiny__kb' is empty: run `crag-dspy ingest"):
        ChromaRetriever(client, "tiny__kb", embedder)
    with pytest.raises(StoreError, match="is not ingested completely .*holds 0 of 1 chunks"):
        open_backends(settings, ingest_if_missing=False, progress=False)
    backends = open_backends(settings, progress=False)
    assert backends.retriever().count() == 1


def test_store_failure_during_a_question_is_a_typed_error_naming_the_store(client, embedder):
    ingest_documents(client, "t__kb", DOCS[:3], embedder, chunk_words=120, progress=False)
    retriever = ChromaRetriever(client, "t__kb", embedder)
    lm = ScriptedLM(lambda system, user: 0.9)
    crag = CRAG(retriever, ListWebSearch(), lm=lm)
    client.delete_collection("t__kb")  # the store loses the collection under a running app
    with pytest.raises(RetrievalError, match="retriever chroma:t__kb failed") as info:
        crag(question="What is the limit of policy 1?")
    assert lm.calls == []  # no answer is made up from the web alone
    assert info.value.trace.question == "What is the limit of policy 1?" and info.value.trace.errors


def write_policies(root, docs=DOCS):
    root.mkdir(exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(d.model_dump_json() + "\n" for d in docs), encoding="utf-8")
    (root / "domain.toml").write_text('name = "tiny"\n', encoding="utf-8")
    return root


def test_a_partial_ingest_is_completed_by_open_backends_and_said_in_one_line(tmp_path, embedder, caplog):
    """An ingest killed at 64 of 150 chunks (a domain without web.jsonl) is no complete store."""
    root = write_policies(tmp_path / "tiny")
    settings = Settings(chroma_path=tmp_path / "chroma", domain_dir=root)
    client = open_client(settings)
    with pytest.raises(StoreError):
        ingest_documents(
            client, "tiny__kb", DOCS, FailingEmbedder(embedder, 2), chunk_words=120, progress=False
        )
    partial = (
        "collection 'tiny__kb' holds 64 of 150 chunks and no ingest manifest "
        "(an ingest that did not finish, or one made before ingest manifests)"
    )
    assert ingest_gaps(client, load_domain(root)) == [partial]
    with pytest.raises(StoreError) as info:
        open_backends(settings, ingest_if_missing=False, progress=False)
    assert f"is not ingested completely ({partial}): run `crag-dspy ingest" in str(info.value)
    caplog.clear()
    backends = open_backends(settings, progress=False)
    assert backends.retriever().count() == 150 and ingest_gaps(client, load_domain(root)) == []
    (told,) = [r for r in caplog.records if r.levelname == "WARNING"]  # one line says what happened
    assert told.getMessage() == f"domain 'tiny': {partial}; ingesting it now"
    caplog.clear()
    open_backends(settings, progress=False)
    assert not caplog.records  # complete: nothing to say, nothing ingested


def test_the_manifest_is_written_last_and_removed_while_an_ingest_changes_the_collection(tmp_path, embedder):
    root = write_policies(tmp_path / "tiny", DOCS[:70])
    settings = Settings(chroma_path=tmp_path / "chroma", domain_dir=root)
    client = open_client(settings)
    ingest_documents(client, "tiny__kb", DOCS[:70], embedder, chunk_words=120, progress=False)
    manifest = client.get_collection("tiny__kb").metadata
    assert manifest["ingest_chunks"] == 70 and manifest["embedding_model"] == embedder.name
    assert manifest["ingest_sha256"] == content_hash(planned_chunks(DOCS[:70], 120))
    # The data changed: more documents, and the ingest adding them is interrupted after a batch.
    write_policies(root, DOCS)
    assert ingest_gaps(client, load_domain(root)) == [
        "collection 'tiny__kb' was ingested from other content than the domain holds now"
    ]
    with pytest.raises(StoreError):
        ingest_documents(
            client, "tiny__kb", DOCS, FailingEmbedder(embedder, 2), chunk_words=120, progress=False
        )
    assert "ingest_sha256" not in client.get_collection("tiny__kb").metadata  # 134 of 150: not complete
    assert ingest_gaps(client, load_domain(root))[0].startswith("collection 'tiny__kb' holds 134 of 150")
    # Chunks deleted behind the store's back: the manifest no longer matches the count.
    open_backends(settings, progress=False)
    client.get_collection("tiny__kb").delete(ids=sorted(planned_chunks(DOCS, 120))[:5])
    assert ingest_gaps(client, load_domain(root)) == ["collection 'tiny__kb' holds 145 of 150 chunks"]
    assert open_backends(settings, progress=False).retriever().count() == 150


class HungChroma:
    """A Chroma 'server' that accepts connections and never answers (hung, or stopped with SIGSTOP):
    the kernel completes the handshake on the listening socket, nothing ever reads or writes."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.sock.close()


def test_a_chroma_server_that_never_answers_is_a_store_error_within_the_store_timeout():
    # chromadb's HTTP client has no timeout of its own (httpx timeout=None): this hung for ever.
    start = time.monotonic()
    with (
        HungChroma() as hung,
        pytest.raises(StoreError, match=r"no answer within 1 s \(CRAG_STORE_TIMEOUT_S\)"),
    ):
        open_client(Settings(chroma_host="127.0.0.1", chroma_port=hung.port, store_timeout_s=1))
    assert time.monotonic() - start < 10


def test_a_chroma_server_that_hangs_after_opening_is_a_store_error_within_the_store_timeout(embedder):
    # A server that hangs or is stopped while a service runs: it answers what a client asks while it opens.
    with FakeChroma(name=None, hang_s=30) as server:
        client = open_client(Settings(chroma_host="127.0.0.1", chroma_port=server.port, store_timeout_s=1))
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"opening collection 'h__kb': .*no answer within 1 s"):
            ChromaRetriever(client, "h__kb", embedder)
        assert time.monotonic() - start < 10


class FakeEmbedder:
    """Three numbers per text: a query to a fake Chroma server needs an embedding, not a model."""

    name = "fake-embedder"

    def encode(self, texts, **kwargs):
        return [[0.1, 0.2, 0.3] for _ in texts]


ONE_PASSAGE = {
    "ids": [["c1"]],
    "documents": [["The ZP-40 moves 42 litres per minute."]],
    "metadatas": [[{"doc_id": "pumps", "title": "Pumps"}]],
    "distances": [[0.25]],
}


def query_fake_chroma(server: FakeChroma, timeout_s: float = 5.0):
    """Open ``server``'s collection with CRAG's client and query it: the passages, or the error raised."""
    client = open_client(
        Settings(chroma_host="127.0.0.1", chroma_port=server.port, store_timeout_s=timeout_s)
    )
    return ChromaRetriever(client, "t__kb", FakeEmbedder()).retrieve("How fast is the ZP-40?", 1)


def test_a_chroma_server_answers_queries_through_the_bounded_client():
    with FakeChroma(ONE_PASSAGE) as server:
        (passage,) = query_fake_chroma(server)
    assert passage.title == "Pumps" and passage.similarity == 0.75
    assert server.requests[-1]["path"].endswith("/query")


def test_no_passage_from_a_collection_that_holds_chunks_is_a_store_error():
    # Probe 7: a server (here a proxy) answering a query of a filled collection with no rows gave an answered
    # "I don't know", exit 0, its trace saying every passage was graded low when none was retrieved.
    empty = {"ids": [[]], "documents": [[]], "metadatas": [[]], "distances": [[]]}
    with FakeChroma(empty) as server, pytest.raises(StoreError) as info:
        query_fake_chroma(server)
    assert "returned no passage from collection 't__kb', which holds 1 chunks" in str(info.value)


@pytest.mark.parametrize(
    ("fault", "timeout_s", "refused"),
    [
        # A byte every 0.2 s (of the body, or of the head): each read got its byte within the timeout, so
        # the request ran for ever.
        ("drip", 1, r"the server SERVER gave no answer within 1 s \(CRAG_STORE_TIMEOUT_S\)"),
        ("drip-head", 1, r"the server SERVER gave no answer within 1 s \(CRAG_STORE_TIMEOUT_S\)"),
        # Buffered whole: 3 GB, then MemoryError. A query of 1 result reads at most 1 row's bound.
        (
            "endless",
            30,
            r"reply of the server SERVER larger than 0.188 MB \(1 results of 128 KB: MAX_STORE_ROW_BYTES\)",
        ),
    ],
)
def test_a_chroma_reply_that_drips_or_never_ends_is_a_store_error_within_the_time_and_size_limits(
    fault, timeout_s, refused, monkeypatch
):
    monkeypatch.setattr(store, "MAX_STORE_REPLY_BYTES", 2**20)
    start = time.monotonic()
    with FakeChroma(fault=lambda n, body: fault) as server, pytest.raises(StoreError) as info:
        query_fake_chroma(server, timeout_s)
    refused = refused.replace("SERVER", f"127.0.0.1:{server.port}")
    assert re.search(f"^Chroma failed while querying collection 't__kb': {refused}$", str(info.value))
    assert time.monotonic() - start < 5  # the 1 s limit, or 1 MB read, and the fake Chroma opening


def test_a_query_reply_past_its_results_bound_is_refused_under_the_reply_cap():
    # Probe 6: 124 MB of tiny strings, under the 128 MB cap, answering a query of 5 results: parsing it took
    # 3.8 GB and the capped process crashed. A query reads at most k rows of the largest stored chunk.
    flood = {**ONE_PASSAGE, "ids": [["c1"] * 40_000]}  # 240 KB: past one result's 192 KB, under 16 MB
    with FakeChroma(flood) as server, pytest.raises(StoreError) as info:
        query_fake_chroma(server)
    assert str(info.value).endswith(
        f"reply of the server 127.0.0.1:{server.port} larger than 0.188 MB (1 results of 128 KB: MAX_STORE_ROW_BYTES)"
    )


def test_a_reply_without_a_results_bound_is_refused_past_the_reply_cap(monkeypatch):
    monkeypatch.setattr(store, "MAX_STORE_REPLY_BYTES", 100_000)
    with (
        FakeChroma({"ids": ["c"] * 40_000}) as server,
        pytest.raises(StoreError, match="MAX_STORE_REPLY_BYTES"),
    ):
        client = open_client(Settings(chroma_host="127.0.0.1", chroma_port=server.port))
        with store.store_errors("reading"):
            client.get_collection("t__kb").get(ids=["c"])


def test_a_collection_is_read_in_pages_each_under_the_reply_cap(tmp_path, embedder, monkeypatch):
    # One get of every chunk id of a large collection was the reply the old 128 MB cap was sized for.
    monkeypatch.setattr(store, "ID_PAGE_ROWS", 2)
    client = open_client(Settings(chroma_path=tmp_path / "chroma"))
    docs = [CorpusDoc(id=f"d{i}", title=f"D{i}", text=f"Fact number {i}.") for i in range(5)]
    ingest_documents(client, "t__kb", docs, embedder, chunk_words=120, progress=False)
    report = ingest_documents(client, "t__kb", docs[1:], embedder, chunk_words=120, progress=False)
    assert (report.added, report.unchanged, report.removed) == (0, 4, 1)
    pages = list(store.stored_pages(client.get_collection("t__kb"), include=[]))
    assert [len(page["ids"]) for page in pages] == [2, 2]


def test_a_compressed_chroma_reply_is_refused_as_the_size_cap_could_not_bound_it():
    with (
        FakeChroma(ONE_PASSAGE, fault=lambda n, body: "gzip") as server,
        pytest.raises(StoreError, match=r"compressed \(gzip\) although none was asked for"),
    ):
        query_fake_chroma(server)
    assert server.requests[-1]["path"].endswith("/query")


def test_a_malformed_chroma_query_result_through_the_client_is_a_store_error():
    # What probe 3 sent through a proxy: a passage with no text, a distance "nan"; it was graded 1.00.
    malformed = {"ids": [["x"]], "documents": [[None]], "metadatas": [[{"a": 1}]], "distances": [["nan"]]}
    with (
        FakeChroma(malformed) as server,
        pytest.raises(
            StoreError, match=r"malformed query result for collection 't__kb': result 1 \('x'\) has no text"
        ),
    ):
        query_fake_chroma(server)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"documents": [[""]]}, r"result 1 \('c1'\) has no text \(''\)"),
        ({"distances": [["nan"]]}, r"result 1 \('c1'\) has a distance that is no finite number \('nan'\)"),
        ({"distances": [[float("nan")]]}, r"distance that is no finite number \(nan\)"),
        ({"distances": [[True]]}, r"distance that is no finite number \(True\)"),
        ({"metadatas": [["title"]]}, r"metadata that is no object \('title'\)"),
        ({"ids": [[None]]}, r"result 1 has no id \(None\)"),
        ({"distances": [[]]}, r"hold \[1, 1, 1, 0\] results"),
        ({"documents": None}, r"documents is not one list of results"),
    ],
)
def test_malformed_query_rows_are_refused_naming_what_is_wrong(change, why):
    with pytest.raises(StoreError, match=rf"malformed query result for collection 'c': .*{why}"):
        query_rows("c", {**ONE_PASSAGE, **change})
    assert query_rows("c", ONE_PASSAGE) == [
        ("c1", ONE_PASSAGE["documents"][0][0], {"doc_id": "pumps", "title": "Pumps"}, 0.75)
    ]
