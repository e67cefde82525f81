"""Several domains, one server: ``/ask`` (and ``/ask/stream``, ``/program``) choose a program by its domain,
the first is the default, an unknown one is a 422 naming those served; the queue, keys and rate limit are
shared. Scripted LMs over in-memory backends; the command line on tiny on-disk domains."""

from __future__ import annotations

import threading

import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from serving import local_client, write_domain
from test_serve import make_service
from test_serve_stream import events_of

from crag_dspy import CRAG
from crag_dspy.app import LoadedProgram
from crag_dspy.config import CRAGConfig
from crag_dspy.program import ProgramError, save_program
from crag_dspy.serve import Domains, ProgramService, UnknownDomain, create_app
from crag_dspy.serve.arguments import build_parser
from crag_dspy.serve.cli import main as serve_main
from crag_dspy.serve.policy import ServePolicy
from crag_dspy.serve.programs import load_programs, program_paths

LEAVE = ("kb-leave", "Harbour staff receive 27 days of annual leave per year.")


def harbour_script(system: str, user: str):
    if "You judge search results" in system:
        return 0.9 if "27 days" in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if "27 days" in field(user, "strip") else 0.05
    return {"answer": "27 days" if "27 days" in field(user, "context") else "I don't know"}


def harbour_service(lm=None) -> ProgramService:
    crag = CRAG(ListRetriever([LEAVE]), ListWebSearch(), CRAGConfig(), lm=lm or ScriptedLM(harbour_script))
    return ProgramService(LoadedProgram(crag, "harbour"))


@pytest.fixture()
def client():
    return local_client(create_app([make_service(), harbour_service()]))


def test_ask_answers_from_the_domain_it_names_and_from_the_first_without_one(client):
    plain = client.post("/ask", json={"question": "What is the range?"}).json()
    assert (plain["domain"], plain["answer"]) == ("default", "0 to 25 mg/L")
    chosen = client.post("/ask", json={"question": "How much leave?", "domain": "harbour"}).json()
    assert (chosen["domain"], chosen["answer"], chosen["action"]) == ("harbour", "27 days", "CORRECT")
    assert [d["doc_id"] for d in chosen["trace"]["documents"]] == ["kb-leave"]  # harbour's store only


def test_an_unknown_domain_is_a_422_naming_the_domains_served(client):
    for path in ("/ask", "/ask/stream"):
        response = client.post(path, json={"question": "How much leave?", "domain": "fjord"})
        assert response.status_code == 422
        body = response.json()
        assert body["detail"] == (
            "invalid request: domain: no domain 'fjord' is served here; choose one of: default, harbour"
        )
        assert body["errors"][0]["loc"] == ["body", "domain"]
    too_long = client.post("/ask", json={"question": "q", "domain": "x" * 65}).json()
    assert "domain: String should have at most 64 characters" in too_long["detail"]


def test_the_stream_answers_from_the_domain_it_names(client):
    response = client.post("/ask/stream", json={"question": "How much leave?", "domain": "harbour"})
    events = events_of(response.text.splitlines())
    assert events[0][1]["data"]["titles"] == ["kb-leave"]
    assert events[-1][0] == "answer" and events[-1][1]["domain"] == "harbour"


def test_health_and_program_say_which_domains_are_served(client):
    health = client.get("/health").json()
    assert (health["domain"], health["domains"]) == ("default", ["default", "harbour"])
    default = client.get("/program").json()
    assert (default["domain"], default["domains"]) == ("default", ["default", "harbour"])
    harbour = client.get("/program", params={"domain": "harbour"}).json()
    assert (harbour["domain"], harbour["domains"]) == ("harbour", ["default", "harbour"])
    unknown = client.get("/program", params={"domain": "fjord"})
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["loc"] == ["query", "domain"]
    assert "choose one of: default, harbour" in unknown.json()["detail"]


def test_one_program_says_its_one_domain():
    client = local_client(create_app(make_service()))
    assert client.get("/health").json()["domains"] == ["default"]
    assert client.post("/ask", json={"question": "range?", "domain": "default"}).json()["domain"] == "default"


def test_the_domains_share_one_queue():
    """One place in the queue: a question to one domain running makes the other's a 503."""
    release, running = threading.Event(), threading.Event()

    def slow(system: str, user: str):
        running.set()
        assert release.wait(10)
        return harbour_script(system, user)

    app = create_app(
        [make_service(), harbour_service(ScriptedLM(slow))], ServePolicy(workers=1, queue=1, rate_limit=None)
    )
    client = local_client(app)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(client.post("/ask", json={"question": "leave?", "domain": "harbour"}))
    )
    worker.start()
    try:
        assert running.wait(10)
        busy = client.post("/ask", json={"question": "range?"})
        assert busy.status_code == 503 and "busy" in busy.json()["detail"]
    finally:
        release.set()
        worker.join(10)
    assert results[0].status_code == 200


