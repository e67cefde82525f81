"""Ingestion and retrieval on a real embedded Chroma with the bundled embedding model."""

import pytest

from crag_dspy.domain import CorpusDoc
from crag_dspy.settings import Settings
from crag_dspy.store import ChromaRetriever, StoreError, ingest_documents, open_client

DOCS = [
    CorpusDoc(
        id="leave",
        title="Annual Leave",
        text="Staff receive 27 days of annual leave.\n\nLeave is booked in Harbour.",
    ),
    CorpusDoc(
        id="probe",
        title="AquaProbe 220",
        text="The AquaProbe 220 measures dissolved oxygen from 0 to 25 mg/L.",
    ),
    CorpusDoc(id="canteen", title="Canteen", text="The canteen opens at 08:00 and serves soup on Fridays."),
]


@pytest.fixture()
def client(tmp_path):
    return open_client(Settings(chroma_path=tmp_path / "chroma"))


def ids(client, name="t__kb"):
    return set(client.get_collection(name).get(include=[])["ids"])


def test_ingest_is_idempotent_and_retrieves(client, embedder):
    first = ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    assert (first.added, first.unchanged, first.removed) == (first.chunks, 0, 0)
    before = ids(client)
    again = ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    assert (again.added, again.unchanged, again.removed) == (0, first.chunks, 0)
    assert ids(client) == before
    hits = ChromaRetriever(client, "t__kb", embedder).retrieve(
        "dissolved oxygen range of the AquaProbe 220", 2
    )
    assert hits[0].doc_id == "probe" and hits[0].rank == 0 and hits[0].similarity > hits[1].similarity
    assert hits[0].display.startswith("AquaProbe 220\n")


def test_changed_document_replaces_its_chunks_and_removed_ones_go(client, embedder):
    ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    changed = [DOCS[0].model_copy(update={"text": "Staff receive 30 days of annual leave."}), DOCS[1]]
    report = ingest_documents(client, "t__kb", changed, embedder, chunk_words=120, progress=False)
    assert report.added == 1 and report.removed == 2  # old leave chunk + canteen
    texts = client.get_collection("t__kb").get(include=["documents"])["documents"]
    assert "Staff receive 30 days of annual leave." in texts and not any("27 days" in t for t in texts)
    assert not any("canteen" in t for t in texts)


def test_interrupted_ingest_resumes_without_duplicates(client, embedder):
    ingest_documents(
        client, "t__kb", DOCS[:1], embedder, chunk_words=120, progress=False
    )  # "crashed" after doc 1
    report = ingest_documents(client, "t__kb", DOCS, embedder, chunk_words=120, progress=False)
    assert report.unchanged == 1 and report.removed == 0
    assert len(ids(client)) == report.chunks


def test_missing_collection_is_a_clear_error(client, embedder):
    with pytest.raises(StoreError, match="ingest"):
        ChromaRetriever(client, "nope__kb", embedder)


def test_unreachable_chroma_server_is_a_clear_error():
    with pytest.raises(StoreError, match="Cannot open Chroma \\(server 127.0.0.1:9"):
        open_client(Settings(chroma_host="127.0.0.1", chroma_port=9))
