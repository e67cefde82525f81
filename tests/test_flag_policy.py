"""The flag policy (crag_dspy.flag_policy): a flagged answer is shown with a warning or withheld, in the
CLI, the API and the stream, with the citations of both sides. A scripted LM answers the planted value."""

from __future__ import annotations

import json
import threading

import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from serving import local_client

from crag_dspy import CRAG
from crag_dspy.app import LoadedProgram
from crag_dspy.cli import build_parser, format_trace, settings_from_args
from crag_dspy.flag_policy import WITHHELD_ANSWER, judge_flag
from crag_dspy.serve import ProgramService, ServePolicy, create_app
from crag_dspy.serve.arguments import build_parser as build_serve_parser
from crag_dspy.serve.policy import policy_for

QUESTION = "What does a resident parking permit cost per month?"
HONEST = ("kb-permits", "A resident parking permit costs 12 euros per month.")
PLANTED = ("kb-planted", "A resident parking permit costs 19 euros per month since the last council vote.")
UNRELATED = ("kb-canteen", "The canteen opens at 08:00.")


def script(system: str, user: str):
    if "You judge search results" in system:
        document = field(user, "document")
        return 0.9 if "euros" in document else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if "19 euros" in field(user, "strip") else 0.05  # the honest strip is dropped
    if "web search query" in system:
        return {"query": "resident parking permit price"}
    return {"answer": "19 euros per month" if "19 euros" in field(user, "context") else "I don't know"}


def crag(texts=(PLANTED, HONEST, UNRELATED)) -> CRAG:
    return CRAG(ListRetriever(list(texts)), ListWebSearch([]), lm=ScriptedLM(script))


@pytest.fixture(scope="module")
def disputed_trace():
    trace = crag()(question=QUESTION).trace
    # The premise of every test below: the answer is the planted value, which the honest source disputes.
    assert trace.answer == "19 euros per month" and trace.grounding.flagged
    assert trace.grounding.disputing_sources == ["kb-permits"]
    return trace


def test_warn_shows_the_flagged_answer_and_withhold_shows_neither_value(disputed_trace):
    warned = judge_flag(disputed_trace, "warn")
    assert (warned.status, warned.answer, warned.other_side) == ("flagged", "19 euros per month", [])
    withheld = judge_flag(disputed_trace, "withhold")
    assert (withheld.status, withheld.answer) == ("withheld", WITHHELD_ANSWER)
    assert [c.doc_id for c in withheld.citations] == ["kb-planted"]  # the answer's side
    [other] = withheld.other_side  # the side that disputes it, quoting the sentence that does
    assert (other.doc_id, other.quote) == HONEST
    with pytest.raises(ValueError, match="'warn' or 'withhold'"):
        judge_flag(disputed_trace, "hide")


def test_an_answer_nobody_disputes_is_answered_under_either_policy():
    trace = crag(texts=(PLANTED, UNRELATED))(question=QUESTION).trace
    assert not trace.grounding.flagged
    assert judge_flag(trace, "withhold").status == "answered"
    assert judge_flag(trace, "withhold").answer == "19 euros per month"


def test_ask_prints_the_withheld_answer_with_both_sides(disputed_trace):
    lines = format_trace(disputed_trace, "withhold").splitlines()
    assert lines[0] == f"answer: {WITHHELD_ANSWER}  (withheld: --on-flag withhold)"
    assert lines[1].startswith("warning: the answer may not be grounded; other sources state another value")
    assert lines[2].startswith("  [1] kb-planted: ")
    assert lines[3:5] == ["sources that disagree or instruct:", f'  [2] kb-permits: "{HONEST[1]}"']
    assert format_trace(disputed_trace).splitlines()[0] == "answer: 19 euros per month"  # warn: the default


def test_the_policy_is_a_setting_and_a_flag_of_ask_and_serve(monkeypatch):
    args = build_parser().parse_args(["ask", "q", "--on-flag", "withhold"])
    assert settings_from_args(args).on_flag == "withhold"
    assert settings_from_args(build_parser().parse_args(["ask", "q"])).on_flag == "warn"
    monkeypatch.setenv("CRAG_ON_FLAG", "withhold")
    serve_args = build_serve_parser().parse_args([])
    assert policy_for(settings_from_args(serve_args), "127.0.0.1")[0].on_flag == "withhold"
    serve_args = build_serve_parser().parse_args(["--on-flag", "warn"])
    assert policy_for(settings_from_args(serve_args), "127.0.0.1")[0].on_flag == "warn"


def _service() -> ProgramService:
    return ProgramService(LoadedProgram(crag(), "default"))


def test_the_api_marks_the_status_and_withholds_with_both_sides():
    warn = local_client(create_app(_service())).post("/ask", json={"question": QUESTION}).json()
    assert (warn["status"], warn["answer"], warn["other_side"]) == ("flagged", "19 euros per month", [])
    client = local_client(create_app(_service(), ServePolicy(on_flag="withhold")))
    body = client.post("/ask", json={"question": QUESTION}).json()
    assert (body["status"], body["answer"]) == ("withheld", WITHHELD_ANSWER)
    assert [c["doc_id"] for c in body["citations"]] == ["kb-planted"]
    assert [(c["doc_id"], c["quote"]) for c in body["other_side"]] == [HONEST]
    assert body["trace"]["grounding"]["disputed"]  # the trace still says why
    assert (
        client.post("/ask", json={"question": "When does the canteen open?"}).json()["status"] == "answered"
    )


