"""End to end in a real browser: the page served on loopback, asked two questions in headless Chromium.

The program runs on a real embedded Chroma (a tiny domain ingested into a tmp dir) with a scripted LM, so
this checks the page and the service, not answer quality. With CRAG_UPDATE_SCREENSHOT=1 it saves
docs/images/serve.png for the README; otherwise the screenshot goes to the test's tmp dir, so that a test
run leaves the checkout clean.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, ScriptEngine, field
from serving import FESTIVAL_Q, LEAVE_Q, harbour_lm, serving, write_domain

from crag_dspy import CRAG
from crag_dspy.app import LoadedProgram, open_program
from crag_dspy.config import CRAGConfig
from crag_dspy.lm.openai_server import OpenAIServer
from crag_dspy.protocols import Passage, WebResult
from crag_dspy.serve import ProgramService, ServePolicy, create_app
from crag_dspy.settings import Settings

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "serve.png"
# Flags for Chromium as root on a machine without network (see the machine notes): no sandbox, no GPU,
# and none of the background connections that would be refused.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture()
def chromium() -> str:
    """The system Chromium; skip (or fail, with CRAG_REQUIRE_BROWSER=1 as in CI) when it is missing."""
    required = os.environ.get("CRAG_REQUIRE_BROWSER") == "1"
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    problem = None
    if found is None:
        problem = "no Chromium found (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is not installed (pip install -e '.[test]')"
    if problem:
        if required:
            pytest.fail(f"CRAG_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)
    return found


def _harbour(tmp_path, lm=None, **settings):
    """The uncompiled program over the tiny harbour domain, ingested into ``tmp_path``."""
    settings = Settings(
        domain_dir=write_domain(tmp_path / "harbour"),
        chroma_path=tmp_path / "chroma",
        web_search="offline",
        **settings,
    )
    return open_program(None, settings, lm=lm or harbour_lm(), progress=False)


@pytest.fixture()
def page_url(tmp_path):
    with serving(create_app(ProgramService(_harbour(tmp_path)))) as url:
        yield url


@contextmanager
def _page_of(app, chromium: str, tmp_path, problems: list[str]) -> Iterator:
    """``app`` served on loopback and opened in headless Chromium; the page's errors go to ``problems``."""
    from playwright.sync_api import sync_playwright

    with serving(app) as url, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            page = context.new_page()
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url)
            yield page
        finally:
            context.close()


def _ask(page, question: str) -> None:
    from playwright.sync_api import expect

    page.fill("#question", question)
    with page.expect_response("**/ask/stream", timeout=30_000):
        page.click("#submit")
    # A locator wait, not wait_for_function: a JavaScript string would be eval'd, which the page's
    # Content-Security-Policy (no 'unsafe-eval') refuses, and the test failed whenever the answer
    # was not already on screen at the first check.
    expect(page.locator("#status")).to_have_text(re.compile(r"^Answered"), timeout=30_000)


def test_ask_in_the_browser_shows_the_decision(chromium, page_url, tmp_path):
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh profile for every run
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1100, "height": 900},
        )
        try:
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(page_url)
            page.wait_for_selector("#program b")
            program = page.inner_text("#program")
            assert "harbour" in program and "uncompiled default program" in program
            assert "lower 0.30" in program and "upper 0.70" in program

            # 1. The KB answers: one document clears the upper threshold.
            _ask(page, LEAVE_Q)
            assert page.inner_text("#action") == "CORRECT"
            assert page.inner_text("#answer") == "27 days of annual leave per year"
            assert "≥ upper 0.70" in page.inner_text("#why")
            meters = page.locator("#documents [role=meter]")
            assert meters.count() == 3
            assert meters.first.get_attribute("aria-valuenow") == "0.93"
            assert "at or above upper" in meters.first.get_attribute("aria-label")
            assert page.is_hidden("#web")  # CORRECT never searches the web
            assert "27 days" in page.inner_text("#kept")

            # 2. Only the web knows the date: graded between the thresholds, both sources are used.
            _ask(page, FESTIVAL_Q)
            assert page.inner_text("#action") == "AMBIGUOUS"
            assert page.inner_text("#answer") == "14 June 2025"
            assert page.is_visible("#web")
            assert "Harbour Festival 2025 date" in page.inner_text("#web-body")
            assert "harbourtown.example/festival" in page.get_attribute("#web-body a", "href")
            kept = page.inner_text("#kept")
            assert "WEB" in kept and "14 June" in kept
            assert "Kept (1)" in page.inner_text("#kept-heading")
            assert "INTERNAL" in page.inner_text("#dropped")
            assert page.locator("#timings tr").count() >= 5
            assert "request total" in page.inner_text("#timings")

            shot = SCREENSHOT if os.environ.get("CRAG_UPDATE_SCREENSHOT") == "1" else tmp_path / "serve.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000  # a rendered page, not an empty image

            # A blank question never reaches the API.
            page.fill("#question", "   ")
            page.click("#submit")
            assert page.inner_text("#status") == "Type a question first."
            assert page.inner_text("#action") == "AMBIGUOUS"  # the last answer stays on screen
        except Exception as exc:
            # What the browser showed and said, for a failure that only happens on some machine.
            failure = tmp_path / "failure.png"
            page.screenshot(path=str(failure), full_page=True)
            status = page.inner_text("#status")
            raise AssertionError(
                f"{exc}\nstatus: {status!r}\nconsole: {problems}\nscreenshot: {failure}"
            ) from exc
        finally:
            context.close()
    assert problems == [], f"browser console errors: {problems}"
    assert SCREENSHOT.stat().st_size > 10_000


