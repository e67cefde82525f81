"""``crag-dspy ask`` at a terminal writes the answer's draft on stderr as the LM streams it, between the
stages, and then the answer the user gets, marked when it is not the draft; stdout is what it always
was. Scripted LM: a real ``dspy.LM`` (LiteLLM) on the embedded model's server over a scripted engine
that streams a word at a time."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import dspy
import pytest
from fakes import NO_LM, ListRetriever, ListWebSearch, ScriptEngine, field

from crag_dspy import CRAG, cli
from crag_dspy.cli import main
from crag_dspy.config import CRAGConfig
from crag_dspy.lm.openai_server import OpenAIServer

QUESTION = "What is the range of the AquaProbe 220?"
GOOD = ("kb-good", "The AquaProbe 220 has a range of 0 to 25 mg/L.")
BAD = ("kb-bad", "The canteen opens at 08:00.")


def answering(answer: str):
    """The LM's script: the AquaProbe passage is relevant, the answerer replies ``answer``."""

    def script(system: str, user: str):
        if "You judge search results" in system:
            return 0.9 if "0 to 25" in field(user, "document") else 0.05
        if "You judge short knowledge strips" in system:
            return 0.9 if "0 to 25" in field(user, "strip") else 0.05
        if "web search query" in system:
            return {"query": "AquaProbe 220 range"}
        return {"answer": answer}

    return script


class Terminal(io.StringIO):
    """stderr as a terminal (isatty), keeping what was written."""

    def isatty(self) -> bool:
        return True


@contextmanager
def asking(script, texts=(GOOD, BAD), **config) -> Iterator[ScriptEngine]:
    """``ask`` runs a CRAG over ``texts`` whose LM streams through the embedded server's code."""
    engine = ScriptEngine(script)
    server = OpenAIServer(engine, "scripted", api_key=None)
    lm = dspy.LM(
        "openai/scripted",
        api_base=f"http://127.0.0.1:{server.port}/v1",
        api_key="unused",
        temperature=0.0,
        max_tokens=256,
        num_retries=0,
        cache=False,
    )
    crag = CRAG(ListRetriever(list(texts)), ListWebSearch([]), CRAGConfig(**config), lm=lm)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "program_from_args", lambda args: SimpleNamespace(crag=crag))
        try:
            yield engine
        finally:
            server.close()


def ask(capsys, monkeypatch, *flags: str, tty: bool = True, question=QUESTION) -> tuple[str, list[str]]:
    """stdout, and stderr's lines without their times, of ``crag-dspy ask QUESTION *flags``."""
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["ask", question, *NO_LM, *flags]) == 0
    return capsys.readouterr().out, [line.split("] ", 1)[-1] for line in err.getvalue().splitlines()]


def without_cost(out: str) -> str:
    return "\n".join(line for line in out.splitlines() if not line.startswith("cost: "))


def test_at_a_terminal_the_draft_streams_between_the_stages_and_stdout_is_unchanged(capsys, monkeypatch):
    with asking(answering("0 to 25 mg/L")) as engine:
        out, err = ask(capsys, monkeypatch)
        assert len(engine.streamed) == 1 and "You judge" not in engine.streamed[0]  # the answer only
        piped_out, piped_err = ask(capsys, monkeypatch, tty=False)
    assert err == [
        "retrieved 2 passages: kb-good; kb-bad",
        "graded 2 passages: 0.90, 0.05",
        err[2],  # the action and its thresholds
        "kept 1 of 1 internal strips",
        "draft: 0 to 25 mg/L",
        "answer: 0 to 25 mg/L",  # the draft was the answer: nothing to mark
        "cited 1: kb-good",
    ]
    assert err[2].startswith("action CORRECT")
    assert piped_err == [line for line in err if not line.startswith("draft: ")]
    assert len(engine.streamed) == 1  # not a terminal: the LM was not asked to stream
    assert without_cost(out) == without_cost(piped_out) and out.startswith("answer: 0 to 25 mg/L\n")


