"""The HTTP service over a scripted LM: status codes, schema, failure attribution, concurrency, CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from serving import free_port, local_client, serving, write_domain

from crag_dspy import CRAG
from crag_dspy.app import LoadedProgram
from crag_dspy.config import CRAGConfig
from crag_dspy.program import read_program, save_program
from crag_dspy.protocols import WebResult, WebSearchError
from crag_dspy.serve import QUESTION_MAX_CHARS, AskResponse, ProgramInfo, ProgramService, create_app
from crag_dspy.serve.cli import main as serve_main
from crag_dspy.serve.policy import ServePolicy

GOOD = ("kb-good", "The AquaProbe 220 has a range of 0 to 25 mg/L.")
BAD = ("kb-bad", "The canteen opens at 08:00.")
WEB = WebResult("WQ-17", "https://ihsc.example/wq17", "IHSC WQ-17 requires recalibration every 90 days.")


def script(system: str, user: str):
    if "You judge search results" in system:
        return 0.9 if "0 to 25" in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if "90 days" in field(user, "strip") else 0.05
    if "web search query" in system:
        return {"query": "WQ-17 recalibration"}
    return {"answer": "0 to 25 mg/L" if "0 to 25" in field(user, "context") else "every 90 days"}


def make_service(texts=(GOOD, BAD), web=None, lm=None, retries=2) -> ProgramService:
    config = CRAGConfig(lm_calls={"retries": retries})
    crag = CRAG(ListRetriever(list(texts)), web or ListWebSearch([WEB]), config, lm=lm or ScriptedLM(script))
    return ProgramService(LoadedProgram(crag, "default"))


@pytest.fixture()
def client():
    return local_client(create_app(make_service()), raise_server_exceptions=False)


def test_ask_returns_answer_action_and_the_trace_trimmed_for_clients(client):
    response = client.post("/ask", json={"question": "  What is the range of the AquaProbe 220?  "})
    assert response.status_code == 200
    body = AskResponse.model_validate(response.json())
    assert (body.answer, body.action, body.degraded, body.full_trace) == (
        "0 to 25 mg/L",
        "CORRECT",
        False,
        False,
    )
    trace = response.json()["trace"]
    assert trace["question"] == "What is the range of the AquaProbe 220?"  # stripped at the boundary
    assert [(d["doc_id"], round(d["score"], 2)) for d in trace["documents"]] == [
        ("kb-good", 0.9),
        ("kb-bad", 0.05),
    ]
    assert [(s["kept"], s["text"]) for s in trace["internal_strips"]] == [(True, GOOD[1])]
    assert "graded_text" not in trace["documents"][0] and "context" not in trace
    assert set(trace["timings"]) >= {"retrieve", "grade", "answer"} and body.seconds > 0
    assert sum(u["calls"] for u in trace["lm_usage"].values()) == 3  # 2 grades + 1 answer


def test_ask_returns_the_citations_with_the_pdf_page_of_the_strip_it_quotes():
    service = make_service()
    passages = service.crag.retriever.passages
    passages[0] = dataclasses.replace(
        passages[0], doc_id="pdf/aquaprobe-manual.pdf", title="AquaProbe 220 manual", page=2
    )
    response = local_client(create_app(service)).post("/ask", json={"question": "What is the range?"})
    assert response.status_code == 200
    body = response.json()
    assert body["answer"] == "0 to 25 mg/L"
    assert body["citations"] == [
        {
            "doc_id": "pdf/aquaprobe-manual.pdf",
            "title": "AquaProbe 220 manual",
            "source": "internal",
            "page": 2,
            "section": None,
            "url": None,
            "quote": GOOD[1],
            "label": "pdf/aquaprobe-manual.pdf, p. 2",
        }
    ]
    assert AskResponse.model_validate(body).citations[0].label == "pdf/aquaprobe-manual.pdf, p. 2"
    trace = body["trace"]
    assert trace["citations"] == body["citations"]  # the trimmed trace carries them too
    assert [(s["doc_id"], s["page"], s["kept"]) for s in trace["internal_strips"]] == [
        ("pdf/aquaprobe-manual.pdf", 2, True)
    ]


def test_an_abstention_cites_nothing():
    lm = ScriptedLM(
        lambda system, user: {"answer": "I don't know"} if "context" in user else script(system, user)
    )
    body = local_client(create_app(make_service(lm=lm))).post("/ask", json={"question": "range?"}).json()
    assert body["answer"] == "I don't know" and body["citations"] == [] and body["trace"]["citations"] == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"question": ""}, "question: must not be empty"),
        ({"question": " \n\t "}, "question: must not be empty or only whitespace"),
        ({"question": "x" * (QUESTION_MAX_CHARS + 1)}, f"at most {QUESTION_MAX_CHARS} characters"),
        # The typed length is within the limit, the normalised one (NFC) is not: it ran 5,998 characters.
        (
            {"question": "\U0001d160" * 1999 + "?"},
            "question: the question is 2000 characters long, but 5998 once normalised",
        ),
        ({"question": "\u200b\u2060\u00ad"}, "question: the question is empty"),  # it was answered
        ({}, "question: Field required"),
        ({"question": 42}, "question: Input should be a valid string"),
        ({"question": "q", "k": 3}, "k: Extra inputs are not permitted"),
        (["q"], 'the body must be a JSON object such as {"question": "..."}'),
    ],
)
def test_bad_requests_are_422_with_a_clear_message(client, payload, message):
    response = client.post("/ask", json=payload)
    assert response.status_code == 422
    body = response.json()
    assert body["detail"].startswith("invalid request: ") and message in body["detail"]
    assert body["errors"] and {"type", "loc", "msg"} <= set(body["errors"][0])


def test_malformed_json_and_wrong_method_and_path(client):
    response = client.post("/ask", content=b'{"question": ', headers={"content-type": "application/json"})
    assert response.status_code == 422 and "not valid JSON" in response.json()["detail"]
    response = client.post("/ask", content=b"question=hi", headers={"content-type": "text/plain"})
    assert response.status_code == 422 and "JSON object" in response.json()["detail"]
    assert client.get("/ask").status_code == 405
    assert client.get("/nope").status_code == 404


def test_question_of_exactly_the_maximum_length_is_accepted(client):
    assert client.post("/ask", json={"question": "q" * QUESTION_MAX_CHARS}).status_code == 200


def test_health_and_program_of_the_uncompiled_default(client):
    health = client.get("/health").json()
    assert health == {
        "status": "ok",
        "compiled": False,
        "domain": "default",
        "domains": ["default"],
        "version": "0.2.0",
    }
    assert client.head("/health").status_code == 200  # load balancers' probes: it was a 405
    info = ProgramInfo.model_validate(client.get("/program").json())
    assert not info.compiled and info.path is None and info.metadata == {} and info.scores is None
    assert "uncompiled default program" in info.note and "crag-dspy compile" in info.note
    assert (info.lower, info.upper, info.lm, info.config["k"]) == (0.3, 0.7, "scripted/fake", 5)


def test_program_of_a_compiled_program_shows_its_thresholds_metadata_and_scores(tmp_path):
    scores = {"val_accuracy": 0.708, "test": {"crag": 0.5, "plain_rag": 0.54}}
    compiled = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.12, upper=0.83, k=4))
    metadata = {"domain": "default", "domain_dir": str(tmp_path / "kb"), "seed": 3, "scores": scores}
    path = save_program(compiled, tmp_path / "program.json", metadata)
    document = read_program(path)
    crag = CRAG(ListRetriever([GOOD]), ListWebSearch(), lm=ScriptedLM(script))
    from crag_dspy.program import apply_program

    service = ProgramService(LoadedProgram(apply_program(crag, document), "default", path, document))
    client = local_client(create_app(service))
    info = client.get("/program").json()
    assert info["compiled"] and info["created"] == document["metadata"]["created"]
    # No folder of the server's disk reaches a client: paths become their last part.
    assert info["path"] == "program.json" and info["metadata"]["domain_dir"] == "kb"
    assert str(tmp_path) not in client.get("/program").text
    assert (info["lower"], info["upper"], info["config"]["k"]) == (0.12, 0.83, 4)
    assert info["scores"] == scores and info["metadata"]["seed"] == 3
    assert client.get("/health").json()["compiled"] is True
    assert client.post("/ask", json={"question": "range?"}).json()["trace"]["lower"] == 0.12


def test_openapi_schema_is_published_with_every_route_and_error_shape(client):
    schema = client.get("/openapi.json").json()
    assert {"/ask", "/health", "/program"} <= set(schema["paths"])
    responses = schema["paths"]["/ask"]["post"]["responses"]
    assert {"200", "422", "500", "503"} <= set(responses)
    assert responses["503"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    components = schema["components"]["schemas"]
    assert {"AskRequest", "AskResponse", "CRAGTrace", "DocumentGrade", "StripRecord", "ProgramInfo"} <= set(
        components
    )
    assert components["AskRequest"]["properties"]["question"]["maxLength"] == QUESTION_MAX_CHARS
    # Citations are documented on the answer, in the trimmed trace, and so are the strips' page and section.
    ask = components["AskResponse"]
    assert (
        "citations" in ask["required"] and "page or section" in ask["properties"]["citations"]["description"]
    )
    assert ask["properties"]["citations"]["items"]["$ref"].endswith("/Citation")
    assert {"doc_id", "source", "page", "section", "url", "quote"} <= set(
        components["Citation"]["properties"]
    )
    assert components["ClientTrace"]["properties"]["citations"]["items"]["$ref"].endswith("/Citation")
    assert {"page", "section"} <= set(components["ClientStrip"]["properties"])


def test_page_and_its_script_are_served_with_a_strict_policy(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert (
        '<script src="/app.js"></script>' in page.text
        and "script-src 'self'" in page.headers["content-security-policy"]
    )
    script_response = client.get("/app.js")
    assert script_response.status_code == 200 and 'fetch("/ask/stream"' in script_response.text


def test_failed_web_search_is_a_degraded_answer_that_says_why():
    client = local_client(
        create_app(make_service(texts=[BAD], web=ListWebSearch(error=WebSearchError("quota"))))
    )
    body = client.post("/ask", json={"question": "How often is WQ-17 recalibrated?"}).json()
    assert body["action"] == "INCORRECT" and body["degraded"] is True
    assert any("web search failed (quota)" in f for f in body["trace"]["fallbacks"])


def test_partly_failing_lm_is_a_degraded_answer_with_the_errors():
    def flaky(system, user):
        if "You judge search results" in system and "canteen" in field(user, "document"):
            return RuntimeError("llama.cpp slot crashed")
        return script(system, user)

    client = local_client(create_app(make_service(lm=ScriptedLM(flaky), retries=0)))
    response = client.post("/ask", json={"question": "What is the range?"})
    assert response.status_code == 200
    body = response.json()
    assert body["answer"] == "0 to 25 mg/L" and body["degraded"] is True
    assert [d["score"] for d in body["trace"]["documents"]] == [0.9, None]
    assert any("grader failed on kb-bad" in e and "slot crashed" in e for e in body["trace"]["errors"])


def test_lm_failing_on_every_call_is_503_naming_the_lm_with_the_trace():
    lm = ScriptedLM(lambda s, u: ConnectionError("connection refused"))
    client = local_client(create_app(make_service(lm=lm, retries=0)))
    response = client.post("/ask", json={"question": "What is the range?"})
    assert response.status_code == 503
    body = response.json()
    assert body["dependency"] == "lm"
    assert "calls in a row" in body["detail"] and "connection refused" in body["detail"]
    assert body["trace"]["errors"] and all(d["score"] is None for d in body["trace"]["documents"])


def test_an_lm_answering_every_call_with_a_proxy_page_is_503_not_i_dont_know():
    """An HTTP 200 that is no chat completion (a proxy's HTML page) on every call: the LM is down."""
    import dspy
    from fake_servers import FakeOpenAI

    with FakeOpenAI(script, lambda n, body: "html") as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="k", cache=False, num_retries=0)
        response = local_client(create_app(make_service(lm=lm))).post(
            "/ask", json={"question": "What is the range?"}
        )
    assert response.status_code == 503
    body = response.json()
    assert body["dependency"] == "lm" and "no chat completion" in body["detail"]


