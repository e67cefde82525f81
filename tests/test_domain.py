import json
import os
from collections import Counter
from pathlib import Path

import pytest

from crag_dspy.domain import DomainDataError, QAPair, load_domain, load_jsonl
from optimize.metrics import normalize_answer

DEFAULT = Path(__file__).resolve().parent.parent / "data" / "default"


@pytest.fixture(scope="module")
def default():
    return load_domain(DEFAULT)


def test_default_domain_meets_the_size_floor(default):
    assert default.name == "default"
    assert len(default.corpus) >= 60 and len(default.web) >= 60
    assert len(default.qa) >= 150 and len(default.relevance) >= 400
    assert all(len(d.text.split("\n\n")) >= 3 for d in default.corpus)  # multi-paragraph documents
    kinds = Counter(q.kind for q in default.qa)
    assert kinds["kb"] and kinds["web"] and kinds["both"] and kinds["none"]
    assert {q.split for q in default.qa} == {"train", "val", "test"}


def test_default_qa_evidence_is_real(default):
    docs = {d.id: d.text for d in [*default.corpus, *default.web]}
    for q in default.qa:
        if q.kind == "none":
            assert q.answers == ["I don't know"] and not q.evidence
            continue
        quotes = [e["quote"] for e in q.evidence]
        for e in q.evidence:
            assert e["quote"] in docs[e["doc_id"]], q.id
        assert any(normalize_answer(q.answers[0]) in normalize_answer(x) for x in quotes), q.id


def test_default_relevance_is_balanced_and_free_of_test_questions(default):
    test_questions = {q.question for q in default.qa if q.split == "test"}
    for split in ("train", "val"):
        labels = Counter(p.label for p in default.relevance if p.split == split)
        assert labels[0] == labels[1] > 50
    assert not test_questions & {p.question for p in default.relevance}


def test_web_corpus_has_urls_and_kb_does_not_leak_into_it(default):
    assert all(d.url for d in default.web)
    assert not {d.id for d in default.corpus} & {d.id for d in default.web}


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_malformed_line_names_file_and_line(tmp_path):
    write(tmp_path, "corpus.jsonl", ['{"id": "a", "title": "A", "text": "x"}', "", "{not json"])
    with pytest.raises(DomainDataError, match=r"corpus.jsonl:3: not valid JSON"):
        load_domain(tmp_path)


def test_missing_field_names_the_field(tmp_path):
    write(tmp_path, "corpus.jsonl", ['{"id": "a", "text": "x"}'])
    with pytest.raises(DomainDataError, match=r"corpus.jsonl:1: title: Field required"):
        load_domain(tmp_path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "q", "question": "?", "answers": [], "split": "train"}', "answers"),
        ('{"id": "q", "question": "?", "answers": ["x"], "split": "dev"}', "split"),
        ('{"id": "q", "question": "  ", "answers": ["x"], "split": "train"}', "question"),
    ],
)
def test_qa_validation(tmp_path, line, message):
    path = write(tmp_path, "qa.jsonl", [line])
    with pytest.raises(DomainDataError, match=rf"qa.jsonl:1: {message}"):
        load_jsonl(path, QAPair)


def test_empty_and_missing_corpus(tmp_path):
    with pytest.raises(DomainDataError, match="no corpus.jsonl"):
        load_domain(tmp_path)
    write(tmp_path, "corpus.jsonl", [""])
    with pytest.raises(DomainDataError, match="corpus is empty"):
        load_domain(tmp_path)
    with pytest.raises(DomainDataError, match="not found"):
        load_domain(tmp_path / "nope")


def test_duplicate_ids_and_bad_toml(tmp_path):
    doc = json.dumps({"id": "a", "title": "A", "text": "x"})
    write(tmp_path, "corpus.jsonl", [doc, doc])
    with pytest.raises(DomainDataError, match="duplicate document id 'a'"):
        load_domain(tmp_path)
    write(tmp_path, "corpus.jsonl", [doc])
    write(tmp_path, "domain.toml", ['name = "bad name!"'])
    with pytest.raises(DomainDataError, match="domain.toml") as raised:
        load_domain(tmp_path)
    # One line naming the field and the value, not pydantic's multi-line text with its links.
    message = str(raised.value)
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert "domain.toml: name: " in message and "(got 'bad name!')" in message