def test_a_draft_the_answer_stage_changed_is_marked_replaced(capsys, monkeypatch):
    with asking(answering("25")):  # a bare number: its unit comes from the context
        out, err = ask(capsys, monkeypatch)
    assert "draft: 25" in err
    assert "answer: 25 mg/L  (draft replaced: unit from the context)" in err
    assert out.startswith("answer: 25 mg/L  (the LM replied '25'; unit from the context)")


def test_an_ungrounded_draft_replaced_by_i_dont_know_is_marked(capsys, monkeypatch):
    with asking(answering("0 to 40 mg/L"), abstain_ungrounded=True):
        out, err = ask(capsys, monkeypatch)
    assert "draft: 0 to 40 mg/L" in err
    assert "answer: I don't know  (draft replaced: no kept strip states it)" in err
    assert out.startswith("answer: I don't know")


PLANTED = ("kb-planted", "A resident parking permit costs 19 euros per month since the last council vote.")
HONEST = ("kb-permits", "A resident parking permit costs 12 euros per month.")
PERMITS = (PLANTED, HONEST, ("kb-canteen", "The canteen opens at 08:00."))
PERMIT = "What does a resident parking permit cost per month?"


def disputed(system: str, user: str):
    """test_flag_policy's script: the LM answers the planted value, which the honest source disputes."""
    if "You judge search results" in system:
        return 0.9 if "euros" in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if "19 euros" in field(user, "strip") else 0.05
    if "web search query" in system:
        return {"query": "resident parking permit price"}
    return {"answer": "19 euros per month"}


def test_a_flagged_draft_is_marked_and_one_that_may_be_withheld_never_streams(capsys, monkeypatch):
    with asking(disputed, texts=PERMITS) as engine:
        _, warned = ask(capsys, monkeypatch, question=PERMIT)
        assert len(engine.streamed) == 1
        out, withheld = ask(capsys, monkeypatch, "--on-flag", "withhold", question=PERMIT)
        assert len(engine.streamed) == 1  # withhold: the answer was not streamed
    assert "draft: 19 euros per month" in warned
    assert "answer: 19 euros per month  (flagged: see the warning under the answer)" in warned
    assert not [line for line in withheld if "draft" in line or "19 euros" in line]
    assert "answer withheld (--on-flag withhold): The sources disagree or instruct; not answered" in withheld
    assert out.startswith("answer: The sources disagree or instruct; not answered  (withheld")


def test_a_withheld_answer_after_a_draft_says_the_draft_is_not_the_answer():
    from crag_dspy.cli import final_answer_line

    with asking(disputed, texts=PERMITS):
        trace = cli.program_from_args(None).crag(question=PERMIT).trace
    event = SimpleNamespace(message=f"answer: {trace.answer}")
    assert trace.grounding.disputed  # the premise: a flagged answer, withheld under withhold
    line = final_answer_line(event, trace, "withhold", "19 euros per month")
    assert line.startswith("answer withheld") and line.endswith("; the draft above is not the answer")
    assert "19 euros" not in line


def test_quiet_prints_nothing_on_stderr_and_streams_nothing(capsys, monkeypatch):
    with asking(answering("0 to 25 mg/L")) as engine:
        out, err = ask(capsys, monkeypatch, "--quiet")
    assert err == [] and engine.streamed == [] and out.startswith("answer: 0 to 25 mg/L")


def test_a_run_that_fails_after_its_draft_says_there_is_no_answer(capsys, monkeypatch):
    from crag_dspy import module

    def broken(*args, **kwargs):
        raise RuntimeError("grounding broke")

    monkeypatch.setattr(module, "finish", broken)
    with asking(answering("0 to 25 mg/L")):
        err = Terminal()
        monkeypatch.setattr(sys, "stderr", err)
        with pytest.raises(RuntimeError, match="grounding broke"):
            main(["ask", QUESTION, *NO_LM])
    lines = err.getvalue().splitlines()
    assert lines[-2].endswith("draft: 0 to 25 mg/L")
    assert lines[-1] == "no answer: the run did not finish; the draft above is not one"
