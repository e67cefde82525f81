"""A CRAG over a folder of files from Python (crag_dspy.ingest, crag_dspy.from_documents): real
loaders, embeddings and embedded Chroma, a scripted LM."""

import shutil
from pathlib import Path

import pytest
from fakes import ScriptedLM, field

import crag_dspy
from crag_dspy.domain import DomainDataError
from crag_dspy.loaders import UnreadableDocumentError
from crag_dspy.settings import Settings

PDF = Path(__file__).parent / "fixtures" / "ferry-handbook.pdf"
FACT = "23:40 from pier four"


def script(system: str, user: str):
    if "You judge search results" in system:
        return 0.9 if FACT in field(user, "document") else 0.05
    if "You judge short knowledge strips" in system:
        return 0.9 if FACT in field(user, "strip") else 0.05
    if "Answer the question" in system:
        return {"answer": "23:40" if FACT in field(user, "context") else "I don't know"}
    raise AssertionError(f"unexpected prompt (no web search is configured): {system[:80]}")


@pytest.fixture
def folder(tmp_path) -> Path:
    docs = tmp_path / "handbooks"
    (docs / "ferries").mkdir(parents=True)
    shutil.copy(PDF, docs / "ferries" / "handbook.pdf")
    (docs / "piers.md").write_text("# Piers\n\n## Pier four\n\nPier four has a kiosk and a waiting room.\n")
    (docs / "notes.xlsx").write_bytes(b"not a document")
    return docs


def test_from_documents_answers_from_a_folder_with_a_citation_and_ingests_once(folder, tmp_path):
    settings = Settings(chroma_path=tmp_path / "chroma")
    lm = ScriptedLM(script)
    crag = crag_dspy.from_documents(folder, lm=lm, settings=settings, progress=False)
    pred = crag(question="When does the night crossing to Velm Island leave?")
    assert pred.answer == "23:40" and pred.action == "CORRECT"
    assert [c.label for c in pred.citations] == ["ferries/handbook.pdf, p. 1"]
    assert crag.web_search.name == "none" and pred.trace.web_query is None

    again = crag_dspy.ingest(folder, settings=settings, progress=False)  # the same folder: nothing new
    assert (again.report.added, again.report.removed) == (0, 0) and again.report.documents == 2
    assert (
        again.name.startswith("handbooks-") and len(again.skipped) == 1 and "notes.xlsx" in again.skipped[0]
    )

    (folder / "piers.md").write_text("# Piers\n\nPier two is closed in winter.\n")  # a changed file
    changed = crag_dspy.ingest(folder, settings=settings, progress=False)
    assert changed.report.added >= 1 and changed.report.removed >= 1 and changed.name == again.name


def test_two_folders_of_the_same_name_get_their_own_collections(tmp_path):
    first, second = tmp_path / "a" / "docs", tmp_path / "b" / "docs"
    for path, text in ((first, "Alpha notes about pumps."), (second, "Beta notes about valves.")):
        path.mkdir(parents=True)
        (path / "note.md").write_text(f"# Note\n\n{text}\n")
    settings = Settings(chroma_path=tmp_path / "chroma")
    names = {crag_dspy.ingest(p, settings=settings, progress=False).name for p in (first, second)}
    assert len(names) == 2


def test_bad_input_is_a_clear_error_naming_what_is_wrong(tmp_path):
    settings = Settings(chroma_path=tmp_path / "chroma")
    with pytest.raises(DomainDataError, match="no such file or folder"):
        crag_dspy.ingest(tmp_path / "missing", settings=settings)
    with pytest.raises(DomainDataError, match="no documents given"):
        crag_dspy.ingest([], settings=settings)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4 truncated")
    with pytest.raises(UnreadableDocumentError, match="broken.pdf"):  # named directly: an error
        crag_dspy.ingest(broken, settings=settings)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "sheet.xlsx").write_bytes(b"x")
    with pytest.raises(UnreadableDocumentError, match="every file was unreadable: .*sheet.xlsx"):
        crag_dspy.ingest(empty, settings=settings)