def test_store_failure_is_503_naming_the_store():
    class BrokenStore:
        name = "chroma:broken"

        def retrieve(self, query, k):
            raise OSError("database disk image is malformed")

    crag = CRAG(BrokenStore(), ListWebSearch(), lm=ScriptedLM(script))
    client = local_client(create_app(ProgramService(LoadedProgram(crag, "default"))))
    response = client.post("/ask", json={"question": "q"})
    assert response.status_code == 503
    assert response.json()["dependency"] == "store"
    assert "database disk image is malformed" in response.json()["detail"]
    assert client.get("/program").json()["retriever"] == "chroma:broken"  # the guard keeps the name


def test_a_bug_is_500_naming_the_exception(monkeypatch):
    service = make_service()

    def broken_format(*args, **kwargs):
        raise KeyError("context")

    monkeypatch.setattr("crag_dspy.stages.answer.format_context", broken_format)
    client = local_client(create_app(service), raise_server_exceptions=False)
    response = client.post("/ask", json={"question": "q"})
    assert response.status_code == 500 and response.json()["detail"] == "internal error: KeyError: 'context'"


def test_concurrent_requests_get_their_own_traces():
    """N requests at once on a real loopback server: no trace, answer, usage or failure is mixed up."""
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def per_question(system, user):
        question = field(user, "question")
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(0.01)  # let the requests interleave inside the module
            n = question.split()[1]
            if "fail" in question:
                return ConnectionError(f"LM down for {n}")
            if "You judge search results" in system:
                return 0.9 if "right" in question else 0.05
            if "You judge short knowledge strips" in system:
                return 0.9
            if "web search query" in system:
                return {"query": f"query {n}"}
            return {"answer": f"answer {n}"}
        finally:
            with lock:
                in_flight[0] -= 1

    service = make_service(lm=ScriptedLM(per_question), retries=0)
    kinds = ["right", "wrong", "fail"]
    questions = [f"question {i} {kinds[i % 3]}" for i in range(24)]
    with (
        serving(create_app(service)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
        ThreadPoolExecutor(max_workers=12) as pool,
    ):
        responses = list(pool.map(lambda q: http.post("/ask", json={"question": q}), questions))
    assert peak[0] > 1, "requests were served one at a time"
    for i, (question, response) in enumerate(zip(questions, responses)):
        body = response.json()
        if kinds[i % 3] == "fail":
            assert response.status_code == 503 and body["dependency"] == "lm"
            assert f"LM down for {i}" in body["detail"] and body["trace"]["question"] == question
            continue
        assert response.status_code == 200, body
        trace = body["trace"]
        assert trace["question"] == question and body["answer"] == f"answer {i}"
        calls = sum(u["calls"] for u in trace["lm_usage"].values())
        if kinds[i % 3] == "right":
            assert body["action"] == "CORRECT" and calls == 3  # 2 grades + answer
        else:
            # 2 grades + rewrite + 1 web strip + answer
            assert body["action"] == "INCORRECT" and trace["web_query"] == f"query {i}" and calls == 5
        assert trace["errors"] == []


# --- the command line ---------------------------------------------------------------------------------
def test_serve_help_lists_the_shared_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--program",
        "--domain",
        "--chroma-path",
        "--lm",
        "--lower",
        "--host",
        "--port",
        "--insecure",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--program", "/nonexistent/program.json"], "cannot read program"),
        (["--port", "70000"], "--port must be in 1..65535"),
        (["--lm", "gpt-4o-mini"], "not a LiteLLM model string"),
    ],
)
def test_serve_bad_input_exits_2_before_listening(argv, message, capsys):
    assert serve_main(argv) == 2
    assert message in capsys.readouterr().err


