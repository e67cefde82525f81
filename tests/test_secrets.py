"""Keys never appear in traces, CLI output, logs, program JSON or compile reports; nothing loads pickle."""

import ast
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from fake_servers import FakeOpenAI
from fakes import NO_LM, ScriptedLM

from crag_dspy.program import ProgramError, read_program
from crag_dspy.redaction import REDACTED, RedactingFilter, StreamRedactor, redact

ROOT = Path(__file__).resolve().parent.parent
OPENAI_KEY = "sk-test-secret-0123456789abcdefXYZ"
TAVILY_KEY = "tvly-secret-9876543210zyxwv"
KEYS = (OPENAI_KEY, TAVILY_KEY, "0123456789abcdefXYZ", "9876543210zyxwv")


@pytest.fixture()
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("TAVILY_API_KEY", TAVILY_KEY)


def assert_clean(text: str) -> None:
    for key in KEYS:
        assert key not in text


def test_redact_removes_environment_keys_and_key_shaped_strings(keys):
    text = (
        f"401: Incorrect API key provided: {OPENAI_KEY}; Authorization: Bearer abc.def-123456789; "
        f"tavily {TAVILY_KEY}; url https://user:hunter2pass@proxy.example/v1; sk-other-abcdefghijk"
    )
    cleaned = redact(text)
    assert_clean(cleaned)
    for leaked in ("abc.def-123456789", "hunter2pass", "sk-other-abcdefghijk"):
        assert leaked not in cleaned
    assert "Bearer ***" in cleaned and "https://***@proxy.example/v1" in cleaned
    assert redact("The AquaProbe 220 costs 1,240 velds; task-management and risk-based plans.") == (
        "The AquaProbe 220 costs 1,240 velds; task-management and risk-based plans."
    )


def _streamed(text: str, piece: int) -> list[str]:
    """What a StreamRedactor lets out of ``text`` sent ``piece`` characters at a time, then flushed."""
    redactor = StreamRedactor()
    return [redactor.feed(text[i : i + piece]) for i in range(0, len(text), piece)] + [redactor.flush()]


def test_streamed_text_is_redacted_though_a_key_spans_its_pieces(keys, monkeypatch):
    # /ask/stream sent an echoed OPENAI_API_KEY to every client as tokens: sk-p, robe3, -SECR, ...
    monkeypatch.setenv("DB_PASSWORD", "open sesame 42")  # a value holding spaces spans word cuts
    text = (
        f"The key is {OPENAI_KEY} ok; Bearer abc.def-123456789, sk-other-abcdefghijk, {TAVILY_KEY}. "
        f"Its password: open sesame 42 and https://user:hunter2pass@proxy.example/v1 done"
    )
    for piece in (1, 2, 3, 4, 5, 7, 16, len(text)):
        # The pieces join to the redacted text (the final answer's), so none holds part of a secret.
        assert "".join(_streamed(text, piece)) == redact(text), piece
    assert not [s for s in ("sesame", "hunter2", "abcdefghijk", "123456789") if s in redact(text)]
    # Text that cannot be part of a secret is let out as it comes: all but the open last word.
    redactor = StreamRedactor()
    assert [redactor.feed(t) for t in ("0 ", "to ", "25 ", "mg", "/L")] == ["0 ", "to ", "25 ", "", ""]
    assert redactor.flush() == "mg/L"
    assert redactor.feed("a" * 5000)  # no space in a long reply: streamed in pieces, not held whole


def test_logging_filter_redacts_messages_and_tracebacks(keys):
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "calling with key %s", (OPENAI_KEY,), None)
    try:
        raise RuntimeError(f"provider said {TAVILY_KEY}")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert_clean(logging.Formatter().format(record))
    assert REDACTED in record.getMessage()


def tiny_domain(root: Path) -> Path:
    root.mkdir()
    doc = {"id": "leave", "title": "Annual Leave", "text": "Staff receive 27 days of annual leave."}
    (root / "corpus.jsonl").write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return root


def script(system, user):
    if "You judge" in system:
        return 0.9
    return {"answer": "27 days", "query": "leave"}