def test_domain_files_starting_with_a_utf8_byte_order_mark_are_read(tmp_path):
    # Editors on Windows write one; it is no part of the first record.
    doc = json.dumps({"id": "a", "title": "A", "text": "Staff get 25 days."})
    (tmp_path / "corpus.jsonl").write_text("\ufeff" + doc + "\n", encoding="utf-8")
    (tmp_path / "domain.toml").write_text('\ufeffname = "leave"\n', encoding="utf-8")
    domain = load_domain(tmp_path)
    assert domain.name == "leave" and [d.id for d in domain.corpus] == ["a"]


def test_text_folder_corpus(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "policy.md").write_text("# Leave policy\n\nStaff get 25 days.\n", encoding="utf-8")
    domain = load_domain(tmp_path)
    assert domain.corpus[0].title == "Leave policy" and domain.config.name == tmp_path.name.strip("-_")[:42]


@pytest.mark.parametrize("name", ["corpus", "corpus.jsonl", "web.jsonl", "qa.jsonl", "domain.toml"])
def test_a_domain_file_or_corpus_folder_that_links_out_of_the_domain_folder_is_refused(tmp_path, name):
    # Domain folders come from uploads and archives: "corpus -> /" would make every file a quotable document.
    secret = tmp_path / "elsewhere"
    (secret / "corpus").mkdir(parents=True)
    (secret / "corpus" / "secret.txt").write_text("Secret\n\nThe root password is hunter2.\n")
    doc = json.dumps({"id": "a", "title": "A", "text": "Staff get 25 days."})
    for file in ("corpus.jsonl", "web.jsonl", "qa.jsonl", "domain.toml"):
        (secret / file).write_text(doc + "\n" if file != "domain.toml" else 'name = "other"\n')
    domain = tmp_path / "domain"
    domain.mkdir()
    if name not in ("corpus", "corpus.jsonl"):
        (domain / "corpus").mkdir()
        (domain / "corpus" / "own.txt").write_text("Own\n\nStaff get 25 days.\n")
    (domain / name).symlink_to(secret / name)
    message = f"{domain / name}: a link to a .* outside the domain folder .*: not read; copy the"
    for lazy in (False, True):
        with pytest.raises(DomainDataError, match=message):
            load_domain(domain, lazy=lazy)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("name", ["domain.toml", "corpus.jsonl", "web.jsonl"])
def test_a_domain_file_that_is_a_named_pipe_is_named_never_opened_nor_passed_over(tmp_path, name):
    # A FIFO domain.toml gave the default settings without a word; a FIFO corpus.jsonl was "no corpus.jsonl".
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "own.txt").write_text("Own\n\nStaff get 25 days.\n")
    os.mkfifo(tmp_path / name)  # opened, it would block the load for ever
    for lazy in (False, True):
        with pytest.raises(DomainDataError) as info:
            load_domain(tmp_path, lazy=lazy)
        assert str(info.value) == f"{tmp_path / name}: not a regular file (a named pipe): not read"


def test_a_link_that_stays_inside_the_domain_folder_is_read(tmp_path):
    (tmp_path / "data" / "docs").mkdir(parents=True)
    (tmp_path / "data" / "docs" / "policy.md").write_text("# Leave\n\nStaff get 25 days.\n")
    (tmp_path / "data" / "corpus").symlink_to(Path("docs"), target_is_directory=True)
    assert [d.id for d in load_domain(tmp_path / "data").corpus] == ["policy.md"]


def test_corpus_jsonl_and_a_corpus_folder_together_warn_which_one_is_read(tmp_path, caplog):
    write(tmp_path, "corpus.jsonl", [json.dumps({"id": "a", "title": "A", "text": "Staff get 25 days."})])
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "policy.md").write_text("# Leave\n\nStaff get 30 days.\n")
    with caplog.at_level("WARNING", logger="crag_dspy.domain"):
        assert [d.id for d in load_domain(tmp_path).corpus] == ["a"]
    assert "both corpus.jsonl and corpus/ are present: corpus.jsonl is read and corpus/ is not" in caplog.text


