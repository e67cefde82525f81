import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import NO_LM

from crag_dspy.cli import build_parser, main
from crag_dspy.console import main as console_main
from crag_dspy.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_help_everywhere(capsys):
    for argv in (["--help"], ["ask", "--help"], ["ingest", "--help"], ["engine", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    assert "--program" in capsys.readouterr().out


def test_ingest_tiny_domain_twice(tmp_path, capsys):
    domain = tmp_path / "tiny"
    domain.mkdir()
    (domain / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "title": "Leave", "text": "Staff get 27 days of leave."}) + "\n",
        encoding="utf-8",
    )
    argv = ["ingest", str(domain), "--chroma-path", str(tmp_path / "chroma")]
    assert main(argv) == 0
    assert "1 added" in capsys.readouterr().out
    assert main(argv) == 0
    assert "0 added, 1 unchanged, 0 removed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ingest", "/nonexistent/domain"], "domain directory not found"),
        (
            [
                "ask",
                "q",
                "--domain-dir",
                "/nonexistent/domain",
                "--lm",
                "openai/gpt-4o-mini",
                "--lm-api-base",
                "http://127.0.0.1:9/v1",
            ],
            "domain directory not found",
        ),
        (["ask", "q", "--lm", "gpt-4o-mini"], "not a LiteLLM model string"),
        (["ask", "q", "--lower", "0.9", "--upper", "0.1"], "must not exceed upper"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            ["--k", "0"],
            {},
            "error: invalid CRAGConfig: k: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            [],
            {"CRAG_CONFIG__UPPER": "2"},
            "error: invalid Settings: config.upper: Input should be less than or equal to 1 (got '2')",
        ),
        (
            ["--lower", "0.9", "--upper", "0.1"],
            {},
            "error: invalid CRAGConfig: lower (0.9) must not exceed upper (0.1)",
        ),
        (  # inf passed "> 0", then every LM call failed and ask answered "I don't know", exit 0
            [],
            {"CRAG_LM_TIMEOUT_S": "inf"},
            "error: invalid Settings: lm_timeout_s: Input should be a finite number (got 'inf')",
        ),
    ],
)
def test_a_setting_out_of_range_is_one_line_naming_it_and_the_value(argv, env, line, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["ask", "q", *argv]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_a_variable_that_should_hold_json_and_does_not_says_so(monkeypatch, capsys):
    monkeypatch.setenv("CRAG_WEB_DOMAINS", "wikipedia.org")
    assert main(["ask", "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        'error: error parsing value for field "web_domains" from source "EnvSettingsSource": '
    )
    assert (
        "the value is not JSON (Expecting value" in err and """CRAG_WEB_DOMAINS='["wikipedia.org"]'""" in err
    )
    assert err.count("\n") == 1


def test_a_base_url_without_a_served_model_is_refused_not_ignored(capsys):
    # The embedded model would have answered while the user believed their server did.
    assert main(["ask", "q", "--lm-api-base", "http://alice:pw@127.0.0.1:9/v1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid Settings: lm_api_base: a base URL is for a served model")
    assert "--lm openai/<model name>" in err and "pw" not in err and err.count("\n") == 1
    assert Settings(lm="openai/m", lm_api_base="http://127.0.0.1:9/v1").lm_api_base  # with a model: fine


def test_a_chroma_server_and_folder_together_are_refused_not_one_ignored(tmp_path, capsys):
    # The server's collections would have been used while the user believed their folder was.
    assert main(["ask", "q", "--chroma-host", "db.internal", "--chroma-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid Settings: chroma_host: a Chroma server and an embedded Chroma")
    assert "keep one" in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # refused before anything was written
    assert Settings(chroma_host="db.internal").chroma_host == "db.internal"  # alone: fine
    assert Settings(chroma_path=tmp_path).resolved_chroma_path == tmp_path


def test_missing_api_key_names_the_variable(monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main(["ask", "q", "--lm", "openai/gpt-4o-mini"]) == 2
    assert "OPENAI_API_KEY" in capsys.readouterr().err


def test_flags_override_environment(monkeypatch):
    from crag_dspy.cli import settings_from_args

    monkeypatch.setenv("CRAG_CONFIG__K", "9")
    monkeypatch.setenv("CRAG_CONFIG__LOWER", "0.1")
    settings = settings_from_args(build_parser().parse_args(["ask", "q", "--k", "3"]))
    assert settings.config.k == 3 and settings.config.lower == 0.1


def test_ask_with_a_corrupt_program_is_a_clear_error(tmp_path, capsys):
    program = tmp_path / "program.json"
    program.write_text('{"format": "crag-dspy-program", "format_version": 1, "sta')
    argv = [
        "ask",
        "q",
        "--program",
        str(program),
        "--lm",
        "openai/m",
        "--lm-api-base",
        "http://127.0.0.1:9/v1",
    ]
    assert main(argv) == 2
    assert "corrupt or truncated program JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "own_help"),
    [
        ("compile", ("usage: crag-dspy compile", "--optimizer")),
        ("evaluate", ("usage: crag-dspy evaluate", "--split")),
        ("synthesize", ("usage: crag-dspy synthesize", "--accept-all")),
        ("serve", ("usage: crag-dspy serve", "--insecure")),
    ],
)
def test_compile_evaluate_and_serve_print_their_modules_own_help(command, own_help, capsys):
    # Their modules' parsers, named as the user typed them: "crag-dspy compile", not "python -m ...".
    with pytest.raises(SystemExit) as exit_info:
        console_main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(text in out for text in own_help), out


def test_a_module_run_as_a_module_keeps_its_python_m_usage_line(capsys):
    from optimize.compile import main as compile_main

    with pytest.raises(SystemExit):
        compile_main(["--help"])
    assert "usage: python -m optimize.compile" in capsys.readouterr().out


def test_every_subcommand_is_listed_in_the_overview(capsys):
    with pytest.raises(SystemExit):
        console_main(["--help"])
    out = capsys.readouterr().out
    for command in ("ingest", "ask", "compile", "evaluate", "serve", "engine"):
        assert f"    {command} " in out, command


def test_a_subcommand_passes_its_arguments_to_the_modules_main_untouched(monkeypatch):
    seen = {}

    def recorder(name, code):
        def fake_main(argv):
            seen[name] = argv
            return code

        return fake_main

    monkeypatch.setattr("optimize.compile.main", recorder("compile", 7))
    monkeypatch.setattr("optimize.evaluate.main", recorder("evaluate", 5))
    assert console_main(["compile", "--domain", "transit", "--stages", "thresholds", "-v"]) == 7
    assert console_main(["evaluate", "--help-me", "x"]) == 5  # not parsed here: the module's parser decides
    assert seen == {
        "compile": ["--domain", "transit", "--stages", "thresholds", "-v"],
        "evaluate": ["--help-me", "x"],
    }


def test_the_compile_subcommand_reports_bad_flags_as_the_module_does(capsys):
    with pytest.raises(SystemExit) as exit_info:
        console_main(["compile", "--no-such-flag"])
    assert exit_info.value.code == 2
    assert "crag-dspy compile: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_serve_without_its_extra_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr("crag_dspy.serve.MISSING_EXTRA", "crag_dspy.serve needs FastAPI (pip install x)")
    assert console_main(["serve", "--port", "8081"]) == 2
    assert capsys.readouterr().err == "error: crag_dspy.serve needs FastAPI (pip install x)\n"
    # Its help works all the same (it used to exit 2), and says what is missing.
    with pytest.raises(SystemExit) as exit_info:
        console_main(["serve", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "usage: crag-dspy serve" in out and "--insecure" in out
    assert "Not installed here: crag_dspy.serve needs FastAPI" in out


def test_serve_help_works_in_a_process_without_the_server_packages():
    # Not a patched flag: the packages cannot be imported at all in this process.
    code = (
        "import sys; sys.modules.update(fastapi=None, uvicorn=None, limits=None); "
        "from crag_dspy.console import main; main(['serve', '--help'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert (
        "usage: crag-dspy serve" in out.stdout and "Not installed here: crag_dspy.serve needs" in out.stdout
    )


def test_ingest_without_a_path_ingests_the_domain_the_flags_name(tmp_path, capsys):
    domain = tmp_path / "tiny"
    domain.mkdir()
    (domain / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "title": "Leave", "text": "Staff get 27 days of leave."}) + "\n",
        encoding="utf-8",
    )
    assert main(["ingest", "--domain-dir", str(domain), "--chroma-path", str(tmp_path / "chroma")]) == 0
    assert "tiny__kb: 1 documents, 1 chunks (1 added" in capsys.readouterr().out


def test_ctrl_c_ends_every_command_with_one_line_and_exit_130(monkeypatch, capsys):
    from optimize.compile import main as compile_main

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("crag_dspy.app.open_program", interrupt)
    assert main(["ask", "q", *NO_LM]) == 130  # a traceback through whatever ran, before
    monkeypatch.setattr("optimize.compile.build_lm", interrupt)
    assert compile_main(["--no-test-eval", *NO_LM]) == 130
    assert console_main(["compile", "--no-test-eval", *NO_LM]) == 130
    monkeypatch.setattr("crag_dspy.serve.cli.load_programs", interrupt)  # serve's start-up
    assert console_main(["serve", *NO_LM]) == 130
    assert capsys.readouterr().err == "interrupted\n" * 4


def test_ingest_takes_the_folder_as_every_command_does_and_refuses_two_different_ones(tmp_path, capsys):
    domain = tmp_path / "tiny"
    domain.mkdir()
    (domain / "corpus.jsonl").write_text(
        json.dumps({"id": "a", "title": "Leave", "text": "Staff get 27 days of leave."}) + "\n",
        encoding="utf-8",
    )
    chroma = ["--chroma-path", str(tmp_path / "chroma")]
    assert main(["ingest", str(domain), "--domain-dir", str(domain), *chroma]) == 0  # the same folder twice
    assert main(["ingest", str(tmp_path), "--domain-dir", str(domain), *chroma]) == 2
    assert "give the domain once (--domain-dir DIR" in capsys.readouterr().err


@pytest.mark.parametrize("quiet", [False, True])
def test_ask_prints_the_stages_on_stderr_as_they_happen_and_the_answer_on_stdout(quiet, monkeypatch, capsys):
    from types import SimpleNamespace

    from dspy.utils.dummies import DummyLM
    from fakes import ListRetriever
    from test_dummy_lm import FERRY, QUESTION, script

    from crag_dspy import CRAG, cli
    from crag_dspy.web import NoWebSearch

    crag = CRAG(ListRetriever([("ferry", FERRY)]), NoWebSearch(), lm=DummyLM(script()))
    seen: list[str] = []  # stderr as each stage ended: the lines are there before the run ends
    real = cli.print_stage

    def spying(event):
        real(event)
        seen.append(event.kind)

    monkeypatch.setattr(cli, "print_stage", spying)
    monkeypatch.setattr(cli, "program_from_args", lambda args: SimpleNamespace(crag=crag))
    assert main(["ask", QUESTION, *NO_LM, *(["--quiet"] if quiet else [])]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("23:40 from pier four") or "23:40 from pier four" in out.splitlines()[0]
    assert "action CORRECT" not in out and "[" not in out.splitlines()[0]
    if quiet:
        assert err == "" and seen == []
    else:
        lines = err.splitlines()
        assert [line.split("] ", 1)[1].split(" ")[0] for line in lines] == [
            "retrieved",
            "graded",
            "action",
            "kept",
            "answer:",
            "cited",
        ]
        assert seen[0] == "retrieved"


@pytest.mark.parametrize("module", ["optimize.compile", "optimize.evaluate", "optimize.synthesize"])
def test_every_command_that_may_search_takes_web_search(module):
    import importlib

    from crag_dspy.cli import settings_from_args

    parser = importlib.import_module(module).build_parser()
    args = parser.parse_args(["--web-search", "none"])
    assert settings_from_args(args).web_search == "none"
    with pytest.raises(SystemExit):
        parser.parse_args(["--web-search", "bing"])


def test_evaluate_out_names_the_report_with_or_without_its_suffix():
    from optimize.evaluate import _report_prefix

    assert _report_prefix(Path("runs/x.md")) == _report_prefix(Path("runs/x.json")) == Path("runs/x")
    assert _report_prefix(Path("runs/x")) == Path("runs/x")
    assert _report_prefix(Path("runs/run.2026")) == Path("runs/run.2026")


def test_errors_about_the_bundled_program_and_domains_do_not_print_where_the_package_is(tmp_path, capsys):
    """The shipped program and domains are named by what they are, not by the installation's path."""
    from crag_dspy.settings import DEFAULT_DATA_DIR

    store = ["--chroma-path", str(tmp_path / "chroma"), *NO_LM]
    assert main(["ask", "q", "--program", "default", "--domain", "transit", *store]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: the bundled program for domain 'default': program was compiled for domain 'default', not "
        "'transit'; compile one for 'transit' or pass --domain default\n"
    )
    assert main(["ask", "q", "--domain", "nosuch", *store]) == 2
    assert capsys.readouterr().err == "error: bundled data/nosuch: domain directory not found\n"
    # A user's own paths stay as they were given.
    mine = tmp_path / "my-domain"
    assert main(["ask", "q", "--domain-dir", str(mine), *store]) == 2
    assert capsys.readouterr().err == f"error: {mine}: domain directory not found\n"
    assert str(DEFAULT_DATA_DIR) not in err


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("{d}/default/program.json: corrupt", "the bundled program for domain 'default': corrupt"),
        ("{d}/default/corpus.jsonl:3: not valid JSON", "bundled data/default/corpus.jsonl:3: not valid JSON"),
        ("(no folder {d}/foo); give its folder", "(no folder bundled data/foo); give its folder"),
        ("see {d}/default/program.json.", "see the bundled program for domain 'default'."),
        ("{d}2/x: a folder beside it", "{d}2/x: a folder beside it"),
        ("/elsewhere/default/program.json: mine", "/elsewhere/default/program.json: mine"),
    ],
)
def test_paths_inside_the_bundled_data_are_named_relative_to_it(text, shown, tmp_path):
    from crag_dspy.bundled_paths import show_bundled_paths

    data = tmp_path / "site-packages" / "crag_dspy" / "bundled"
    assert show_bundled_paths(text.format(d=data), data) == shown.format(d=data)


def _ask_over_the_ferry(monkeypatch, lm, ferry: str = "ferry"):
    from types import SimpleNamespace

    from fakes import ListRetriever
    from test_dummy_lm import BAKERY, FERRY

    from crag_dspy import CRAG, cli
    from crag_dspy.web import NoWebSearch

    crag = CRAG(ListRetriever([(ferry, FERRY), ("bakery", BAKERY)]), NoWebSearch(), lm=lm)
    monkeypatch.setattr(cli, "program_from_args", lambda args: SimpleNamespace(crag=crag))


@pytest.mark.parametrize("form", ["json", "jsonl"])
def test_ask_takes_the_conversation_from_a_history_file(form, tmp_path, monkeypatch, capsys):
    from test_conversation import FOLLOW_UP, HISTORY, condensing_lm
    from test_dummy_lm import QUESTION

    lm = condensing_lm()
    _ask_over_the_ferry(monkeypatch, lm)
    path = tmp_path / f"history.{form}"
    text = json.dumps(HISTORY) if form == "json" else "".join(json.dumps(t) + "\n\n" for t in HISTORY)
    path.write_text(text, encoding="utf-8")
    assert main(["ask", FOLLOW_UP, "--history", str(path), *NO_LM]) == 0
    out, err = capsys.readouterr()
    assert "23:40 from pier four" in out.splitlines()[0]
    assert f"standalone question: {QUESTION}" in err  # the follow-up was rewritten, then answered
    assert "Q1: Is there a night ferry to Velm Island?" in lm.history[0]["messages"][-1]["content"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "history.json: cannot read history file (No such file or directory)"),
        ('{"question": "a", "answer": "b"}\nnot json\n', "history.json:2: not JSON"),
        ('[{"question": "a"}]', "history.json: history[0] lacks 'answer'"),
        ('"a question"', "history.json:1: a str, not a turn"),
        (json.dumps([{"question": "a", "answer": "b"}] * 9), "history has 9 turns; at most 8"),
    ],
)
def test_a_bad_history_file_is_one_clear_line_before_any_model(
    content, message, tmp_path, monkeypatch, capsys
):
    from crag_dspy import cli

    opened: list[bool] = []
    monkeypatch.setattr(cli, "program_from_args", lambda args: opened.append(True))
    path = tmp_path / "history.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["ask", "and the night ferry?", "--history", str(path), *NO_LM]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1
    assert opened == []  # refused before any program, store or model is opened


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_history_file_is_a_regular_file_of_bounded_size_one_line_if_not(tmp_path, monkeypatch, capsys):
    from crag_dspy import cli, conversation

    monkeypatch.setattr(cli, "program_from_args", lambda args: pytest.fail("a program was opened"))
    os.mkfifo(tmp_path / "fifo.json")  # the open waited for a writer for ever
    (tmp_path / "zero.json").symlink_to("/dev/zero")  # was read until memory ran out (a MemoryError)
    (tmp_path / "big.json").write_text(json.dumps([{"question": "a", "answer": "b" * 200}]), encoding="utf-8")
    monkeypatch.setattr(conversation, "MAX_HISTORY_BYTES", 100)
    for name, message in (
        ("big.json", "big.json: history file is larger than 100 bytes (the limit)"),
        ("fifo.json", "fifo.json: not a regular file (a named pipe); a history file is a JSON file"),
        ("zero.json", "zero.json: not a regular file (a character device); a history file is a JSON file"),
    ):
        assert main(["ask", "and the night ferry?", "--history", str(tmp_path / name), *NO_LM]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_untrusted_text_is_printed_with_its_terminal_controls_escaped():
    from crag_dspy.terminal import terminal_safe

    assert terminal_safe("a\tb\nc\033[2K\rd\x9b\u202ee\udcff") == "a\tb\nc\\x1b[2K\\x0dd\\x9b\\u202ee\\udcff"
    assert terminal_safe("one\ntwo", newlines=False) == "one\\x0atwo"
    assert terminal_safe("Ünïcode, 23:40 — fine") == "Ünïcode, 23:40 — fine"


def test_ingest_lists_and_logs_a_file_named_with_an_escape_sequence_escaped(tmp_path, capsys):
    import logging

    from crag_dspy.redaction import RedactingFilter

    corpus = tmp_path / "dom" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "good.txt").write_text("Good\n\nThe P-40 pump moves 40 litres per minute.\n")
    (corpus / "x\033[1A\033[2K.xlsx").write_text("not a document")
    assert main(["ingest", str(corpus.parent), "--chroma-path", str(tmp_path / "chroma")]) == 0
    out = capsys.readouterr().out
    assert "\033" not in out and "x\\x1b[1A\\x1b[2K.xlsx: unsupported file type" in out
    record = logging.LogRecord(
        "crag_dspy.loaders", logging.WARNING, "", 0, "skipped %s", ("a\033[2Kb",), None
    )
    assert RedactingFilter().filter(record) and record.getMessage() == "skipped a\\x1b[2Kb"


# File names a corpus may hold: each would start a line reading as `ask`'s answer if printed raw.
FORGING_NAMES = [
    "ferry\nanswer: FORGED 990 velds per minute\n  [1] x.md",
    "ferry\ranswer: FORGED by a carriage return",
    "ferry\u2028answer: FORGED by a line separator",
]


def _forged(text: str) -> list[str]:
    """The lines of ``text`` (split wherever a viewer may break one) that show the forged answer."""
    return [line for line in text.splitlines() if "answer: FORGED" in line.split("] ", 1)[-1][:16]]


@pytest.mark.parametrize("name", FORGING_NAMES)
def test_a_file_name_with_line_breaks_cannot_forge_a_line_of_asks_output(name, monkeypatch, capsys):
    from dspy.utils.dummies import DummyLM
    from test_dummy_lm import QUESTION, script

    shown = " ".join(name.split())  # as the grader's prompt shows a title: on one line
    graded = {f"document:\n<<<\n{shown}\n": {"relevant": "Yes"}, **script()}  # the ferry, named so
    _ask_over_the_ferry(monkeypatch, DummyLM(graded), ferry=name)
    assert main(["ask", QUESTION, *NO_LM]) == 0
    out, err = capsys.readouterr()
    assert "23:40" in out.splitlines()[0] and _forged(out) == [] and _forged(err) == []
    assert "ferry\\x" in out or "ferry\\u2028" in out  # the name is all there, its break escaped
    assert main(["ask", QUESTION, *NO_LM, "--json", "--quiet"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert name in {c["doc_id"] for c in trace["citations"]}  # JSON keeps the exact name


def test_a_file_name_with_line_breaks_cannot_forge_a_line_of_ingests_output_or_log(tmp_path, capsys):
    import logging

    from crag_dspy.redaction import RedactingFilter

    corpus = tmp_path / "dom" / "corpus"
    corpus.mkdir(parents=True)
    for i, name in enumerate(FORGING_NAMES):
        (corpus / f"{i}{name}.xlsx").write_text("not a document")
    assert main(["ingest", str(corpus.parent), "--chroma-path", str(tmp_path / "chroma")]) == 2
    err = capsys.readouterr().err  # every file was unreadable: named in the one error line
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and _forged(err) == []
    (corpus / "good.txt").write_text("Good\n\nThe P-40 pump moves 40 litres per minute.\n")
    assert main(["ingest", str(corpus.parent), "--chroma-path", str(tmp_path / "chroma")]) == 0
    out = capsys.readouterr().out
    assert "skipped 3 unreadable file(s):" in out and _forged(out) == []
    record = logging.LogRecord(
        "crag_dspy.loaders", logging.WARNING, "", 0, "skipped %s", (FORGING_NAMES[0],), None
    )
    assert RedactingFilter().filter(record) and _forged(record.getMessage()) == []
