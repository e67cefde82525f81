"""Web search faults: the real Tavily client against a loopback server; CRAG answers from internal
knowledge and the trace says why. (test_crag_flow.py covers the same with an in-process fake.)"""

import pytest
from fake_servers import FakeTavily
from fakes import NO_LM, ListRetriever, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.app import Backends, build_web_search
from crag_dspy.cli import main as cli_main
from crag_dspy.domain import CorpusDoc, Domain, DomainConfig
from crag_dspy.settings import Settings
from crag_dspy.web import TavilyWebSearch

KEY = "tvly-test-SECRET-0123456789"
KB = "Staff receive 27 days of annual leave."
HIT = {"title": "Leave law", "url": "https://law.example/leave", "content": "The legal minimum is 20 days."}


def script(system, user):
    if "You judge search results" in system:
        return 0.5  # AMBIGUOUS: both internal knowledge and the web are used
    if "You judge short knowledge strips" in system:
        return 0.9
    if "web search query" in system:
        return {"query": "annual leave; days"}
    return {"answer": "27 days" if "27 days" in field(user, "context") else "I don't know"}


def ask(web) -> tuple:
    lm = ScriptedLM(script)
    pred = CRAG(ListRetriever([("kb-1", KB)]), web, lm=lm)(question="How many days of leave do staff get?")
    return pred, lm


def tavily(server, **kwargs) -> TavilyWebSearch:
    return TavilyWebSearch(api_key=KEY, api_base_url=server.url, **kwargs)


def test_working_tavily_feeds_web_strips():
    with FakeTavily([HIT]) as server:
        pred, _ = ask(tavily(server))
    assert server.requests[0]["body"]["query"] == "annual leave; days"
    assert server.requests[0]["authorization"] == f"Bearer {KEY}"
    assert [s.source for s in pred.trace.external_strips] == ["web"] and pred.trace.fallbacks == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("500", "HTTPError"),
        ("503", "HTTPError"),
        ("429", "UsageLimitExceededError"),
        ("401-echo", "InvalidAPIKeyError"),
        ("garbage", "Tavily search failed"),
        ("reset", "ConnectionError"),
        ("hang", "TimeoutError"),
    ],
)
def test_tavily_faults_degrade_to_internal_knowledge(fault, reason):
    with FakeTavily([HIT], fault=lambda n, body: fault, hang_s=2.0) as server:
        pred, _ = ask(tavily(server, timeout_s=0.5))
    assert pred.answer == "27 days" and pred.action == "AMBIGUOUS"
    (fallback,) = pred.trace.fallbacks
    assert fallback.startswith("web search failed (Tavily search failed") and reason in fallback
    assert fallback.endswith("internal knowledge only")
    assert "[web]" not in pred.trace.context and pred.trace.external_strips == []
    assert KEY not in pred.trace.model_dump_json()  # the 401 body echoed the key; the trace never does


@pytest.mark.parametrize(
    "results", [[], [{"title": "x", "url": "u", "content": "   "}], "not a list", [1, "two"]]
)
def test_empty_or_malformed_results_degrade_too(results):
    with FakeTavily(results) as server:
        pred, _ = ask(tavily(server))
    assert pred.answer == "27 days"
    assert any("returned no results" in f or "Tavily search failed" in f for f in pred.trace.fallbacks)


def test_tavily_asked_for_without_a_key_is_refused_before_any_work_naming_the_variable(monkeypatch, capsys):
    # Asked for by name, as an LM's missing key is: not a warning and a run without the web.
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    domain = Domain(None, DomainConfig(name="tiny"), [CorpusDoc(id="a", title="A", text=KB)])
    with pytest.raises(ValueError, match="web search 'tavily': Tavily needs an API key: set the environment"):
        build_web_search(Settings(web_search="tavily"), Backends(Settings(), domain, None, None))
    monkeypatch.setattr("crag_dspy.app.app_lm", lambda *a, **k: pytest.fail("the LM was built first"))
    assert cli_main(["ask", "q", "--web-search", "tavily", *NO_LM]) == 2
    assert capsys.readouterr().err == (
        "error: web search 'tavily': Tavily needs an API key: set the environment variable TAVILY_API_KEY, "
        "or choose another (--web-search offline or none, CRAG_WEB_SEARCH)\n"
    )


def test_a_lone_surrogate_in_a_result_is_made_u_fffd_where_it_enters():
    # Probe 6: JSON may escape a lone surrogate ("\ud800"); decoded, it is text no response or file can
    # hold as UTF-8.
    hit = {
        "title": "Leave \ud800 law",
        "url": "https://law.example/leave",
        "content": "At least 20 \udfff days.",
    }
    with FakeTavily([hit]) as server:
        results = tavily(server).search("leave", 3)
    assert [(r.title, r.content) for r in results] == [("Leave \ufffd law", "At least 20 \ufffd days.")]
