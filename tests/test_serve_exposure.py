"""The service exposed beyond loopback: API keys, body and rate limits, the deadline, the bounded queue,
trusted hosts, the trace trimmed for clients, /program without paths and the access log."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from serving import local_client, serving

from crag_dspy import CRAG
from crag_dspy.app import LoadedProgram
from crag_dspy.citations import Citation
from crag_dspy.config import CRAGConfig
from crag_dspy.protocols import WebResult
from crag_dspy.serve import ProgramService, create_app
from crag_dspy.serve import auth as auth_module
from crag_dspy.serve.admission import ModelQueue, QueueFull, retry_after_s
from crag_dspy.serve.auth import identify, key_id
from crag_dspy.serve.cli import main as serve_main
from crag_dspy.serve.client_trace import ClientStrip, ClientTrace, client_trace
from crag_dspy.serve.policy import ExposureError, ServePolicy, is_loopback, policy_for
from crag_dspy.serve.service import without_paths
from crag_dspy.settings import Settings
from crag_dspy.trace import CRAGTrace, StripRecord

KEY, OTHER, DEBUG = "key-aaaaaaaaaaaaaaaa", "key-bbbbbbbbbbbbbbbb", "dbg-cccccccccccccccc"
GOOD = ("kb-good", "The AquaProbe 220 has a range of 0 to 25 mg/L.")
BAD = ("kb-bad", "The canteen opens at 08:00. SECRET-DROPPED-STRIP")
WEB = WebResult(
    "WQ-17",
    "https://ihsc.example/wq17",
    "WQ-17 sensors are recalibrated every 90 days. The SECRET-WEB office is closed on Sundays. "
    "Parking is free.",
)


def script(system: str, user: str):
    if "You judge search results" in system:
        return 0.9 if "0 to 25" in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if ("0 to 25" in field(user, "strip") or "90 days" in field(user, "strip")) else 0.05
    if "web search query" in system:
        return {"query": "WQ-17 recalibration"}
    return {"answer": "0 to 25 mg/L" if "0 to 25" in field(user, "context") else "every 90 days"}


def service(lm=None, texts=(GOOD, BAD)) -> ProgramService:
    crag = CRAG(
        ListRetriever(list(texts)),
        ListWebSearch([WEB]),
        CRAGConfig(lm_calls={"retries": 0}, sentences_per_strip=1, grader_view={"sentences": 0}),
        lm=lm or ScriptedLM(script),
    )
    return ProgramService(LoadedProgram(crag, "default"))


KEYED = ServePolicy(api_keys=(KEY, OTHER), debug_keys=(DEBUG,), open_debug=False)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- who may bind where -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True)]
    + [("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("example.com", False), ("", False)],
)
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_loopback_without_keys_is_the_developers_default():
    policy, warnings = policy_for(Settings(), "127.0.0.1")
    assert warnings == [] and not policy.keys_required and policy.open_debug
    assert policy.allowed_hosts == ("127.0.0.1", "localhost", "[::1]")


def test_beyond_loopback_without_keys_is_refused_unless_insecure():
    with pytest.raises(
        ExposureError, match=r"--host 0.0.0.0 is reachable beyond this machine: set CRAG_API_KEYS"
    ):
        policy_for(Settings(), "0.0.0.0")
    policy, warnings = policy_for(Settings(), "0.0.0.0", insecure=True)
    assert not policy.keys_required and not policy.open_debug  # no full traces for strangers either
    assert any("WITHOUT API keys (--insecure)" in w for w in warnings)
    assert any("CRAG_ALLOWED_HOSTS" in w for w in warnings)


def test_keys_come_from_the_environment_comma_separated_and_short_ones_are_refused(monkeypatch):
    monkeypatch.setenv("CRAG_API_KEYS", f" {KEY} ,{OTHER},")
    monkeypatch.setenv("CRAG_DEBUG_API_KEYS", DEBUG)
    policy, warnings = policy_for(Settings(), "10.0.0.7")
    assert policy.api_keys == (KEY, OTHER) and policy.debug_keys == (DEBUG,) and not policy.open_debug
    assert policy.allowed_hosts[-1] == "10.0.0.7"  # the address it listens on is a name clients use
    assert warnings == ["serving on 10.0.0.7, beyond this machine: every request needs an API key"]
    assert KEY not in repr(Settings())  # SecretStr
    monkeypatch.setenv("CRAG_API_KEYS", "short-key")
    with pytest.raises(ExposureError, match="at least 16 characters") as refused:
        policy_for(Settings(), "127.0.0.1")
    assert "short-key" not in str(refused.value)


@pytest.mark.parametrize("key", ["clé-secrète-0123456789", "tab\tin-the-middle-0123456789"])
def test_a_key_clients_cannot_send_in_a_header_is_refused_at_start_up(monkeypatch, key):
    # Accepted before, it never matched: Starlette decodes headers as latin-1, clients send UTF-8.
    monkeypatch.setenv("CRAG_API_KEYS", key)
    with pytest.raises(ExposureError, match="not printable ASCII") as refused:
        policy_for(Settings(), "127.0.0.1")
    assert key not in str(refused.value)


def test_serve_refuses_to_bind_beyond_loopback_without_keys_before_loading_anything(capsys):
    # No LM, store or program is touched: the refusal comes first (the program path does not exist).
    assert serve_main(["--host", "0.0.0.0", "--program", "/nonexistent/p.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--insecure" in err and "cannot read program" not in err


def test_serve_warns_when_it_binds_beyond_loopback_without_keys(capsys):
    assert serve_main(["--host", "0.0.0.0", "--insecure", "--program", "/nonexistent/p.json"]) == 2
    err = capsys.readouterr().err
    assert "warning: serving on 0.0.0.0 WITHOUT API keys (--insecure)" in err and "cannot read program" in err


# --- API keys ---------------------------------------------------------------------------------------
def test_without_a_valid_key_every_route_but_health_and_the_page_is_401():
    client = local_client(create_app(service(), KEYED))
    for headers in (
        {},
        bearer("key-wrong-wrong-wrong"),
        {"Authorization": f"Basic {KEY}"},
        {"X-API-Key": ""},
    ):
        response = client.post("/ask", json={"question": "range?"}, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer <key>" in response.json()["detail"]
        assert client.get("/program", headers=headers).status_code == 401
    assert (
        client.post("/ask", json={"question": "q"}, headers=bearer("nope-nope-nope-nope"))
        .json()["detail"]
        .startswith("the API key is not valid")
    )
    assert client.get("/health").status_code == 200 and client.get("/").status_code == 200


def test_with_keys_the_schema_needs_a_key_and_the_documentation_pages_are_off():
    client = local_client(create_app(service(), KEYED))
    for headers in ({}, bearer("key-wrong-wrong-wrong")):
        response = client.get("/openapi.json", headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    schema = client.get("/openapi.json", headers={"X-API-Key": OTHER})
    assert schema.status_code == 200 and "/ask" in schema.json()["paths"]
    # The pages are browser pages that fetch the schema without a key: with keys they are not served.
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(path, headers=bearer(KEY)).status_code == 404, path
    assert "/openapi.json" not in schema.json()["paths"]  # the keyed route is not an API operation


def test_without_keys_the_schema_and_documentation_pages_are_open_as_before():
    client = local_client(create_app(service()))
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/docs").status_code == 200 and client.get("/redoc").status_code == 200


def test_a_valid_key_in_either_header_is_served():
    client = local_client(create_app(service(), KEYED))
    assert client.post("/ask", json={"question": "range?"}, headers=bearer(KEY)).status_code == 200
    assert client.post("/ask", json={"question": "range?"}, headers={"X-API-Key": OTHER}).status_code == 200
    assert client.post("/ask", json={"question": "range?"}, headers=bearer(DEBUG)).status_code == 200
    assert client.get("/program", headers=bearer(KEY)).status_code == 200


def test_keys_are_compared_in_constant_time_against_every_key(monkeypatch):
    calls = []
    real = auth_module.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    caller = identify(KEY, KEYED)
    assert caller is not None and caller.key_id == key_id(KEY) and not caller.debug
    # The first key matched, yet every key was compared (no early exit that timing would reveal).
    assert len(calls) == 3 and all(isinstance(a, bytes) for a, _ in calls)
    assert identify(KEY[:-1], KEYED) is None and identify(None, KEYED) is None
    assert identify(DEBUG, KEYED).debug is True


def test_with_keys_configured_loopback_needs_them_too():
    policy, _ = policy_for(Settings(api_keys=[KEY]), "127.0.0.1")
    client = local_client(create_app(service(), policy))
    assert client.post("/ask", json={"question": "range?"}).status_code == 401


# --- the trace clients see ---------------------------------------------------------------------------
def ask_web(client, headers=None, debug=False):
    # INCORRECT: both passages below lower, so the web is searched and strips are dropped and kept.
    return client.post(
        "/ask" + ("?debug=1" if debug else ""),
        json={"question": "How often is WQ-17 recalibrated?"},
        headers=headers,
    )


def test_clients_get_a_trace_without_raw_passages_dropped_strips_or_web_contents():
    client = local_client(create_app(service(texts=[BAD]), KEYED))
    response = ask_web(client, bearer(KEY))
    assert response.status_code == 200
    body = response.json()
    assert body["full_trace"] is False and body["action"] == "INCORRECT"
    assert "SECRET" not in response.text  # neither the dropped passage nor the web page's text
    trace = body["trace"]
    assert trace["web_results"] == [{"title": "WQ-17", "url": "https://ihsc.example/wq17"}]
    kept = [s for s in trace["external_strips"] if s["kept"]]
    assert [s["text"] for s in kept] == ["WQ-17 sensors are recalibrated every 90 days."]
    assert all(
        s["text"] is None for s in trace["internal_strips"] + trace["external_strips"] if not s["kept"]
    )
    assert trace["documents"][0]["score"] is not None and trace["web_query"] == "WQ-17 recalibration"
    # The citation quotes the kept strip, nothing else of the web page.
    (citation,) = body["citations"]
    assert citation["url"] == "https://ihsc.example/wq17" and citation["source"] == "web"
    assert citation["quote"] == "WQ-17 sensors are recalibrated every 90 days."
    assert trace["citations"] == body["citations"]


def test_the_full_trace_needs_a_debug_key():
    client = local_client(create_app(service(texts=[BAD]), KEYED))
    refused = ask_web(client, bearer(KEY), debug=True)
    assert (
        refused.status_code == 403 and "needs a debug key (CRAG_DEBUG_API_KEYS)" in refused.json()["detail"]
    )
    full = ask_web(client, bearer(DEBUG), debug=True)
    assert full.status_code == 200 and full.json()["full_trace"] is True
    trace = CRAGTrace.model_validate(full.json()["trace"])
    assert "SECRET-WEB" in trace.web_results[0].content
    dropped = [s.text for s in trace.external_strips if not s.kept]
    assert dropped == ["The SECRET-WEB office is closed on Sundays.", "Parking is free."]
    assert ask_web(client, bearer(DEBUG)).json()["full_trace"] is False  # only when asked for


def test_on_loopback_without_keys_anyone_may_ask_for_the_full_trace():
    client = local_client(create_app(service(texts=[BAD])))
    assert ask_web(client).json()["full_trace"] is False  # trimmed by default there too
    assert ask_web(client, debug=True).json()["full_trace"] is True
    insecure, _ = policy_for(Settings(), "0.0.0.0", insecure=True)
    assert ask_web(local_client(create_app(service(texts=[BAD]), insecure)), debug=True).status_code == 403


def test_every_trace_field_is_shown_to_clients_or_withheld_on_purpose():
    """A field added to CRAGTrace must be decided on here: shown to every client, or debug only."""
    withheld = {"context"}  # the kept strips' text again
    assert set(CRAGTrace.model_fields) - set(ClientTrace.model_fields) == withheld
    # Shown on purpose: a citation's quote is a sentence of a kept strip, which clients see anyway.
    assert "citations" in ClientTrace.model_fields
    trace = CRAGTrace(question="q", lower=0.3, upper=0.7, retriever="r", web_backend="w", context="x")
    assert client_trace(trace).model_dump().keys() == ClientTrace.model_fields.keys()
    # A strip's place in its document is shown too; the graded excerpt and evidence stay debug only.
    assert set(StripRecord.model_fields) - set(ClientStrip.model_fields) == {"judged_text", "evidence"}


def _strip(text: str, kept: bool, **place) -> StripRecord:
    return StripRecord(
        source="internal",
        doc_id="pdf/m.pdf",
        title="M",
        position=0,
        text=text,
        score=0.9,
        score_source="strip_filter",
        kept=kept,
        **place,
    )


def test_client_strips_carry_page_and_section_and_only_kept_strips_are_quoted():
    kept = _strip("The range is 0 to 25 mg/L.", True, page=2, section="Specifications > Range")
    dropped = _strip("SECRET-DROPPED says 30 mg/L.", False, page=3)
    cited = Citation(
        doc_id="pdf/m.pdf", title="M", source="internal", page=2, quote="The range is 0 to 25 mg/L."
    )
    # Never made by crag_dspy.citations.cite (it quotes kept strips only): the guard must still hold.
    leaked = Citation(doc_id="pdf/m.pdf", title="M", source="internal", page=3, quote=dropped.text)
    trace = CRAGTrace(
        question="q",
        lower=0.3,
        upper=0.7,
        retriever="r",
        web_backend="w",
        internal_strips=[kept, dropped],
        citations=[cited, leaked],
    )
    shown = client_trace(trace)
    assert [(s.page, s.section, s.text) for s in shown.internal_strips] == [
        (2, "Specifications > Range", kept.text),
        (3, None, None),
    ]
    assert shown.citations == [cited] and "SECRET" not in shown.model_dump_json()


# --- /program -------------------------------------------------------------------------------------
def test_program_information_holds_no_file_system_paths():
    value = {
        "domain_dir": "/srv/data/harbour",
        "nested": [{"p": "C:\\models\\grader"}, "~/x/y.json", "file:///etc/passwd", "relative/ok", "a/b"],
        "n": 3,
    }
    assert without_paths(value) == {
        "domain_dir": "harbour",
        "nested": [{"p": "grader"}, "y.json", "passwd", "relative/ok", "a/b"],
        "n": 3,
    }


# --- body size -----------------------------------------------------------------------------------
class CountingService(ProgramService):
    def __init__(self, inner: ProgramService):
        super().__init__(inner.loaded)
        self.asked = 0

    def ask(self, question, **kwargs):
        self.asked += 1
        return super().ask(question, **kwargs)


def test_a_body_over_the_limit_is_413_from_its_content_length_before_it_is_read():
    counted = CountingService(service())
    with serving(create_app(counted, ServePolicy(max_body_bytes=1024))) as url:
        big = json.dumps({"question": "x" * 5000}).encode()
        response = httpx.post(f"{url}/ask", content=big, headers={"content-type": "application/json"})
        # JSON like every other error (it was text/plain "Content Too Large", which a client could not parse)
        assert response.status_code == 413 and response.json() == {
            "detail": "the request body is over the 1024-byte limit (setting CRAG_MAX_BODY_BYTES)"
        }
        assert httpx.post(f"{url}/ask", json={"question": "range?"}).status_code == 200
    assert counted.asked == 1


def test_a_streamed_body_without_a_length_is_refused_as_it_arrives():
    """Chunked upload, no Content-Length: the app stops reading at the limit (ASGI driven by hand, so
    that what was read is counted exactly)."""
    counted = CountingService(service())
    app = create_app(counted, ServePolicy(max_body_bytes=4096))
    pulled, sent = [0], []

    async def receive():
        pulled[0] += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": pulled[0] < 1000}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/ask", "raw_path": b"/ask", "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413 and counted.asked == 0
    assert pulled[0] == 5  # 4 KB allowed; the fifth kilobyte is refused, the other 995 never read


# --- rate limits -----------------------------------------------------------------------------------
def test_each_key_has_its_own_rate_limit_with_retry_after():
    policy = ServePolicy(api_keys=(KEY, OTHER), open_debug=False, rate_limit="2/minute")
    client = local_client(create_app(service(), policy))
    ask = lambda key: client.post("/ask", json={"question": "range?"}, headers=bearer(key))
    assert [ask(KEY).status_code for _ in range(2)] == [200, 200]
    limited = ask(KEY)
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 60
    assert "rate limit of 2/minute reached" in limited.json()["detail"]
    assert ask(OTHER).status_code == 200  # another key's budget is its own
    assert ask("key-zzzzzzzzzzzzzzzz").status_code == 401  # counted against its address, not a key


def test_failed_authentications_are_rate_limited_per_client_address():
    # 30 wrong keys were 30 401s, never a 429: keys could be guessed as fast as the server answers.
    policy = ServePolicy(api_keys=(KEY,), open_debug=False, rate_limit="3/minute")
    client = local_client(create_app(service(), policy))
    ask = lambda headers: client.post("/ask", json={"question": "range?"}, headers=headers)
    assert [ask(bearer(f"wrong-{i}-0123456789abcdef")).status_code for i in range(3)] == [401] * 3
    limited = ask(bearer("wrong-3-0123456789abcdef"))
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 60
    assert "too many requests without a valid key from this address (3/minute)" in limited.json()["detail"]
    assert ask({}).status_code == 429  # no key at all is a failed authentication too
    # A right key from that address waits as well: a 200 among 429s would tell it was right.
    assert ask(bearer(KEY)).status_code == 429
    other = local_client(client.app, client=("192.0.2.7", 50000))  # another address: its own budget
    assert other.post("/ask", json={"question": "range?"}, headers=bearer(KEY)).status_code == 200


def test_without_keys_the_limit_is_per_client_address():
    client = local_client(create_app(service(), ServePolicy(rate_limit="1/minute")))
    assert client.post("/ask", json={"question": "range?"}).status_code == 200
    assert client.post("/ask", json={"question": "range?"}).status_code == 429
    assert (
        local_client(create_app(service(), ServePolicy(rate_limit=None)))
        .post("/ask", json={"question": "range?"})
        .status_code
        == 200
    )


# --- deadline and queue ------------------------------------------------------------------------------
def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def blocking_lm(release: threading.Event, entered: threading.Event | None = None):
    """Grades the first passage at once, then blocks on the second until ``release``."""

    def run(system, user):
        if "You judge search results" in system and "0 to 25" not in field(user, "document"):
            if entered is not None:
                entered.set()
            release.wait(30)
        return script(system, user)

    return ScriptedLM(run)


def test_a_request_over_the_deadline_is_504_in_time_with_the_trace_so_far():
    release = threading.Event()
    policy = ServePolicy(request_timeout_s=0.5, workers=1, queue=1)
    app = create_app(service(lm=blocking_lm(release)), policy)
    try:
        with serving(app) as url:
            started = time.monotonic()
            response = httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10)
            took = time.monotonic() - started
            assert response.status_code == 504 and took < 3
            body = response.json()
            assert "no answer within the 0.5 s deadline: the answer took longer" in body["detail"]
            assert "CRAG_REQUEST_TIMEOUT_S" in body["detail"]
            trace = body["trace"]  # trimmed, and what was done: the first grade, not the blocked second
            assert trace["question"] == "range?" and trace["action"] is None
            assert [(d["doc_id"], d["score"]) for d in trace["documents"]] == [("kb-good", 0.9)]
            assert "retrieve" in trace["timings"] and "graded_text" not in json.dumps(trace)
            # The abandoned question still holds the one place until it ends: the next one is refused.
            busy = httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10)
            assert busy.status_code == 503
            release.set()
            deadline = time.monotonic() + 10
            while (
                ok := httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10)
            ).status_code == 503:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert ok.status_code == 200 and ok.json()["answer"] == "0 to 25 mg/L"
    finally:
        release.set()


def test_a_question_past_its_deadline_stops_at_its_next_stage_instead_of_answering_for_nobody():
    release = threading.Event()
    lm = blocking_lm(release)
    app = create_app(service(lm=lm), ServePolicy(request_timeout_s=0.5, workers=1, queue=1))
    try:
        with serving(app) as url:
            assert httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10).status_code == 504
            release.set()  # the grading call under way ends; the run must not go on to refine and answer
            wait_until(lambda: httpx.get(f"{url}/health", timeout=10).status_code == 200)
            ok = httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10)
            deadline = time.monotonic() + 10
            while ok.status_code == 503:  # the abandoned run holds its place until it has stopped
                assert time.monotonic() < deadline
                time.sleep(0.05)
                ok = httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=10)
            assert ok.status_code == 200
    finally:
        release.set()
    answers = [user for system, user in lm.calls if "Answer the question" in system]
    assert len(answers) == 1  # the second request's: the abandoned one never reached its answer


def test_a_full_queue_is_503_with_retry_after_and_nothing_is_lost():
    release, entered = threading.Event(), threading.Event()
    policy = ServePolicy(workers=1, queue=2, request_timeout_s=30)
    app = create_app(service(lm=blocking_lm(release, entered)), policy)
    try:
        with serving(app) as url, ThreadPoolExecutor(max_workers=4) as pool:
            post = lambda: httpx.post(f"{url}/ask", json={"question": "range?"}, timeout=30)
            running = pool.submit(post)
            assert entered.wait(10)
            waiting = pool.submit(post)
            wait_until(lambda: app.state.queue.admitted == 2)  # admitted, waiting for the one worker
            refused = [post() for _ in range(3)]
            assert all(r.status_code == 503 for r in refused)
            assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
            assert "the service is busy: 2 questions are running or waiting" in refused[0].json()["detail"]
            release.set()
            assert running.result().status_code == 200 and waiting.result().status_code == 200
    finally:
        release.set()


def test_a_question_that_times_out_while_queued_never_runs():
    queue = ModelQueue(workers=1, size=2)
    gate, ran = threading.Event(), []
    first, _ = queue.submit(lambda: gate.wait(10))
    with pytest.raises(TimeoutError, match="waited in the queue"):
        asyncio.run(queue.run(lambda: ran.append(1), timeout_s=0.2))
    gate.set()
    first.result(5)
    wait_until(lambda: queue.admitted == 0)
    assert ran == []
    queue.close()


def test_queue_bounds_and_retry_after():
    queue = ModelQueue(workers=1, size=1)
    gate = threading.Event()
    queue.submit(lambda: gate.wait(10))
    with pytest.raises(QueueFull) as full:
        queue.submit(lambda: None)
    assert full.value.retry_after == retry_after_s(1, 10.0) == 10
    gate.set()
    queue.close()
    assert retry_after_s(4, 10.0) == 3 and retry_after_s(4, 0.01) == 1 and retry_after_s(1, 1e6) == 120


# --- trusted hosts ------------------------------------------------------------------------------------
def test_only_allowed_host_names_are_answered():
    app = create_app(service(), ServePolicy(allowed_hosts=("127.0.0.1", "crag.example.com")))
    client = local_client(app)
    assert client.get("/health").status_code == 200
    assert client.get("/health", headers={"Host": "crag.example.com:8080"}).status_code == 200
    # A page on another site whose name now resolves to this machine (DNS rebinding) sends its own name.
    rebound = client.post("/ask", json={"question": "range?"}, headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and rebound.text == "Invalid host header"


# --- the access log ----------------------------------------------------------------------------------
def test_one_structured_access_line_per_request_with_hashes_never_the_key_or_question(caplog):
    client = local_client(create_app(service(), KEYED))
    question = "What is the range of the AquaProbe 220?"
    with caplog.at_level(logging.INFO, logger="crag_dspy.serve.access"):
        ok = client.post("/ask", json={"question": question}, headers=bearer(KEY))
        refused = client.post("/ask", json={"question": question})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "crag_dspy.serve.access"]
    assert len(lines) == 2
    first, second = lines
    assert first["request_id"] == ok.headers["x-request-id"] and len(first["request_id"]) == 16
    assert (first["status"], first["key_id"], first["action"]) == (200, key_id(KEY), "CORRECT")
    assert len(first["question_hash"]) == 12 and first["latency_ms"] > 0 and first["path"] == "/ask"
    assert (second["status"], second["key_id"], second["request_id"]) == (
        401,
        None,
        refused.headers["x-request-id"],
    )
    logged = caplog.text
    assert KEY not in logged and question not in logged


# --- the schema ---------------------------------------------------------------------------------------
def test_openapi_documents_the_keys_and_every_refusal():
    schema = local_client(create_app(service(), KEYED)).get("/openapi.json", headers=bearer(KEY)).json()
    ask = schema["paths"]["/ask"]["post"]
    assert {"401", "403", "413", "422", "429", "503", "504"} <= set(ask["responses"])
    assert {"HTTPBearer", "APIKeyHeader"} <= set(schema["components"]["securitySchemes"])
    assert any(p["name"] == "debug" for p in ask["parameters"])