def test_the_page_shows_every_internal_retry_round(chromium, tmp_path):
    loaded = _harbour(tmp_path, config=CRAGConfig(internal_retries=1))
    problems: list[str] = []
    with _page_of(create_app(ProgramService(loaded)), chromium, tmp_path, problems) as page:
        page.wait_for_selector("#program b")
        assert "internal retries at most 1" in page.inner_text("#program")
        _ask(page, LEAVE_Q)  # CORRECT at once: no round, no rounds list
        assert page.is_hidden("#rounds") and "again" not in page.inner_text("#why")
        # AMBIGUOUS: one round with the rewritten query; the store has only the 3 passages graded.
        _ask(page, FESTIVAL_Q)
        assert page.inner_text("#action") == "AMBIGUOUS"
        why = page.inner_text("#why")
        assert why.startswith("First AMBIGUOUS: searched the knowledge base again once")
        assert page.is_visible("#rounds")
        assert "1 of at most 1 rounds; first action AMBIGUOUS" in page.inner_text("#rounds-heading")
        (item,) = page.locator("#rounds-list li").all_inner_texts()
        assert "Harbour Festival 2025 date" in item and "nothing new to grade, 3 found again" in item
        assert item.rstrip().endswith("AMBIGUOUS")
    assert problems == []


def test_the_page_asks_for_a_key_when_the_service_needs_one(chromium, tmp_path):
    from playwright.sync_api import expect

    policy = ServePolicy(api_keys=("page-key-0123456789",), open_debug=False)
    problems: list[str] = []
    with _page_of(
        create_app(ProgramService(_harbour(tmp_path)), policy), chromium, tmp_path, problems
    ) as page:
        expect(page.locator("#key-form")).to_be_visible(timeout=30_000)
        assert page.inner_text("#program") == "This service needs an API key."
        page.fill("#api-key", "wrong-key-0123456789")
        page.click("#key-form button")
        expect(page.locator("#key-form")).to_be_visible(timeout=30_000)  # refused: asked again
        page.fill("#api-key", "page-key-0123456789")
        page.click("#key-form button")
        page.wait_for_selector("#program b")
        assert page.is_hidden("#key-form") and "harbour" in page.inner_text("#program")
        _ask(page, LEAVE_Q)
        assert page.inner_text("#answer") == "27 days of annual leave per year"
    assert problems == []