def test_serve_on_a_port_in_use_exits_2_in_one_line_before_loading(monkeypatch, capsys):
    # It loaded everything (12 s), then uvicorn logged "address already in use" and exited 3.
    monkeypatch.setattr("crag_dspy.serve.cli.load_programs", lambda *a, **k: pytest.fail("loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve_main(["--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use (another server listens there: "
        "stop it or choose another --port)"
    )


def test_serve_command_end_to_end_with_an_unreachable_lm(tmp_path):
    """The real command: ingests a tiny domain into a tmp Chroma, serves it, and names the dead LM."""
    domain = write_domain(tmp_path / "harbour")
    port, dead_lm = free_port(), free_port()
    env = {**os.environ, "CRAG_LM_RETRIES": "0", "CRAG_WEB_SEARCH": "offline"}
    argv = [sys.executable, "-m", "crag_dspy.serve", "--domain-dir", str(domain)]
    argv += ["--chroma-path", str(tmp_path / "chroma"), "--lm", "openai/none"]
    argv += ["--lm-api-base", f"http://127.0.0.1:{dead_lm}/v1", "--port", str(port)]
    process = subprocess.Popen(
        argv,
        cwd=Path(__file__).parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.25)
        assert health.json()["domain"] == "harbour" and health.json()["compiled"] is False
        info = httpx.get(f"{url}/program").json()
        assert info["retriever"] == "chroma:harbour__kb" and info["web_backend"] == "offline"
        response = httpx.post(f"{url}/ask", json={"question": "How much annual leave?"}, timeout=60)
        assert response.status_code == 503
        assert response.json()["dependency"] == "lm" and "Connection" in response.json()["detail"]
        assert httpx.post(f"{url}/ask", json={"question": ""}).status_code == 422
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert "uncompiled default program" in output and f"http://127.0.0.1:{port}/" in output
    # The access log is on without -v: one JSON line per request (uvicorn's own lines are off).
    access = [
        json.loads(line[line.index("{") :]) for line in output.splitlines() if '"event": "access"' in line
    ]
    assert [(a["path"], a["status"]) for a in access] == [
        ("/health", 200),
        ("/program", 200),
        ("/ask", 503),
        ("/ask", 422),
    ]
    assert "How much annual leave?" not in output and '"POST /ask HTTP/1.1"' not in output


def test_program_flags_keep_the_programs_domain_and_honour_storage_and_threshold_flags(tmp_path, monkeypatch):
    """--program without --domain serves the program's own (bundled) domain, on the store the flags name."""
    from crag_dspy.serve.cli import build_parser
    from crag_dspy.serve.programs import load_programs

    write_domain(tmp_path / "data" / "harbour")
    monkeypatch.setattr("crag_dspy.settings.DEFAULT_DATA_DIR", tmp_path / "data")  # the bundled domains
    compiled = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.12, upper=0.83))
    path = save_program(compiled, tmp_path / "p.json", {"domain": "harbour"})
    chroma = tmp_path / "chroma"
    args = build_parser().parse_args(["--program", str(path), "--chroma-path", str(chroma), "--lower", "0.2"])
    (loaded,) = load_programs(args, lm=ScriptedLM(script), progress=False)
    assert loaded.compiled and loaded.domain == "harbour" and loaded.path == path
    assert chroma.is_dir()  # the flag is honoured, not only the program's domain
    assert (loaded.crag.thresholds.lower, loaded.crag.thresholds.upper) == (0.2, 0.83)
    assert loaded.crag.retriever.name == "chroma:harbour__kb"