def run_cli(tmp_path, api_base: str, *extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OPENAI_API_KEY": OPENAI_KEY,
        "TAVILY_API_KEY": TAVILY_KEY,
        "CRAG_CACHE_DIR": str(tmp_path),
        # A fresh DSPy cache per run: a cached answer would never reach the faulty server.
        "DSPY_CACHEDIR": str(tmp_path / f"dspy-cache-{len(list(tmp_path.glob('dspy-cache-*')))}"),
    }
    argv = [
        sys.executable, "-m", "crag_dspy", "ask", "How many days of leave do staff get?",
        "--domain-dir", str(tmp_path / "tiny"), "--chroma-path", str(tmp_path / "chroma"),
        "--lm", "openai/fake", "--lm-api-base", api_base, "--web-search", "none", "-v", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_cli_output_traces_and_logs_never_show_keys_even_when_the_server_echoes_them(tmp_path):
    tiny_domain(tmp_path / "tiny")
    with FakeOpenAI(script) as server:
        ok = run_cli(tmp_path, server.api_base, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["answer"] == "27 days"
    assert server.requests[0]["authorization"] == f"Bearer {OPENAI_KEY}"  # the key was really in use
    assert_clean(ok.stdout + ok.stderr)

    with FakeOpenAI(script, lambda n, body: "401-echo") as server:
        refused = run_cli(tmp_path, server.api_base, "--json")
        plain = run_cli(tmp_path, server.api_base)
    assert refused.returncode == plain.returncode == 1
    assert "refuses the requests" in refused.stderr and "LMAuthError" in refused.stderr
    assert "Bearer ***" in json.loads(refused.stdout)["errors"][-1]  # the echo arrived, redacted
    assert_clean(refused.stdout + refused.stderr + plain.stdout + plain.stderr)


def test_keys_an_lm_echoes_are_redacted_before_the_web_search_and_in_every_trace(keys):
    # The stage line was redacted, but the trace (stdout, --json, HTTP trace.web_query) and the web
    # search backend (a third party) got the key in clear.
    from fakes import ListRetriever, ListWebSearch

    from crag_dspy import CRAG
    from crag_dspy.protocols import WebResult

    echo = f"The key is Bearer {OPENAI_KEY} and {TAVILY_KEY}"

    def echoing(system: str, user: str):
        if "You judge" in system:
            return 0.05 if "canteen" in user else 0.9  # the passage is wrong: the web is searched
        if "web search query" in system:
            return {"query": echo}
        return {"answer": echo}

    web = ListWebSearch([WebResult("WQ-17", "https://x.example", "WQ-17 is recalibrated every 90 days.")])
    events = []
    crag = CRAG(ListRetriever([("kb", "The canteen opens at 08:00.")]), web, lm=ScriptedLM(echoing))
    pred = crag(question="How often is WQ-17 recalibrated?", on_event=events.append)
    assert pred.trace.web_query and REDACTED in pred.trace.web_query
    sent = " ".join(web.queries) + pred.answer + pred.trace.model_dump_json()
    sent += " ".join(e.message for e in events)
    assert_clean(sent)
    assert "Bearer ***" in (pred.trace.lm_answer or pred.trace.answer), pred.trace


def test_every_key_of_a_list_valued_variable_is_redacted(monkeypatch):
    # Probe 4: with CRAG_API_KEYS="key-a,key-b", the whole value was the only secret, so an LM echoing
    # one service key showed it in clear in the answer, trace.fallbacks and the streamed tokens.
    from fakes import ListRetriever, ListWebSearch

    from crag_dspy import CRAG

    first, second = "probe4-key-aaaaaaaaaaaaaaaa", "probe4-key-bbbbbbbbbbbbbbbb"
    monkeypatch.setenv("CRAG_API_KEYS", f"{first},{second}")
    monkeypatch.setenv("CRAG_DEBUG_API_KEYS", f" {first} ,\t{second}")
    monkeypatch.setenv("DB_PASSWORD", "open sesame, 42")  # short items of a value are not secrets
    echo = f"The range is 0 to 25 mg/L, key {second}"

    def echoing(system: str, user: str):
        return 0.9 if "You judge" in system else {"answer": echo}

    crag = CRAG(
        ListRetriever([("kb", "The range is 0 to 25 mg/L.")]), ListWebSearch([]), lm=ScriptedLM(echoing)
    )
    pred = crag(question="What is the range?")
    shown = pred.answer + pred.trace.model_dump_json() + "".join(_streamed(echo, 3))
    assert second not in shown and first not in shown and REDACTED in pred.trace.model_dump_json()
    assert "".join(_streamed(echo, 3)) == redact(echo) == "The range is 0 to 25 mg/L, key ***"
    assert redact("an open sesame") == "an open sesame"  # the whole value is redacted, not its words


def test_program_json_and_compile_report_never_hold_keys(tmp_path, keys):
    from test_compile import make_domain
    from test_compile import script as compile_script

    from crag_dspy.settings import Settings
    from optimize.compile import compile_program
    from optimize.options import CompileOptions

    settings = Settings(
        domain_dir=make_domain(tmp_path / "tiny"), chroma_path=tmp_path / "chroma", web_search="offline"
    )
    out = tmp_path / "out" / "program.json"
    compile_program(settings, CompileOptions(out=out, evaluate_test=False), lm=ScriptedLM(compile_script))
    written = [p for p in out.parent.iterdir() if p.suffix in {".json", ".md"}]
    assert {p.name for p in written} >= {"program.json", "program.report.json", "program.report.md"}
    for path in written:
        assert_clean(path.read_text(encoding="utf-8"))


class _Exploit:
    """Unpickling this would create the marker file: proof that a pickle was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", ["program.pkl", "program.json", "program.pickle"])
def test_pickled_programs_are_refused_without_being_unpickled(tmp_path, name, capsys):
    marker = tmp_path / "pwned"
    path = tmp_path / name
    path.write_bytes(pickle.dumps(_Exploit(marker)))
    with pytest.raises(ProgramError, match="pickle"):
        read_program(path)
    from crag_dspy.cli import main

    argv = ["ask", "q", "--program", str(path), *NO_LM]
    assert main(argv) == 2 and "pickle" in capsys.readouterr().err
    assert not marker.exists()


_PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}


def _pickle_uses(path: Path) -> list[str]:
    """Imports of pickle-family modules and calls that deserialize pickles, found in ``path``'s AST."""
    return [f"{path.relative_to(ROOT)}: {use}" for use in _pickle_uses_of(path.read_text(encoding="utf-8"))]


def _pickle_uses_of(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in _PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _PICKLE_MODULES:
            found.append(node.module)
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            module, _, attr = name.rpartition(".")
            if name in {"torch.load", "dspy.load", "pandas.read_pickle", "pd.read_pickle"} or (
                module in _PICKLE_MODULES and attr in {"load", "loads", "Unpickler"}
            ):
                found.append(name)
            for kw in node.keywords:
                if kw.arg in {"allow_pickle", "allow_unsafe_lm_state"} and ast.unparse(kw.value) != "False":
                    found.append(f"{name}({kw.arg}=...)")
                if kw.arg == "weights_only" and ast.unparse(kw.value) == "False":
                    found.append(f"{name}(weights_only=False)")
    return found


def test_no_project_module_can_load_a_pickle():
    sources = [
        p for d in ("crag_dspy", "optimize", "signatures", "benchmarks") for p in (ROOT / d).rglob("*.py")
    ]
    assert len(sources) > 30
    assert [use for path in sources for use in _pickle_uses(path)] == []
    # Tests import pickle to write pickles (and prove they are refused), never to read one.
    test_uses = [use for path in (ROOT / "tests").glob("*.py") for use in _pickle_uses(path)]
    assert sorted(test_uses) == ["tests/test_program.py: pickle", "tests/test_secrets.py: pickle"]
    assert _pickle_uses_of("import pickle\npickle.loads(b'')\ntorch.load('w.pt')\nm.load('p', allow_pickle=True)") == [
        "pickle", "pickle.loads", "torch.load", "m.load(allow_pickle=...)"
    ]  # fmt: skip


URL_PASSWORD = "s3cretpw-in-url"


def test_credentials_in_urls_are_redacted_also_without_a_scheme():
    # LiteLLM's connection errors name the host without "http://": "failed to connect to u:p@host:9".
    for text in (
        f"failed to connect to alice:{URL_PASSWORD}@127.0.0.1:9: Name or service not known",
        f"Cannot open Chroma (server alice:{URL_PASSWORD}@chroma.internal:8000): unsupported protocol",
        f"url https://alice:{URL_PASSWORD}@proxy.example/v1 and 'alice:{URL_PASSWORD}@h'",
    ):
        cleaned = redact(text)
        assert URL_PASSWORD not in cleaned and "alice" not in cleaned and "***@" in cleaned
    # An e-mail address has no ":password" part: answers and passages keep theirs.
    for text in (
        "Write to bob@example.com or ops.team@harbour.example.",
        "Contact: bob@example.com; mailto:bob@example.com; (bob@example.com)",
        "Opening hours 08:00-17:00 at the office.",
    ):
        assert redact(text) == text


def test_every_cli_error_line_redacts_a_password_in_a_url(tmp_path, capsys):
    """ask, serve, optimize.evaluate and optimize.compile print their start-up errors redacted."""
    from test_compile import make_domain

    from crag_dspy.cli import main as ask_main
    from crag_dspy.serve.cli import main as serve_main
    from optimize.compile import main as compile_main
    from optimize.evaluate import main as evaluate_main

    domain = make_domain(tmp_path / "tiny")
    common = ["--domain-dir", str(domain), "--chroma-host", f"alice:{URL_PASSWORD}@127.0.0.1"]
    common += ["--chroma-port", "9", *NO_LM]
    for name, run in (
        ("ask", lambda: ask_main(["ask", "What is the zeta code?", *common])),
        ("serve", lambda: serve_main(common)),
        ("evaluate", lambda: evaluate_main(common)),
        ("compile", lambda: compile_main([*common, "--grader", "llm"])),
    ):
        assert run() == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: Cannot open Chroma") and err.count("\n") == 1, (name, err)
        assert URL_PASSWORD not in err, name


def test_a_password_in_the_lm_api_base_is_refused_before_any_call_and_never_shown(tmp_path):
    # LiteLLM would resolve "alice:<password>@127.0.0.1" as the host name: every call would fail with
    # "Name or service not known". Refused up front, by a message that says what to do instead.
    tiny_domain(tmp_path / "tiny")
    env = {**os.environ, "CRAG_CACHE_DIR": str(tmp_path), "CRAG_LM_RETRIES": "0"}
    argv = [
        sys.executable, "-m", "crag_dspy", "ask", "How many days of leave do staff get?",
        "--domain-dir", str(tmp_path / "tiny"), "--chroma-path", str(tmp_path / "chroma"),
        "--lm", "openai/fake", "--lm-api-base", f"http://alice:{URL_PASSWORD}@127.0.0.1:9/v1",
        "--web-search", "none", "-v", "--json",
    ]  # fmt: skip
    run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 2, run.stderr
    assert "error: LM base URL http://***@127.0.0.1:9/v1 holds a user name and password" in run.stderr
    assert URL_PASSWORD not in run.stdout + run.stderr and "alice" not in run.stdout + run.stderr


@pytest.mark.parametrize(
    ("base", "message"),
    [
        (
            f"http://alice:{URL_PASSWORD}@127.0.0.1:9/v1",
            "http://***@127.0.0.1:9/v1 holds a user name and password",
        ),
        (
            f"https://{URL_PASSWORD}@llm.example/v1",
            "https://***@llm.example/v1 holds a user name and password",
        ),
        ("file:///srv/model/v1", "file:///srv/model/v1 is not an http:// or https:// URL"),
        (f"http://127.0.0.1:9/v1?api-key={URL_PASSWORD}", "http://127.0.0.1:9/v1?*** holds a query string"),
        ("http://127.0.0.1:9/v1#models", "http://127.0.0.1:9/v1?*** holds a query string or fragment"),
        ("127.0.0.1:8000/v1", "127.0.0.1:8000/v1 is not an http:// or https:// URL"),
    ],
)
def test_an_lm_base_url_no_server_can_answer_is_an_lm_config_error(base, message):
    from crag_dspy.lm import LMConfigError, build_lm
    from crag_dspy.settings import Settings

    with pytest.raises(LMConfigError) as raised:
        build_lm(Settings(lm="openai/fake", lm_api_base=base))
    assert message in str(raised.value) and URL_PASSWORD not in str(raised.value)


def test_a_long_error_is_redacted_before_it_is_cut_to_one_trace_line(keys):
    from crag_dspy.faults import describe_error

    # Cut first, the URL's "@" (or the end of a key) would be gone and the rest of the secret would stay.
    for secret, text in (
        (URL_PASSWORD, f"{'y' * 262} failed to connect to alice:{URL_PASSWORD}@127.0.0.1:9"),
        (OPENAI_KEY, f"{'y' * 280} Incorrect API key provided: {OPENAI_KEY}"),
    ):
        line = describe_error(ConnectionError(text))
        assert secret[:8] not in line, line[-60:]


def test_a_long_value_in_an_error_message_is_redacted_before_it_is_cut():
    # A cut made first would leave "http://user:secretsecret..." without the "@host" that marks the
    # part after the colon as a password.
    from pydantic import BaseModel, Field, ValidationError

    from crag_dspy.config import describe_validation_error

    class Model(BaseModel):
        url: str = Field(max_length=10)

    with pytest.raises(ValidationError) as caught:
        Model(url="http://user:" + "supersecretpassword" * 3 + "@host.example/v1")
    message = describe_validation_error(caught.value)
    assert "supersecret" not in message and "***" in message


@pytest.mark.parametrize("name", ["CHROMA_CLIENT_AUTH_CREDENTIALS", "SMTP_PASSWD", "SIGNING_PASSPHRASE"])
def test_credential_variables_named_otherwise_are_redacted_too(monkeypatch, name):
    # Probe 6: a Chroma server echoing the X-Chroma-Token it was sent (CHROMA_CLIENT_AUTH_CREDENTIALS)
    # reached ask's stderr, --json trace, serve's 503 detail and its log in clear.
    monkeypatch.setenv(name, "chroma-token-0123456789abcdef")
    assert redact("403: bad token chroma-token-0123456789abcdef") == "403: bad token ***"


def test_credentials_kept_in_dot_env_are_redacted_like_the_environments(tmp_path, monkeypatch):
    # Probe 8: CRAG's settings and chromadb also read ./.env; a Chroma token and service keys kept there
    # were used, and shown in clear when a store or an LM echoed them.
    token, first, second = (
        "probe8-chroma-token-QWERTY1234",
        "svc-key-aaaaaaaaaaaaaaaa",
        "svc-key-bbbbbbbbbbbbbbbb",
    )
    (tmp_path / ".env").write_text(
        f"CHROMA_CLIENT_AUTH_CREDENTIALS={token}\nCRAG_API_KEYS={first},{second}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert redact(f"403 X-Chroma-Token: {token}; echoed {second}") == "403 X-Chroma-Token: ***; echoed ***"
    (tmp_path / ".env").write_text("CRAG_K=4\n")  # read again once it changes
    assert redact(f"echoed {second}") == f"echoed {second}"


def test_a_key_kept_only_in_dot_env_is_named_as_not_read(tmp_path, monkeypatch):
    # Probe 9: CRAG_* settings come from .env, keys only from the environment; a key left in .env was
    # skipped without a word, and the error said only "set the environment variable".
    from crag_dspy.lm import LMConfigError, build_lm
    from crag_dspy.settings import Settings

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LMConfigError) as plain:
        build_lm(Settings(lm="openai/gpt-4o-mini"))
    assert str(plain.value).endswith("needs an API key: set the environment variable OPENAI_API_KEY.")
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-in-dotenv-0123456789abcdef\n")
    with pytest.raises(LMConfigError) as kept:
        build_lm(Settings(lm="openai/gpt-4o-mini"))
    assert "the .env file here holds OPENAI_API_KEY, but keys are read from the environment only" in str(
        kept.value
    )
    assert "sk-in-dotenv" not in str(kept.value)
