"""Scale-out path: a real `chroma run` server on loopback, ingest and answer through HttpClient, and a
clear error (with no partial state) once the server is gone."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import ScriptedLM, field

from crag_dspy.app import build_crag
from crag_dspy.cli import main
from crag_dspy.domain import load_domain
from crag_dspy.faults import RetrievalError
from crag_dspy.settings import Settings
from crag_dspy.store import StoreError, ingest_gaps, open_client

CHROMA = Path(sys.executable).with_name("chroma")
pytestmark = pytest.mark.skipif(not CHROMA.exists(), reason="the chroma CLI is not installed next to python")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ChromaServer:
    def __init__(self, path: Path, log: Path):
        self.port = free_port()
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [str(CHROMA), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chroma run exited with {self.process.returncode}")
            try:
                open_client(Settings(chroma_host="127.0.0.1", chroma_port=self.port))
                return
            except StoreError:
                time.sleep(0.3)
        raise TimeoutError(f"chroma server on port {self.port} not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


@pytest.fixture()
def server(tmp_path):
    chroma = ChromaServer(tmp_path / "server-data", tmp_path / "chroma.log")
    try:
        chroma.wait_ready()
        yield chroma
    finally:
        chroma.stop()  # also when the test fails


def tiny_domain(root: Path) -> Path:
    root.mkdir()
    docs = [
        {"id": "leave", "title": "Annual Leave", "text": "Staff receive 27 days of annual leave."},
        {"id": "probe", "title": "AquaProbe 220", "text": "The AquaProbe 220 costs 1,240 velds."},
    ]
    web = [
        {"id": "w1", "title": "Leave law", "url": "https://law.example", "text": "The minimum is 20 days."}
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "web.jsonl").write_text("".join(json.dumps(d) + "\n" for d in web), encoding="utf-8")
    (root / "domain.toml").write_text('name = "tiny"\nk = 2\n', encoding="utf-8")
    return root


def script(system, user):
    if "You judge search results" in system:
        return 0.9 if "27 days" in field(user, "document") else 0.1
    if "You judge short knowledge strips" in system:
        return 0.9 if "27 days" in field(user, "strip") else 0.1
    if "web search query" in system:
        return {"query": "annual leave"}
    return {"answer": "27 days" if "27 days" in field(user, "context") else "I don't know"}


def test_ingest_and_answer_through_a_chroma_server_then_fail_clearly_when_it_is_gone(
    server, tmp_path, capsys
):
    domain = tiny_domain(tmp_path / "tiny")
    flags = ["--chroma-host", "127.0.0.1", "--chroma-port", str(server.port)]
    assert main(["ingest", str(domain), *flags]) == 0
    assert "tiny__kb: 2 documents, 2 chunks (2 added" in capsys.readouterr().out
    assert main(["ingest", str(domain), *flags]) == 0  # idempotent on the server too
    assert "0 added, 2 unchanged, 0 removed" in capsys.readouterr().out

    settings = Settings(
        chroma_host="127.0.0.1",
        chroma_port=server.port,
        domain_dir=domain,
        web_search="offline",
        cache_dir=tmp_path,
    )
    # The ingest manifest lives in the collection's metadata: the same code path on a server.
    client = open_client(settings)
    assert ingest_gaps(client, load_domain(domain)) == []
    kb = client.get_collection("tiny__kb")
    assert kb.metadata["ingest_chunks"] == 2 and len(kb.metadata["ingest_sha256"]) == 64
    kb.delete(ids=kb.get(include=[])["ids"][:1])  # a chunk lost: build_crag completes the store
    assert ingest_gaps(client, load_domain(domain)) == ["collection 'tiny__kb' holds 1 of 2 chunks"]
    crag = build_crag(settings, lm=ScriptedLM(script), progress=False)
    assert client.get_collection("tiny__kb").count() == 2 and ingest_gaps(client, load_domain(domain)) == []
    pred = crag(question="How many days of annual leave do staff get?")
    assert pred.answer == "27 days" and pred.action == "CORRECT"
    assert pred.trace.retriever == "chroma:tiny__kb" and pred.trace.documents[0].doc_id == "leave"
    assert not (tmp_path / "chroma").exists()  # server mode never touches an embedded folder

    server.stop()
    with pytest.raises(RetrievalError, match="retriever chroma:tiny__kb failed") as info:
        crag(question="How many days of annual leave do staff get?")
    assert info.value.trace.answer is None and info.value.trace.documents == []
    with pytest.raises(StoreError, match=f"Cannot open Chroma \\(server 127.0.0.1:{server.port}\\)"):
        open_client(settings)
    assert main(["ingest", str(domain), *flags]) == 2
    assert f"Cannot open Chroma (server 127.0.0.1:{server.port})" in capsys.readouterr().err
    assert not (tmp_path / "chroma").exists()