@pytest.mark.parametrize(
    "body", [b"[" * 30000 + b"]" * 30000, b'{"question": ' + b"[" * 30000 + b"]" * 30000 + b"}"]
)
def test_json_nested_too_deeply_to_parse_is_422_in_the_shape_of_every_invalid_request(body):
    # It was a bare 400 {"detail": "There was an error parsing the body"}.
    client = local_client(create_app(make_service()), raise_server_exceptions=False)
    response = client.post("/ask", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"] == "invalid request: the body is not valid JSON (nested too deeply)"


@pytest.mark.parametrize("path", ["/ask", "/ask/stream"])
@pytest.mark.parametrize("question", ["\u0000\u0001\u001b", "\u202e\u0007 \u0000"])
def test_a_question_crag_refuses_is_422_in_one_line_without_a_logged_traceback(question, path, caplog):
    # /ask/stream answered "200 text/event-stream" with the 422 JSON as its body, and a traceback.
    client = local_client(create_app(make_service()), raise_server_exceptions=False)
    with caplog.at_level("DEBUG"):
        response = client.post(path, json={"question": question})
    assert response.status_code == 422 and response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert detail.startswith("invalid request: question: the question ") and "\n" not in detail
    assert response.json()["errors"][0]["loc"] == ["body", "question"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= 40]  # no traceback, no error


def test_serve_without_fastapi_says_what_to_install_in_one_line():
    """As `python -m crag_dspy.serve` runs without the serve extra (fastapi made unimportable)."""
    code = (
        "import runpy, sys\n"
        "sys.modules['fastapi'] = None\n"
        "try:\n"
        "    from crag_dspy.serve import create_app\n"
        "except ImportError as exc:\n"
        "    print('library:', exc)\n"
        "sys.argv = ['crag_dspy.serve', '--port', '1']\n"
        "runpy.run_module('crag_dspy.serve', run_name='__main__', alter_sys=True)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    hint = "pip install 'crag-dspy[serve]'"
    assert run.returncode == 2, run.stderr
    assert (
        run.stderr
        == f"error: crag_dspy.serve needs FastAPI, uvicorn and limits (fastapi is missing): {hint}\n"
    )
    assert run.stdout.startswith("library: crag_dspy.serve needs FastAPI") and hint in run.stdout


def test_warm_up_retrieves_once_so_the_first_request_waits_for_no_model_load():
    service = make_service()
    asked: list[tuple[str, int]] = []
    retrieve = service.crag.retriever.retrieve
    service.crag.retriever.retrieve = lambda query, k: asked.append((query, k)) or retrieve(query, k)
    service.warm_up()
    assert asked == [("warm-up", 1)]


def test_a_client_that_leaves_post_ask_stops_its_run_and_frees_its_queue_place():
    # /ask went on after its client left: abandoned questions held the queue (503 busy) and spent the LM.
    calls, first_call, release = [], threading.Event(), threading.Event()

    def held(system: str, user: str):
        calls.append(system)
        first_call.set()
        release.wait(10)
        return script(system, user)

    app = create_app(make_service(lm=ScriptedLM(held)), ServePolicy(workers=1, queue=1, rate_limit=None))
    with serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"question": "What is the range of the AquaProbe 220?"}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /ask HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert first_call.wait(10)
        time.sleep(0.5)  # the server sees the closed connection and tells the run to stop
        release.set()
        deadline = time.monotonic() + 10
        while app.state.queue.admitted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.state.queue.admitted == 0
        abandoned = len(calls)
        answered = httpx.post(
            f"{url}/ask", json={"question": "What is the range of the AquaProbe 220?"}, timeout=60
        )
        assert answered.status_code == 200  # its place was free
    # The run stopped after the stage under way (grading its 2 passages), before strips and answer.
    assert abandoned <= 2 < len(calls) - abandoned