def test_the_page_warns_when_the_answer_is_not_grounded(chromium, tmp_path):
    honest = harbour_lm().script

    def made_up(system: str, user: str):
        # The leave answer names a number no strip holds; the festival answer is the context's.
        if "Answer the question using only the context" in system and "27 days" in user:
            return {"answer": "45 days of annual leave per year"}
        return honest(system, user)

    # The warning as shown when the answer stands (with abstain_ungrounded, the default, an answer in
    # no kept strip becomes "I don't know"; a disputed or instructed one still stands, warned).
    config = CRAGConfig(abstain_ungrounded=False)
    loaded = _harbour(tmp_path, lm=ScriptedLM(made_up), config=config)
    problems: list[str] = []
    with _page_of(create_app(ProgramService(loaded)), chromium, tmp_path, problems) as page:
        page.wait_for_selector("#program b")
        _ask(page, LEAVE_Q)
        assert page.inner_text("#answer") == "45 days of annual leave per year"
        warning = page.inner_text("#grounding-warning")
        assert "may not be grounded" in warning and "Not in the context or the question: 45 day" in warning
        _ask(page, FESTIVAL_Q)  # grounded: the warning goes
        assert page.inner_text("#answer") == "14 June 2025"
        assert page.locator("#grounding-warning").count() == 0
    assert problems == []


# A PDF's page 2 whose sentence carries markup (documents and web pages are untrusted text), and two web
# pages that state the web answer: one at an https URL, one at a javascript: URL that must never be a link.
MANUAL = "pdf/aquaprobe-manual.pdf"
MARKUP = "<img src=x onerror=alert(1)>"
RANGE_Q, RECAL_Q = "What is the range of the AquaProbe 220?", "How often is WQ-17 recalibrated?"


def _cited_program() -> LoadedProgram:
    def script(system: str, user: str):
        question = field(user, "question")
        if "You judge search results" in system:
            return 0.9 if ("range" in question and "0 to 25" in field(user, "document")) else 0.05
        if "You judge short knowledge strips" in system:
            strip = field(user, "strip")
            return 0.9 if ("90 days" in strip or ("range" in question and "0 to 25" in strip)) else 0.05
        if "web search query" in system:
            return {"query": "WQ-17 recalibration"}
        if "Rewrite the follow-up question" in system:  # a page's next question carries its history
            return {"standalone_question": question}
        return {"answer": "0 to 25 mg/L" if "0 to 25" in field(user, "context") else "every 90 days"}

    retriever = ListRetriever([])
    retriever.passages = [
        Passage(
            id="c0", doc_id=MANUAL, title="AquaProbe 220 manual", rank=0, similarity=0.9, page=2,
            text=f"The AquaProbe 220 has a range of 0 to 25 mg/L {MARKUP}.",
        ),
        Passage(id="c1", doc_id="kb-canteen", title="Canteen", rank=1, similarity=0.5, text="It opens at 08:00."),
    ]  # fmt: skip
    web = ListWebSearch(
        [
            WebResult("WQ-17", "https://ihsc.example/wq17", "WQ-17 sensors are recalibrated every 90 days."),
            WebResult("Bad link", "javascript:alert(1)", "Recalibration of WQ-17 is due every 90 days."),
        ]
    )
    config = CRAGConfig(lm_calls={"retries": 0}, sentences_per_strip=1)
    return LoadedProgram(CRAG(retriever, web, config, lm=ScriptedLM(script)), "default")


def test_the_page_lists_the_answers_sources_under_it(chromium, tmp_path):
    problems: list[str] = []
    with _page_of(create_app(ProgramService(_cited_program())), chromium, tmp_path, problems) as page:
        page.wait_for_selector("#program b")
        _ask(page, RANGE_Q)
        assert page.inner_text("#answer") == "0 to 25 mg/L"
        sources = page.locator("#sources-list li")
        assert sources.count() == 1
        assert sources.first.inner_text().startswith(f"[1] {MANUAL}, p. 2")
        # Under the answer; the quote's markup is text, never an element.
        assert page.locator("#answer").bounding_box()["y"] < page.locator("#sources-list").bounding_box()["y"]
        assert (
            page.inner_text("#sources-list q") == f"The AquaProbe 220 has a range of 0 to 25 mg/L {MARKUP}."
        )
        assert page.locator("#sources-list img, #kept img").count() == 0
        # The document is not served: its citation links to the kept strip it quotes, on this page.
        link = page.locator("#sources-list a")
        assert link.get_attribute("href") == "#kept-strip-1" and link.inner_text() == f"{MANUAL}, p. 2"
        assert MARKUP in page.inner_text("#kept-strip-1") and f"[{MANUAL}], p. 2" in page.inner_text("#kept")
        link.click()
        assert page.evaluate("document.activeElement.id") == "kept-strip-1"

        _ask(page, RECAL_Q)
        assert page.inner_text("#answer") == "every 90 days"
        items = page.locator("#sources-list li").all_inner_texts()
        assert [i.splitlines()[0] for i in items] == [
            "[1] https://ihsc.example/wq17",
            "[2] javascript:alert(1)",
        ]
        web_link = page.locator("#sources-list li").first.locator("a")
        assert web_link.get_attribute("href") == "https://ihsc.example/wq17"
        assert web_link.get_attribute("rel") == "noopener noreferrer"
        assert web_link.get_attribute("target") == "_blank"
        # Not an http(s) URL: never a link to it; the in-page anchor to its kept strip instead.
        hrefs = page.locator("#sources-list a").evaluate_all(
            "links => links.map((a) => a.getAttribute('href'))"
        )
        assert hrefs == ["https://ihsc.example/wq17", "#kept-strip-2"]
    assert problems == []