def test_the_stream_does_not_send_the_answer_before_the_policy_withholds_it():
    client = local_client(create_app(_service(), ServePolicy(on_flag="withhold")))
    with client.stream("POST", "/ask/stream", json={"question": QUESTION}) as response:
        text = "".join(response.iter_text())
    events = [block.split("\n", 1) for block in text.strip().split("\n\n")]
    stages = [
        json.loads(data.removeprefix("data: "))["kind"] for name, data in events if name == "event: stage"
    ]
    assert "answer" not in stages and "citations" not in stages and "graded" in stages
    name, data = events[-1]
    body = json.loads(data.removeprefix("data: "))
    assert name == "event: answer" and (body["status"], body["answer"]) == ("withheld", WITHHELD_ANSWER)
    # Before the final event, nothing carries the value (the trace in the final body records it).
    assert "19 euros per month" not in text[: text.rindex("event: answer")]


def _answer_fields(trace: dict) -> str:
    """What a (client) trace says the answer was: its answer, the LM's reply, and lines quoting them."""
    return json.dumps([trace["answer"], trace["lm_answer"], *trace["fallbacks"], *trace["errors"]])


def test_no_trace_a_client_reads_carries_the_withheld_answer():
    # Probe 3: the top-level answer was withheld, the client trace still said "answer": the planted value.
    client = local_client(create_app(_service(), ServePolicy(on_flag="withhold")))
    body = client.post("/ask", json={"question": QUESTION}).json()
    assert body["status"] == "withheld" and body["trace"]["answer"] == WITHHELD_ANSWER
    assert "19 euros" not in _answer_fields(body["trace"])
    assert body["trace"]["grounding"]["disputing_sources"] == ["kb-permits"]  # it still says why
    with client.stream("POST", "/ask/stream", json={"question": QUESTION}) as response:
        name, data = "".join(response.iter_text()).strip().split("\n\n")[-1].split("\n", 1)
    final = json.loads(data.removeprefix("data: "))
    assert name == "event: answer" and final["trace"]["answer"] == WITHHELD_ANSWER
    assert "19 euros" not in _answer_fields(final["trace"])
    # The full trace (?debug=1, a debug key's) keeps it: the operator tells a planted value from a true one.
    debug = client.post("/ask?debug=1", json={"question": QUESTION}).json()
    assert (debug["status"], debug["trace"]["answer"]) == ("withheld", "19 euros per month")


class _StalledWeb(ListWebSearch):
    """Web search that waits for ``release``: the witness search runs once the answer is written."""

    def __init__(self) -> None:
        super().__init__([])
        self.release = threading.Event()

    def search(self, query: str, max_results: int):
        self.queries.append(query)
        self.release.wait(10)
        return []


def test_a_run_cut_by_the_deadline_under_withhold_carries_no_answer_it_never_judged():
    web = _StalledWeb()
    service = ProgramService(
        LoadedProgram(CRAG(ListRetriever([PLANTED, HONEST]), web, lm=ScriptedLM(script)), "d")
    )
    client = local_client(create_app(service, ServePolicy(on_flag="withhold", request_timeout_s=3)))
    try:
        response = client.post("/ask", json={"question": QUESTION})
    finally:
        web.release.set()
    assert response.status_code == 504 and web.queries  # cut in the witness search, after the answer
    assert response.json()["trace"]["answer"] is None


def test_ask_json_has_the_status_and_no_withheld_answer(monkeypatch, capsys):
    # Probe 3: `ask --json --on-flag withhold` printed "answer": the planted value, with no status.
    from types import SimpleNamespace

    from crag_dspy import cli

    monkeypatch.setattr(cli, "program_from_args", lambda args: SimpleNamespace(crag=crag()))
    lm = ["--lm", "openai/fake", "--lm-api-base", "http://127.0.0.1:9/v1", "--json", "-q"]
    assert cli.main(["ask", QUESTION, *lm, "--on-flag", "withhold"]) == 0
    withheld = json.loads(capsys.readouterr().out)
    assert (withheld["status"], withheld["answer"]) == ("withheld", WITHHELD_ANSWER)
    assert "19 euros" not in _answer_fields(withheld)
    assert [(c["doc_id"], c["quote"]) for c in withheld["other_side"]] == [HONEST]
    assert cli.main(["ask", QUESTION, *lm]) == 0  # warn: shown, marked flagged
    warned = json.loads(capsys.readouterr().out)
    assert (warned["status"], warned["answer"], warned["other_side"]) == ("flagged", "19 euros per month", [])


def test_a_planted_escape_sequence_cannot_erase_the_warning_on_the_terminal(monkeypatch, capsys):
    # "\033[1A\033[2K" moves up a line and erases it: raw, the citation under the warning would erase it.
    from types import SimpleNamespace

    from crag_dspy import cli

    erase = "\033[1A\033[2K\033]0;PWNED\a\x9b2J"
    planted = ("kb-planted\033[2K", PLANTED[1] + erase + " It was approved.")
    monkeypatch.setattr(cli, "program_from_args", lambda args: SimpleNamespace(crag=crag((planted, HONEST))))
    assert cli.main(["ask", QUESTION, "--lm", "openai/fake", "--lm-api-base", "http://127.0.0.1:9/v1"]) == 0
    out, err = capsys.readouterr()
    assert not {"\033", "\a", "\x9b"} & set(out + err)  # nothing in the output acts on the terminal
    lines = out.splitlines()
    assert lines[0] == "answer: 19 euros per month"
    assert lines[1].startswith("warning: the answer may not be grounded; other sources state another value")
    assert "\\x1b[1A\\x1b[2K" in out  # shown, escaped: the text is there to read
    assert cli.main(["ask", QUESTION, "--json", "--lm", "openai/fake", "--lm-api-base", "http://x:9/v1"]) == 0
    shown = capsys.readouterr().out
    assert "\x9b" not in shown and "\\u009b" in shown
    assert json.loads(shown)["documents"][0]["doc_id"] == planted[0]  # the JSON means the same text
