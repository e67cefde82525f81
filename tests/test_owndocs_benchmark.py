"""The owndocs benchmark (benchmarks/owndocs) holds its rules: counts, formats, split by document, every
alias and quote found in its evidence. The checks are benchmarks/owndocs/verify.py's; the mutation tests
show that they do catch a broken benchmark."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "benchmarks" / "owndocs"

pytest.importorskip("pypdf")
pytest.importorskip("trafilatura")
pytest.importorskip("docx")


def _load_verify():
    spec = importlib.util.spec_from_file_location("owndocs_verify", ROOT / "verify.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


verify = _load_verify()


@pytest.fixture(scope="module")
def report():
    return verify.check()


def test_benchmark_passes_every_check(report):
    assert report.failures == [], "\n".join(report.failures)


def test_counts_and_formats():
    docs = verify.corpus_files()
    formats = [verify.fmt(d) for d in docs]
    assert len(docs) >= 28
    for name, least in verify.MIN_FORMAT.items():
        assert formats.count(name) >= least, name
    tools = {row["tool"].lower() for row in verify.read_sources().values()}
    assert len(tools) >= 12
    qa = verify.read_qa()
    assert len(qa) >= 130
    assert sum(q["kind"] == "none" for q in qa) / len(qa) >= 0.15
    assert sum(q["kind"] == "kb" for q in qa) >= 110


def test_split_is_by_document():
    splits = json.loads((ROOT / "splits.json").read_text(encoding="utf-8"))
    seen: dict[str, set[str]] = {}
    for q in verify.read_qa():
        for ev in q.get("evidence", []):
            seen.setdefault(ev["doc_id"], set()).add(q["split"])
            assert q["split"] == splits[ev["doc_id"]], q["id"]
    assert all(len(s) == 1 for s in seen.values())
    for split in ("val", "test"):
        assert {verify.fmt(d) for d, s in splits.items() if s == split} == set(verify.MIN_FORMAT)


def test_domain_loads_with_the_project_loader():
    from crag_dspy.domain import load_domain

    domain = load_domain(ROOT)
    assert domain.config.name == "owndocs"
    assert not domain.skipped
    assert len(domain.corpus) == len(verify.corpus_files())
    assert len(domain.qa) == len(verify.read_qa())


def _check_with(monkeypatch, qa: list[dict]) -> list[str]:
    monkeypatch.setattr(verify, "read_qa", lambda: qa)
    return verify.check(load_words=False).failures


def test_a_wrong_alias_is_caught(monkeypatch):
    qa = copy.deepcopy(verify.read_qa())
    target = next(q for q in qa if q["kind"] == "kb")
    target["answers"] = ["certainly-not-in-the-document-42"]
    failures = _check_with(monkeypatch, qa)
    assert any(target["id"] in f and "no alias" in f for f in failures)


def test_a_wrong_page_or_quote_is_caught(monkeypatch):
    qa = copy.deepcopy(verify.read_qa())
    pdf_q = next(q for q in qa if q["kind"] == "kb" and "page" in q["evidence"][0])
    pdf_q["evidence"][0]["page"] = 999
    other = next(q for q in qa if q["kind"] == "kb" and "page" not in q["evidence"][0])
    other["evidence"][0]["quote"] = "a sentence that no document contains"
    failures = _check_with(monkeypatch, qa)
    assert any(pdf_q["id"] in f and "page" in f for f in failures)
    assert any(other["id"] in f and "quote" in f for f in failures)


def test_a_split_leak_and_a_bad_unanswerable_are_caught(monkeypatch):
    qa = copy.deepcopy(verify.read_qa())
    leak = next(q for q in qa if q["kind"] == "kb" and q["split"] == "val")
    leak["split"] = "test"
    none = next(q for q in qa if q["kind"] == "none")
    none["answers"] = ["42"]
    failures = _check_with(monkeypatch, qa)
    assert any(leak["id"] in f and "split" in f for f in failures)
    assert any(none["id"] in f and "unanswerable" in f for f in failures)