def test_the_page_writes_the_answer_as_it_streams_and_keeps_the_conversation(chromium, tmp_path):
    """The answer's tokens reach the page before the answer is done (the LM writes its last word only
    once the page shows the first ones), through a real dspy.LM and LiteLLM on the embedded model's
    server over a scripted engine; each answered question is a turn the next one carries as history."""
    from playwright.sync_api import expect

    honest = harbour_lm().script
    condensed: list[str] = []

    def script(system: str, user: str):
        if "Rewrite the follow-up question" in system:
            condensed.append(field(user, "history"))
            return {"standalone_question": FESTIVAL_Q}
        return honest(system, user)

    gate = threading.Event()
    engine = ScriptEngine(script, gate)
    server = OpenAIServer(engine, "harbour", api_key=None)
    lm = dspy.LM(
        "openai/harbour",
        api_base=f"http://127.0.0.1:{server.port}/v1",
        api_key="unused",
        temperature=0.0,
        max_tokens=256,
        num_retries=0,
        cache=False,
    )
    problems: list[str] = []
    try:
        app = create_app(ProgramService(_harbour(tmp_path, lm=lm)))
        with _page_of(app, chromium, tmp_path, problems) as page:
            page.wait_for_selector("#program b")
            assert page.is_hidden("#conversation")
            page.fill("#question", LEAVE_Q)
            with page.expect_request("**/ask/stream") as first:
                page.click("#submit")
            assert "history" not in first.value.post_data_json
            # The draft, word by word, while the LM has not written the last word yet.
            draft = page.locator("#turns .turn.pending .turn-a")
            expect(draft).to_have_text("27 days of annual leave per", timeout=30_000)
            assert page.inner_text("#turns .turn.pending .turn-q") == LEAVE_Q
            gate.set()
            expect(page.locator("#status")).to_have_text(re.compile(r"^Answered"), timeout=30_000)
            assert page.locator("#turns .turn-q").all_inner_texts() == [LEAVE_Q]
            assert page.locator("#turns .turn-a").all_inner_texts() == ["27 days of annual leave per year"]
            assert page.inner_text("#question-label") == "Your follow-up question"
            assert "follow-up of the last 1 turn." in page.inner_text("#history-hint")

            # The follow-up carries the first turn and is answered as the standalone question.
            page.fill("#question", "And when is the festival?")
            with page.expect_request("**/ask/stream") as second:
                page.click("#submit")
            assert second.value.post_data_json["history"] == [
                {"question": LEAVE_Q, "answer": "27 days of annual leave per year"}
            ]
            expect(page.locator("#status")).to_have_text(re.compile(r"^Answered"), timeout=30_000)
            assert page.inner_text("#answer") == "14 June 2025" and len(condensed) == 1
            assert page.locator("#turns .turn").count() == 2

            # A new conversation: no turns shown, none sent.
            page.click("#new-conversation")
            assert page.is_hidden("#conversation") and page.inner_text("#question-label") == "Your question"
            page.fill("#question", LEAVE_Q)
            with page.expect_request("**/ask/stream") as third:
                page.click("#submit")
            assert "history" not in third.value.post_data_json
            expect(page.locator("#status")).to_have_text(re.compile(r"^Answered"), timeout=30_000)
            assert page.locator("#turns .turn").count() == 1
    finally:
        gate.set()
        server.close()
    assert problems == []
    assert len(engine.streamed) == 3  # the answers only: no judge, no condensing call streams