DEEP = "[" * 100_000 + "]" * 100_000  # nested far past Python's recursion limit


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "corpus.jsonl",
            '{"id": "a", "title": "A", "text": "x"}\n' + DEEP,
            r"corpus.jsonl:2: nested too deeply",
        ),
        ("qa.jsonl", DEEP, r"qa.jsonl:1: nested too deeply"),
        ("domain.toml", "name = " + DEEP, r"domain.toml: nested too deeply"),
        (
            "domain.toml",
            b'name = "caf\xe9"\n',
            r"domain.toml: not UTF-8 text \(invalid continuation byte at byte 11\)",
        ),
        ("corpus/policy.md", b"# Leave\n\nStaff get 25 days \xff.\n", r"corpus/policy.md: not UTF-8 text"),
        (
            "web.jsonl",
            b'{"id": "w", "title": "W", "text": "\xff", "url": "u"}\n',
            r"web.jsonl: not UTF-8 text",
        ),
    ],
)
def test_deep_nesting_and_undecodable_files_are_errors_naming_the_file(tmp_path, name, content, message):
    if not name.startswith("corpus"):
        write(tmp_path, "corpus.jsonl", ['{"id": "a", "title": "A", "text": "x"}'])
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DomainDataError, match=message) as info:
        load_domain(tmp_path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_lazy_domain_reads_each_file_on_first_use_and_reports_its_errors_there(tmp_path):
    write(tmp_path, "corpus.jsonl", ['{"id": "a", "title": "A", "text": "x"}', "{not json"])
    write(tmp_path, "qa.jsonl", ['{"id": "q", "question": "Q?", "answers": ["x"], "split": "test"}'])
    domain = load_domain(tmp_path, lazy=True)  # only domain.toml (absent here) is read
    assert domain.has_corpus and not domain.has_web and len(domain.qa) == 1
    with pytest.raises(DomainDataError, match=r"corpus.jsonl:2: not valid JSON"):
        domain.corpus  # noqa: B018
    (tmp_path / "corpus.jsonl").unlink()
    assert not load_domain(tmp_path, lazy=True).has_corpus
    with pytest.raises(DomainDataError, match="no corpus.jsonl"):
        load_domain(tmp_path, lazy=True).corpus  # noqa: B018


def test_the_source_keys_name_the_files_read_never_documents_given_by_the_caller(tmp_path):
    import dataclasses
    import os

    from crag_dspy.domain import CorpusDoc

    corpus = write(tmp_path, "corpus.jsonl", ['{"id": "a", "title": "A", "text": "x"}'])
    domain = load_domain(tmp_path, lazy=True)
    source = domain.source("kb")
    assert source.name == "corpus.jsonl" and source.sha256 == domain.file_hashes()["corpus.jsonl"]
    assert domain.source("web") is None  # no web.jsonl
    stat, sha = source.stat_key, source.sha256
    os.utime(corpus, ns=(1, 1))
    touched = load_domain(tmp_path, lazy=True).source("kb")
    assert touched.stat_key != stat and touched.sha256 == sha  # times differ, content does not
    # A corpus swapped in by the caller (benchmarks inject documents) is not the files': no key.
    swapped = dataclasses.replace(domain, corpus=[CorpusDoc(id="b", title="B", text="y")])
    assert swapped.source("kb") is None and swapped.web == []
    (tmp_path / "corpus").mkdir()
    corpus.unlink()
    (tmp_path / "corpus" / "a.md").write_text("# A\n\nx\n", encoding="utf-8")
    folder = load_domain(tmp_path, lazy=True).source("kb")
    assert folder.name == "corpus/" and folder.paths == (tmp_path / "corpus" / "a.md",)


def test_a_folder_with_a_short_name_and_no_domain_toml_gets_a_valid_domain_name(tmp_path):
    for folder, name in (("d", "domain-d"), ("é", "domain"), ("ab", "domain-ab"), ("abc", "abc")):
        root = tmp_path / folder
        root.mkdir()
        (root / "corpus.jsonl").write_text('{"id": "a", "title": "A", "text": "Some text."}\n')
        assert load_domain(root).name == name