def test_the_domains_share_one_rate_limit():
    client = local_client(create_app([make_service(), harbour_service()], ServePolicy(rate_limit="2/minute")))
    codes = [
        client.post("/ask", json={"question": "q", "domain": d}).status_code
        for d in ("default", "harbour", "harbour")
    ]
    assert codes == [200, 200, 429]


def test_two_programs_on_one_domain_are_refused_naming_both():
    with pytest.raises(
        ValueError, match="two programs are for domain 'default'.*serve one program per domain"
    ):
        Domains([make_service(), make_service()])
    with pytest.raises(ValueError, match="at least one program"):
        Domains([])
    with pytest.raises(UnknownDomain) as info:
        Domains([make_service()]).choose("harbour")
    assert info.value.known == ["default"]


# --- the command line ---------------------------------------------------------------------------------
def test_program_is_repeatable_for_serve_and_a_folder_gives_its_programs_by_name(tmp_path):
    folder = tmp_path / "programs"
    folder.mkdir()
    for name in ("b.json", "a.json"):
        (folder / name).write_text("{}", encoding="utf-8")
    (folder / "notes.txt").write_text("not a program", encoding="utf-8")
    args = build_parser().parse_args(["--program", str(tmp_path / "x.json"), "--program", str(folder)])
    assert program_paths(args.program) == [tmp_path / "x.json", folder / "a.json", folder / "b.json"]
    assert program_paths(None) == [None]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProgramError, match="holds no program JSON"):
        program_paths([tmp_path / "empty"])


def test_a_link_out_of_a_program_folder_is_refused_and_one_inside_it_is_taken(tmp_path, capsys):
    # A folder of programs may come from an archive: "b.json -> /etc/passwd" was opened and parsed.
    folder = tmp_path / "programs"
    folder.mkdir()
    (folder / "a.json").write_text("{}", encoding="utf-8")
    (folder / "alias.json").symlink_to(folder / "a.json")  # inside the folder: a program like any other
    assert program_paths([folder]) == [folder / "a.json", folder / "alias.json"]
    (tmp_path / "secret.json").write_text('{"password": "hunter2"}', encoding="utf-8")
    (folder / "b.json").symlink_to(tmp_path / "secret.json")
    message = (
        f"--program {folder}: {folder / 'b.json'}: a link to a file outside the program folder "
        f"({tmp_path / 'secret.json'}): not read; copy the file into the folder instead of linking to it"
    )
    with pytest.raises(ProgramError) as info:
        program_paths([folder])
    assert str(info.value) == message
    assert serve_main(["--program", str(folder)]) == 2
    err = capsys.readouterr().err
    assert message in err and "hunter2" not in err


def _compiled(tmp_path, data, name: str):
    write_domain(data / name)
    (data / name / "domain.toml").write_text(f'name = "{name}"\nk = 3\n', encoding="utf-8")
    compiled = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.12, upper=0.83))
    return save_program(compiled, tmp_path / f"{name}.json", {"domain": name})


def test_serve_loads_one_program_per_domain_each_on_its_own_collections(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setattr("crag_dspy.settings.DEFAULT_DATA_DIR", data)  # the bundled domains
    first, second = _compiled(tmp_path, data, "harbour"), _compiled(tmp_path, data, "fjord")
    argv = ["--program", str(first), "--program", str(second), "--chroma-path", str(tmp_path / "chroma")]
    loaded = load_programs(build_parser().parse_args(argv), lm=ScriptedLM(harbour_script), progress=False)
    assert [(p.domain, p.path) for p in loaded] == [("harbour", first), ("fjord", second)]
    assert [p.crag.retriever.name for p in loaded] == ["chroma:harbour__kb", "chroma:fjord__kb"]
    domains = Domains([ProgramService(p) for p in loaded])
    assert domains.names == ["harbour", "fjord"] and domains.default.loaded.domain == "harbour"


def test_serve_refuses_a_domain_flag_with_several_programs_and_two_programs_of_one_domain(
    tmp_path, monkeypatch, capsys
):
    data = tmp_path / "data"
    monkeypatch.setattr("crag_dspy.settings.DEFAULT_DATA_DIR", data)
    first = _compiled(tmp_path, data, "harbour")
    argv = ["--program", str(first), "--program", str(first), "--chroma-path", str(tmp_path / "chroma")]
    assert serve_main([*argv, "--domain", "harbour"]) == 2
    assert "--domain/--domain-dir name one domain, and 2 programs were given" in capsys.readouterr().err
    # Refused before the server listens: the LM is a dead address that is never called here.
    assert serve_main([*argv, "--lm", "openai/none", "--lm-api-base", "http://127.0.0.1:9/v1"]) == 2
    assert "two programs are for domain 'harbour' (harbour.json and harbour.json)" in capsys.readouterr().err
