"""Scale out without loading the world: an up-to-date store needs no corpus parse, a domain folder without
a corpus is served from the store alone, and ``serve --workers N`` runs N processes."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fake_servers import FakeOpenAI
from serving import FESTIVAL_Q, LEAVE_Q, free_port, harbour_lm, write_domain
from test_chroma_server import CHROMA, ChromaServer

import crag_dspy.domain
from crag_dspy.app import build_crag, open_backends
from crag_dspy.cli import main
from crag_dspy.domain import load_domain
from crag_dspy.serve.cli import main as serve_main
from crag_dspy.settings import Settings
from crag_dspy.store import MANIFEST_SOURCE, StoreError, ingest_gaps, open_client

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def harbour(tmp_path):
    domain = write_domain(tmp_path / "harbour")
    settings = Settings(chroma_path=tmp_path / "chroma", domain_dir=domain, web_search="offline")
    open_backends(settings, progress=False)  # ingests: the manifest records the files
    return domain, settings


class Parses(list):
    """The domain data files parsed, by name; after ``forbid()`` a parse fails the test."""

    forbidden = False

    def forbid(self) -> None:
        self.forbidden = True

    def saw(self, path) -> None:
        self.append(Path(path).name)
        if self.forbidden:
            raise AssertionError(f"{path} was parsed")


@pytest.fixture()
def parses(monkeypatch):
    seen = Parses()
    load_jsonl, load_folder = crag_dspy.domain.load_jsonl, crag_dspy.domain.load_folder
    monkeypatch.setattr(
        crag_dspy.domain, "load_jsonl", lambda path, model: (seen.saw(path), load_jsonl(path, model))[1]
    )
    monkeypatch.setattr(
        crag_dspy.domain,
        "load_folder",
        lambda path, **limits: (seen.saw(path), load_folder(path, **limits))[1],
    )
    return seen


def test_an_up_to_date_store_answers_without_parsing_the_corpus(harbour, parses, caplog):
    domain, settings = harbour
    kb = open_client(settings).get_collection("harbour__kb")
    record = json.loads(kb.metadata[MANIFEST_SOURCE])
    assert record["files"] == "corpus.jsonl" and record["chunk_words"] == 120
    parses.forbid()
    crag = build_crag(settings, lm=harbour_lm(), progress=False)
    assert "27 days" in crag(question=LEAVE_Q).answer
    festival = crag(question=FESTIVAL_Q)  # the offline web collection is used without parsing web.jsonl
    assert festival.trace.web_backend == "offline" and "14 June" in festival.answer
    # Touched (a checkout, a copy to another machine): new times, same bytes -> still no parse.
    os.utime(domain / "corpus.jsonl", ns=(1, 1))
    assert ingest_gaps(open_client(settings), load_domain(domain, lazy=True)) == []
    assert parses == [] and not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_changed_corpus_is_parsed_and_re_ingested(harbour, parses, caplog):
    domain, settings = harbour
    corpus = (domain / "corpus.jsonl").read_text(encoding="utf-8").replace("27 days", "31 days")
    (domain / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    crag = build_crag(settings, lm=harbour_lm(), progress=False)
    assert "corpus.jsonl" in parses
    changed = "collection 'harbour__kb' was ingested from other content than the domain holds now"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [f"domain 'harbour': {changed}; ingesting it now"]
    texts = crag.retriever.retrieve("annual leave", 1)[0].text
    assert "31 days" in texts
    parses.forbid()  # the new manifest records the new file
    assert ingest_gaps(open_client(settings), load_domain(domain, lazy=True)) == []


def test_a_partial_ingest_is_still_found_without_trusting_the_file_keys(harbour):
    domain, settings = harbour
    kb = open_client(settings).get_collection("harbour__kb")
    kb.delete(ids=kb.get(include=[])["ids"][:1])  # a chunk lost behind the store's back
    assert ingest_gaps(open_client(settings), load_domain(domain, lazy=True)) == [
        "collection 'harbour__kb' holds 2 of 3 chunks"
    ]
    assert open_backends(settings, progress=False).retriever().count() == 3


def test_another_version_compares_the_chunks_once_then_trusts_the_files_again(harbour, parses):
    domain, settings = harbour
    kb = open_client(settings).get_collection("harbour__kb")
    record = json.loads(kb.metadata[MANIFEST_SOURCE])
    kb.modify(metadata={**kb.metadata, MANIFEST_SOURCE: json.dumps({**record, "version": "0.0.1"})})
    assert ingest_gaps(open_client(settings), load_domain(domain, lazy=True)) == []
    assert parses == ["corpus.jsonl"]  # chunks compared: the same, so the manifest learns the files
    parses.forbid()
    assert ingest_gaps(open_client(settings), load_domain(domain, lazy=True)) == []


def test_without_a_corpus_file_the_store_alone_answers_and_says_so(harbour, caplog):
    domain, settings = harbour
    (domain / "corpus.jsonl").unlink()
    (domain / "web.jsonl").unlink()
    caplog.clear()
    crag = build_crag(settings, lm=harbour_lm(), progress=False)
    assert "27 days" in crag(question=LEAVE_Q).answer
    assert crag(question=FESTIVAL_Q).trace.web_backend == "offline"  # the stored web collection
    (told,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert told.startswith("domain 'harbour': no corpus in ") and "collection 'harbour__kb'" in told


def test_without_a_corpus_file_an_unfinished_or_missing_store_is_a_clear_error(tmp_path, harbour):
    domain, settings = harbour
    (domain / "corpus.jsonl").unlink()
    with pytest.raises(StoreError, match="has no corpus in .* does not exist"):
        open_backends(settings.model_copy(update={"chroma_path": tmp_path / "empty"}), progress=False)
    kb = open_client(settings).get_collection("harbour__kb")
    kb.modify(metadata={k: v for k, v in kb.metadata.items() if not k.startswith("ingest_")})
    with pytest.raises(StoreError, match="holds 3 chunks and no ingest manifest"):
        open_backends(settings, progress=False)


@pytest.mark.skipif(not CHROMA.exists(), reason="the chroma CLI is not installed next to python")
def test_crag_dspy_ask_runs_from_a_chroma_server_alone_once_the_corpus_is_gone(tmp_path, capsys, caplog):
    domain = write_domain(tmp_path / "harbour")
    chroma = ChromaServer(tmp_path / "server-data", tmp_path / "chroma.log")
    try:
        chroma.wait_ready()
        flags = ["--domain-dir", str(domain), "--chroma-host", "127.0.0.1", "--chroma-port", str(chroma.port)]
        assert main(["ingest", *flags]) == 0
        (domain / "corpus.jsonl").unlink()  # a serving machine needs only domain.toml
        (domain / "web.jsonl").unlink()
        capsys.readouterr()
        with FakeOpenAI(_script) as lm:
            model = f"openai/fake-{uuid.uuid4().hex[:8]}"
            ask = ["ask", FESTIVAL_Q, *flags, "--lm", model, "--lm-api-base", lm.api_base]
            assert main([*ask, "--web-search", "offline"]) == 0
        out = capsys.readouterr().out
        assert "answer: 14 June 2025" in out and "web: offline" in out  # the stored web collection
        assert any("no corpus in" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    finally:
        chroma.stop()


def test_serve_refuses_several_workers_on_the_embedded_lm_and_says_what_to_do(capsys):
    assert serve_main(["--workers", "2", "--lm", "embedded"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --workers 2 with the embedded LM would start 2 copies")
    assert "--lm-api-base" in err and "vLLM" in err


def _script(system: str, user: str):
    return harbour_lm().script(system, user)


def test_serve_runs_two_worker_processes_that_answer(tmp_path):
    """The real command with --workers 2 against a fake OpenAI-compatible LM server; the settings reach
    the workers (a key from the environment, the domain and LM flags)."""
    domain = write_domain(tmp_path / "harbour")
    # Ingested here, where the embedding model is loaded already: the command then only checks the store.
    open_backends(Settings(chroma_path=tmp_path / "chroma", domain_dir=domain), progress=False)
    port, model = free_port(), f"openai/fake-{uuid.uuid4().hex[:8]}"  # no answer from DSPy's disk cache
    with FakeOpenAI(_script) as lm:
        argv = [sys.executable, "-m", "crag_dspy.serve", "--domain-dir", str(domain), "--workers", "2"]
        argv += ["--chroma-path", str(tmp_path / "chroma"), "--lm", model, "--port", str(port)]
        argv += ["--lm-api-base", lm.api_base, "--web-search", "offline"]
        env = {**os.environ, "CRAG_LM_RETRIES": "0", "CRAG_API_KEYS": "a-key-of-sufficient-length-42"}
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120
            while sum("Application startup complete" in line for line in list(lines)) < 2:
                assert process.poll() is None, "".join(lines)
                assert time.monotonic() < deadline, "the workers did not come up:\n" + "".join(lines)
                time.sleep(0.25)
            url = f"http://127.0.0.1:{port}"
            assert httpx.get(f"{url}/health").json()["domain"] == "harbour"
            assert httpx.post(f"{url}/ask", json={"question": LEAVE_Q}).status_code == 401  # keys reached
            headers = {"X-API-Key": "a-key-of-sufficient-length-42"}
            for _ in range(4):
                response = httpx.post(f"{url}/ask", json={"question": LEAVE_Q}, headers=headers, timeout=60)
                assert response.status_code == 200 and "27 days" in response.json()["answer"]
        finally:
            process.terminate()
            process.wait(timeout=30)
            reader.join(10)
    output = "".join(lines)
    workers = {line.split("[")[1].split("]")[0] for line in lines if "Started server process" in line}
    assert len(workers) == 2, output
    assert "with 2 worker processes" in output and "per worker process" in output
    assert len(lm.requests) >= 4  # every answer came from the LM server, none from an embedded model
