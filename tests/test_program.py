"""Program JSON: save, load in a fresh process, and clear errors for every bad file."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM

from crag_dspy import CRAG
from crag_dspy.app import load_program
from crag_dspy.config import CRAGConfig
from crag_dspy.program import (
    PROGRAM_FORMAT_VERSION,
    ProgramError,
    apply_program,
    read_program,
    save_program,
)

TESTS = Path(__file__).parent


def compiled_crag() -> CRAG:
    crag = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.12, upper=0.83, k=4, max_strips=3))
    crag.grader.predict.demos = [
        dspy.Example(question="q1", document="d1", relevant=True).with_inputs("question", "document"),
        dspy.Example(question="q2", document="d2", relevant=False).with_inputs("question", "document"),
    ]
    crag.answerer.signature = crag.answerer.signature.with_instructions("Answer tersely from the context.")
    return crag


def test_save_writes_one_json_with_state_thresholds_and_metadata(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default", "seed": 3})
    doc = json.loads(path.read_text())
    assert doc["format"] == "crag-dspy-program" and doc["metadata"] == {"domain": "default", "seed": 3}
    assert doc["state"]["thresholds"] == {"lower": 0.12, "upper": 0.83}
    assert len(doc["state"]["grader.predict"]["demos"]) == 2  # the compiled sub-module's demos did not vanish
    assert doc["config"]["k"] == 4 and doc["dspy_version"] == dspy.__version__


def test_per_type_thresholds_round_trip_through_the_program_json(tmp_path):
    crag = compiled_crag()
    crag.thresholds.load_state({"lower": 0.3, "upper": 0.7, "by_type": {"person": [0.2, 0.45]}})
    path = save_program(crag, tmp_path / "p.json", {"domain": "default"})
    assert json.loads(path.read_text())["state"]["thresholds"]["by_type"] == {"person": [0.2, 0.45]}
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), read_program(path), tmp_path)
    assert loaded.thresholds.by_type == {"person": (0.2, 0.45)}
    assert loaded.thresholds.for_question("Who founded it?") == (0.2, 0.45, "person")
    # The trace shows which pair routed a question.
    run = loaded.new_run("Who founded it?")
    assert (run.trace.lower, run.trace.upper, run.trace.question_type) == (0.2, 0.45, "person")
    assert loaded.new_run("What is it?").trace.question_type == "other"


LOADER = """
import json, sys
sys.path.insert(0, {tests!r})
from crag_dspy.app import load_program
from crag_dspy.routing import decide_action
from fakes import ListRetriever, ListWebSearch, ScriptedLM
crag = load_program({path!r}, retriever=ListRetriever([]), web_search=ListWebSearch(), lm=ScriptedLM(lambda s, u: 0.5))
print(json.dumps({{
    "state": crag.dump_state(),
    "k": crag.config.k, "max_strips": crag.config.max_strips,
    "routes": [decide_action(s, crag.thresholds.lower, crag.thresholds.upper).value for s in ([0.1], [0.5], [0.9])],
}}))
"""


def test_round_trip_in_a_fresh_process(tmp_path):
    original = compiled_crag()
    path = save_program(original, tmp_path / "p.json", {"domain": "default"})
    out = subprocess.run(
        [sys.executable, "-c", LOADER.format(tests=str(TESTS), path=str(path))],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["state"] == json.loads(json.dumps(original.dump_state()))
    assert (loaded["k"], loaded["max_strips"]) == (4, 3)
    assert loaded["routes"] == ["INCORRECT", "AMBIGUOUS", "CORRECT"]


def test_loaded_program_behaves_like_the_saved_one(tmp_path):
    original = compiled_crag()
    path = save_program(original, tmp_path / "p.json", {"domain": "default"})
    lm = ScriptedLM(lambda s, u: 0.5 if "judge" in s else {"answer": "x", "query": "q"})
    texts = [("kb-1", "One fact here.")]
    fresh = load_program(path, retriever=ListRetriever(texts), web_search=ListWebSearch(), lm=lm)
    original.retriever, original.lm = ListRetriever(texts), lm
    assert fresh(question="q").action == original(question="q").action == "AMBIGUOUS"
    first, second = lm.calls[: len(lm.calls) // 2], lm.calls[len(lm.calls) // 2 :]
    assert first == second  # identical prompts, demos included


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.json", '{"format": "crag-dspy-program", "format_', "corrupt or truncated"),
        ("p.json", "[1, 2]", "not a crag-dspy program"),
        (
            "p.json",
            '{"format": "crag-dspy-program", "format_version": 99}',
            (
                f"format version 99; this crag-dspy reads version {PROGRAM_FORMAT_VERSION} only. Recompile it: "
                "python -m optimize.compile --domain <domain>"
            ),
        ),
        (
            "p.json",
            f'{{"format": "crag-dspy-program", "format_version": {PROGRAM_FORMAT_VERSION}, "state": {{}}}}',
            "missing its 'config'",
        ),
        ("p.pkl", pickle.dumps({"a": 1}), "never loaded"),
        ("p.json", pickle.dumps({"a": 1}), "this is a pickle"),
        ("missing.json", None, "cannot read program"),
    ],
)
def test_bad_program_files_are_clear_errors(tmp_path, name, content, message):
    path = tmp_path / name if content is None else _write(tmp_path, name, content)
    with pytest.raises(ProgramError, match=message):
        read_program(path)


def test_programs_of_earlier_formats_are_refused_with_how_to_recompile(tmp_path):
    crag = compiled_crag()
    crag.grader.calibration.load_state({"slope": 1.3, "intercept": -6.1, "weights": {"term_coverage": 6.9}})
    path = save_program(crag, tmp_path / "p.json", {"domain": "hr"})
    doc = read_program(path)
    assert doc["format_version"] == PROGRAM_FORMAT_VERSION == 6
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.calibration.weights == {
        "term_coverage": 6.9
    }
    for old in (2, 3, 4, 5):
        doc["format_version"] = old
        path.write_text(json.dumps(doc))
        with pytest.raises(
            ProgramError, match=f"format version {old};.*python -m optimize.compile --domain hr"
        ):
            read_program(path)


def test_other_domain_is_refused(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "hr"})
    with pytest.raises(ProgramError, match="compiled for domain 'hr', not 'default'"):
        read_program(path, domain="default")


def test_state_of_another_structure_is_refused_and_leaves_the_module_untouched(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"})
    doc = read_program(path)
    del doc["state"]["rewriter"]
    target = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match="lacks \\['rewriter'\\]"):
        apply_program(target, doc)
    doc = read_program(path)
    doc["state"]["thresholds"] = {"lower": 0.9, "upper": 0.1}
    with pytest.raises(ProgramError, match="does not fit"):
        apply_program(target, doc)
    assert (target.thresholds.lower, target.thresholds.upper) == (0.3, 0.7)
    assert target.grader.predict.demos == []


def test_the_config_travels_with_the_program_as_is(tmp_path):
    crag = compiled_crag()
    crag.config = crag.config.replace(answer_units=False, internal_retries=2, grader_view={"sentences": 2})
    crag.thresholds.load_state({"lower": 0.2, "upper": 0.6})
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"] == {**crag.config.model_dump(mode="json"), "lower": 0.2, "upper": 0.6}
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc)
    assert loaded.config == crag.config.replace(lower=0.2, upper=0.6)
    assert loaded.grader.view.sentences == 2
    assert (loaded.thresholds.lower, loaded.thresholds.upper) == (0.2, 0.6)


def test_the_app_keeps_its_own_lm_calls(tmp_path):
    crag = compiled_crag()
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    app = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lm_calls={"retries": 0, "use_logprobs": False}))
    loaded = apply_program(app, doc)
    assert loaded.config.lm_calls.retries == 0 and loaded.grader.use_logprobs is False
    assert loaded.config.k == 4  # everything else is the program's


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"answer_units": "maybe"}, "answer_units"),
        ({"fallback_web_strips": 1}, "fallback_web_strips"),  # a removed setting is not silently ignored
        ({"lower": 0.9, "upper": 0.1}, "must not exceed upper"),
        ({"grader_view": {"sentences": -1}}, "sentences"),
    ],
)
def test_an_invalid_config_is_refused_and_leaves_the_module_untouched(tmp_path, change, message):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc["config"].update(change)
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match=f"(?s)program config is invalid.*{message}"):
        apply_program(fresh, doc)
    assert fresh.config == CRAGConfig() and fresh.grader.predict.demos == []


def test_a_program_nested_too_deeply_is_a_clear_error(tmp_path):
    path = _write(
        tmp_path, "p.json", '{"format": "crag-dspy-program", "state": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(ProgramError, match="p.json: corrupt program JSON: nested too deeply"):
        read_program(path)
