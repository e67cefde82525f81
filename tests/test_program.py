"""Program JSON: save, load in a fresh process, and clear errors for every bad file."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from fakes import NO_LM, ListRetriever, ListWebSearch, ScriptedLM
from pydantic import ValidationError

from crag_dspy import CRAG
from crag_dspy.app import load_program
from crag_dspy.config import CRAGConfig, describe_validation_error
from crag_dspy.program import (
    PROGRAM_FORMAT_VERSION,
    ProgramError,
    apply_program,
    read_program,
    save_program,
)
from crag_dspy.program_file import CalibrationState

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
    metadata = doc["metadata"]
    assert metadata["format"] == "crag-dspy-program" and metadata["format_version"] == PROGRAM_FORMAT_VERSION
    assert (metadata["domain"], metadata["seed"]) == ("default", 3)
    # DSPy's save format: each parameter's state at the top level, DSPy's dependency versions in metadata.
    assert doc["thresholds"] == {"lower": 0.12, "upper": 0.83}
    assert len(doc["grader.predict"]["demos"]) == 2  # the compiled sub-module's demos did not vanish
    assert doc["config"]["k"] == 4 and metadata["dependency_versions"]["dspy"] == dspy.__version__


def test_per_type_thresholds_round_trip_through_the_program_json(tmp_path):
    crag = compiled_crag()
    crag.thresholds.load_state({"lower": 0.3, "upper": 0.7, "by_type": {"person": [0.2, 0.45]}})
    path = save_program(crag, tmp_path / "p.json", {"domain": "default"})
    assert json.loads(path.read_text())["thresholds"]["by_type"] == {"person": [0.2, 0.45]}
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), read_program(path), tmp_path)
    assert loaded.thresholds.by_type == {"person": (0.2, 0.45)}
    assert loaded.thresholds.for_question("Who founded it?") == (0.2, 0.45, "person")
    # The trace shows which pair routed a question.
    run = loaded.new_run("Who founded it?")
    assert (run.trace.lower, run.trace.upper, run.trace.question_type) == (0.2, 0.45, "person")
    assert loaded.new_run("What is it?").trace.question_type == "other"


def test_a_program_saved_with_the_answerers_old_input_order_loads_each_field_by_name(tmp_path):
    # Programs saved before the answerer read its context first list (question, context); DSPy restores
    # fields by position, which would give the context the question's description and the reverse.
    state = compiled_crag().dump_state()
    fields = state["answerer"]["signature"]["fields"]
    assert [f["prefix"] for f in fields] == ["Context:", "Question:", "Answer:"]
    state["answerer"]["signature"]["fields"] = [fields[1], fields[0], fields[2]]
    loaded = CRAG(ListRetriever([]), ListWebSearch()).load_state(state)
    signature = loaded.answerer.signature
    assert list(signature.input_fields) == ["context", "question"]
    assert signature.input_fields["context"].json_schema_extra["desc"].startswith("refined knowledge strips")
    assert signature.input_fields["question"].json_schema_extra["prefix"] == "Question:"
    assert signature.instructions == "Answer tersely from the context."
    # A rewritten prefix cannot be matched: DSPy's positional order stands.
    fields[2] = {**fields[2], "prefix": "Short answer:"}
    state["answerer"]["signature"]["fields"] = [fields[1], fields[0], fields[2]]
    loaded = CRAG(ListRetriever([]), ListWebSearch()).load_state(state)
    assert loaded.answerer.signature.input_fields["context"].json_schema_extra["prefix"] == "Question:"


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
            '{"answerer": {}, "metadata": {"dependency_versions": {}}}',
            "a DSPy save of another module",
        ),
        (
            "p.json",
            '{"metadata": {"format": "crag-dspy-program", "format_version": 99, "domain": "hr"}}',
            "format version 99; .* Recompile it: crag-dspy compile --domain hr",
        ),
        (
            "p.json",
            '{"format": "crag-dspy-program", "format_version": 99}',
            (
                f"format version 99; this crag-dspy reads version {PROGRAM_FORMAT_VERSION} only. Recompile it: "
                "crag-dspy compile --domain <domain>"
            ),
        ),
        (
            "p.json",
            f'{{"metadata": {{"format": "crag-dspy-program", "format_version": {PROGRAM_FORMAT_VERSION}}}}}',
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
    assert doc["metadata"]["format_version"] == PROGRAM_FORMAT_VERSION == 7
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.calibration.weights == {
        "term_coverage": 6.9
    }
    for old in (2, 3, 4, 5, 6):
        doc["metadata"]["format_version"] = old
        path.write_text(json.dumps(doc))
        with pytest.raises(ProgramError, match=f"format version {old};.*crag-dspy compile --domain hr"):
            read_program(path)


def test_other_domain_is_refused(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "hr"})
    with pytest.raises(ProgramError, match="compiled for domain 'hr', not 'default'"):
        read_program(path, domain="default")


def test_state_of_another_structure_is_refused_and_leaves_the_module_untouched(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"})
    doc = read_program(path)
    del doc["rewriter"]
    target = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match="lacks \\['rewriter'\\]"):
        apply_program(target, doc)
    doc = read_program(path)
    doc["thresholds"] = {"lower": 0.9, "upper": 0.1}
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


def test_the_app_keeps_its_own_lm_calls_and_history_limit(tmp_path):
    crag = compiled_crag()
    crag.config = crag.config.replace(max_history_turns=5)
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    app_config = CRAGConfig(lm_calls={"retries": 0, "use_logprobs": False}, max_history_turns=2)
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch(), app_config), doc)
    assert loaded.config.lm_calls.retries == 0 and loaded.grader.use_logprobs is False
    assert loaded.config.max_history_turns == 2  # the app's requests, not the compile's
    assert loaded.config.k == 4  # everything else is the program's
    assert CRAG(ListRetriever([]), ListWebSearch()).load(tmp_path / "p.json").config.max_history_turns == 5


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


# --- the whole file is one schema, checked before anything is applied (issue 26, 1-2) -------------

SHA = "a" * 64


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        ("config", {"k": "five"}, "config.k: Input should be a valid integer.*got 'five'"),
        ("config", {"k": 100000}, "config.k: Input should be less than or equal to 50"),
        ("config", {"sentences_per_strip": 0}, "config.sentences_per_strip: Input should be greater than"),
        ("config", {"max_strips": -1}, "config.max_strips"),
        ("config", {"strip_threshold": 2}, "config.strip_threshold"),
        ("config", {"web_results": "3 please"}, "config.web_results"),
        ("metadata", {"seed": "zero"}, "metadata.seed: Input should be a valid integer"),
        ("metadata", {"stages": "grader"}, "metadata.stages: Input should be a valid list"),
        ("metadata", {"domain": "../../x"}, "metadata.domain: domain '../../x' is not a domain name"),
        ("metadata", {"domain": "/etc"}, "metadata.domain: .*not a domain name.*--domain-dir"),
        (
            "metadata",
            {"dataset_hashes": {"../corpus.jsonl": SHA}},
            "metadata.dataset_hashes: '../corpus.jsonl' is not a file name",
        ),
        (
            "metadata",
            {"dataset_hashes": {"corpus.jsonl": "abc"}},
            "metadata.dataset_hashes: corpus.jsonl: 'abc' is not a sha256",
        ),
        (
            None,
            {"thresholds": {"lower": "low", "upper": 0.7}},
            "thresholds: could not convert string to float",
        ),
        (
            None,
            {"thresholds": {"lower": 0.2, "upper": 1.5}},
            "thresholds: thresholds must satisfy 0 <= lower <= upper <= 1",
        ),
        (None, {"answerer": 5}, "answerer: Input should be a valid dictionary"),
        (None, {"surprise": 1}, "surprise: Input should be a valid dictionary"),  # every state is an object
        ("metadata", {"created": 20260101}, "metadata.created: Input should be a valid string"),
        ("metadata", {"dependency_versions": "3.4"}, "metadata.dependency_versions: Input should be a valid"),
    ],
)
def test_the_whole_program_file_is_checked_when_it_is_read(tmp_path, section, change, message):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    (doc[section] if section else doc).update(change)
    path = _write(tmp_path, "bad.json", json.dumps(doc))
    with pytest.raises(ProgramError, match=f"^{tmp_path / 'bad.json'}: invalid program: {message}") as info:
        read_program(path)
    assert "\n" not in str(info.value)  # one line


def test_read_program_returns_the_validated_document(tmp_path):
    metadata = {"domain": "default", "seed": 3, "dataset_hashes": {"corpus.jsonl": SHA}, "note": "kept"}
    path = save_program(compiled_crag(), tmp_path / "p.json", metadata)
    doc = read_program(path)
    # Other metadata keys are kept as written; save_program adds only the file's own fields.
    assert {key: doc["metadata"][key] for key in metadata} == metadata
    assert set(doc["metadata"]) - set(metadata) == {
        "dependency_versions",
        "format",
        "format_version",
        "crag_dspy_version",
        "created",
    }
    assert doc["config"]["k"] == 4 and doc["thresholds"] == {"lower": 0.12, "upper": 0.83}
    with pytest.raises(ProgramError, match="\\['format_version'\\] are written by save_program itself"):
        save_program(compiled_crag(), tmp_path / "q.json", {**metadata, "format_version": 1})


def test_saving_refuses_metadata_that_reading_would_refuse(tmp_path):
    with pytest.raises(ProgramError, match="metadata is invalid: domain: domain '../x' is not a domain name"):
        save_program(compiled_crag(), tmp_path / "p.json", {"domain": "../x"})
    with pytest.raises(ProgramError, match="metadata is invalid: domain: Field required"):
        save_program(compiled_crag(), tmp_path / "p.json", {"seed": 1})
    assert not (tmp_path / "p.json").exists()


def _ask(argv, chroma):
    from crag_dspy.cli import main

    # An LM nobody listens on: a run that got as far as asking would fail there, not exit 2.
    return main(
        [
            "ask",
            "What is the zeta code?",
            *argv,
            "--chroma-path",
            str(chroma),
            *NO_LM,
        ]
    )


def test_a_bad_program_config_is_one_line_exit_2_before_any_store_is_opened(tmp_path, capsys):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc["config"]["k"] = "five"
    path = _write(tmp_path, "p.json", json.dumps(doc))
    assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: ")
        and err.count("\n") == 1
        and "config.k: Input should be a valid integer" in err
    )
    assert not (tmp_path / "chroma").exists()  # nothing opened, nothing ingested


MANIFEST = {
    "path": "p.evaluator",
    "base_model": "all-MiniLM-L6-v2",
    "max_length": 256,
    "files": {"model.safetensors": {"bytes": 10, "sha256": SHA}},
}
LINEAR = {"weights": {"llm": 1.0}, "intercept": 0.0}


@pytest.mark.parametrize(
    ("key", "state", "message"),
    [
        ("grader.calibration", {"slope": "NaN"}, "grader.calibration.slope: Input should be a finite number"),
        ("strip_filter.calibration", {"intercept": "-Infinity"}, "strip_filter.calibration.intercept: Input"),
        (
            "grader.calibration",
            {"weights": {"term_coverage": "Infinity"}},
            "grader.calibration.weights.term_coverage: Input should be a finite number",
        ),
        (
            "grader.calibration",
            {"slope": 0},
            "grader.calibration.slope: Input should be greater than or equal to 0.001",
        ),
        (
            "grading",
            {
                "mode": "fused",
                "evaluator": MANIFEST,
                "fused_score": {"weights": {"llm": "NaN"}, "intercept": 0},
            },
            "grading.fused_score.weights.llm: Input should be a finite number",
        ),
        (
            "grading",
            {
                "mode": "evaluator",
                "evaluator": MANIFEST,
                "evaluator_score": {**LINEAR, "intercept": "Infinity"},
            },
            "grading.evaluator_score.intercept: Input should be a finite number",
        ),
        (
            "grading",
            {"mode": "evaluator", "evaluator": {**MANIFEST, "max_length": "NaN"}},
            "grading.evaluator.max_length: Input should be a finite number",
        ),
        (
            "grading",
            {
                "mode": "evaluator",
                "evaluator": {**MANIFEST, "files": {"model.safetensors": {"bytes": "Infinity"}}},
            },
            "grading.evaluator.files.model.safetensors.bytes: Input should be a finite number",
        ),
    ],
)
def test_non_finite_numbers_in_calibration_grading_and_evaluator_state_are_refused_by_name(
    tmp_path, key, state, message
):
    # JSON has no NaN, but Python's json reads (and writes) NaN and Infinity: a TypeError about None was
    # all a program with one said, and only after the store and the embedding model were opened.
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc[key] = {**(doc[key] or {}), **state}
    text = (
        json.dumps(doc)
        .replace('"NaN"', "NaN")
        .replace('"-Infinity"', "-Infinity")
        .replace('"Infinity"', "Infinity")
    )
    path = _write(tmp_path, "bad.json", text)
    with pytest.raises(ProgramError, match=f"^{tmp_path / 'bad.json'}: invalid program: {message}"):
        read_program(path)


def test_a_non_finite_calibration_is_one_line_exit_2_before_any_store_is_opened(tmp_path, capsys):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc["grader.calibration"]["slope"] = float("nan")
    path = _write(tmp_path, "p.json", json.dumps(doc))
    assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "grader.calibration.slope: " in err, err
    assert not (tmp_path / "chroma").exists()  # nothing opened, nothing ingested


def test_unknown_calibration_weights_are_refused_when_read_in_a_bounded_message(tmp_path, capsys):
    # 100,000 unknown names were refused after the store and the embedder opened, in a 989 KB line.
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc["grader.calibration"]["weights"] = {f"w{i}": 0.1 for i in range(100_000)}
    path = _write(tmp_path, "p.json", json.dumps(doc))
    assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert "grader.calibration.weights: calibration weighs unknown evidence 'w0', " in err
    assert "and 99995 more;" in err and len(err) < 600 and err.count("\n") == 1, err
    assert not (tmp_path / "chroma").exists()


def test_an_integer_of_thousands_of_digits_is_the_schemas_error_naming_the_file(tmp_path):
    # Python's own "Exceeds the limit (4300 digits) for integer string conversion" named no file.
    text = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text()
    path = _write(tmp_path, "big.json", text.rstrip()[:-1] + ', "config": {"k": ' + "9" * 5000 + "}}")
    with pytest.raises(ProgramError, match=f"^{path}: invalid program: an integer of 5000 digits"):
        read_program(path)


def test_a_validation_error_of_many_problems_describes_the_first_few():
    with pytest.raises(ValidationError) as info:
        CalibrationState(slope=1, intercept=0, weights={f"w{i}": float("nan") for i in range(1000)})
    text = describe_validation_error(info.value)
    assert text.endswith("; and 995 more problems") and len(text) < 1000


@pytest.mark.parametrize(
    ("key", "change", "message"),
    [
        ("answerer", lambda s: s.update(demos="abc"), "answerer.demos: Input should be a valid list"),
        (
            "answerer",
            lambda s: s["signature"].update(instructions=12345),
            "answerer.signature.instructions: Input should be a valid string",
        ),
        (
            "rewriter",
            lambda s: s["signature"]["fields"][0].update(prefix=["Question:"]),
            "rewriter.signature.fields.0.prefix: Input should be a valid string",
        ),
        (
            "grader.predict",
            lambda s: s["demos"].append({"question": {"nested": 1}}),
            "grader.predict.demos.2.question: a demo's value is a string, a boolean, a number or null, not dict",
        ),
        (
            "answerer",
            lambda s: s.update(lm="openai/gpt-4o"),
            "answerer.lm: Input should be a valid dictionary",
        ),
        ("answerer", lambda s: s.pop("signature"), "answerer.signature: Field required"),
        # Predict.load_state sets any key it does not know as an attribute: "forward" would replace a method.
        ("reviser", lambda s: s.update(forward="x"), "reviser.forward: Extra inputs are not permitted"),
        # Bounds: every prompt of the stage carries all demos and the whole instruction.
        (
            "answerer",
            lambda s: s.update(demos=[{"question": "q", "answer": "a"}] * 65),
            "answerer.demos: List should have at most 64 items",
        ),
        (
            "answerer",
            lambda s: s["signature"].update(instructions="x" * 20_001),
            "answerer.signature.instructions: String should have at most 20000 characters",
        ),
        (
            "answerer",
            lambda s: s.update(demos=[{"question": "q", "answer": "a" * 20_001}]),
            "answerer.demos.0.answer: a demo's value is at most 20000 characters",
        ),
    ],
)
def test_each_predictors_state_is_typed_and_bounded_when_the_file_is_read(tmp_path, key, change, message):
    # A wrong type here loaded, and failed as an AttributeError at the answer stage after LM calls.
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    change(doc[key])
    path = _write(tmp_path, "bad.json", json.dumps(doc))
    with pytest.raises(ProgramError, match=f"^{tmp_path / 'bad.json'}: invalid program: {message}") as info:
        read_program(path)
    assert "\n" not in str(info.value)


def test_a_predictor_of_a_wrong_type_is_one_line_exit_2_before_any_store_is_opened(tmp_path, capsys):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc["answerer"]["demos"] = "abc"
    path = _write(tmp_path, "p.json", json.dumps(doc))
    assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "answerer.demos: " in err, err
    assert not (tmp_path / "chroma").exists()


@pytest.mark.parametrize(
    ("key", "state", "message"),
    [
        (
            "grader.calibration",
            {"slope": 1e308},
            "grader.calibration.slope: Input should be less than or equal",
        ),
        (
            "grader.calibration",
            {"slope": 1e-300},
            "grader.calibration.slope: Input should be greater than or",
        ),
        (
            "grader.calibration",
            {"intercept": -1.7e308},
            "grader.calibration.intercept: Input should be greater",
        ),
        (
            "strip_filter.calibration",
            {"weights": {"term_coverage": -1.7e308}},
            "strip_filter.calibration.weights.term_coverage: Input should be greater than or equal to -1000",
        ),
        (
            "grading",
            {"mode": "fused", "fused_score": {"weights": {"llm": 1e300}, "intercept": 0}},
            "grading.fused_score.weights.llm: Input should be less than or equal to 1000",
        ),
    ],
)
def test_huge_calibration_numbers_are_refused_by_name(tmp_path, key, state, message):
    # Finite but huge numbers overflowed to a NaN score when a passage was graded ("score is NaN").
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    doc[key] = {**(doc[key] or {}), **state}
    path = _write(tmp_path, "bad.json", json.dumps(doc))
    with pytest.raises(ProgramError, match=f"^{tmp_path / 'bad.json'}: invalid program: {message}"):
        read_program(path)


def test_a_program_file_with_a_utf8_bom_loads(tmp_path):
    text = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text()
    path = _write(tmp_path, "bom.json", b"\xef\xbb\xbf" + text.encode())
    assert read_program(path) == read_program(tmp_path / "p.json")


def test_only_regular_files_of_bounded_size_are_read_as_programs(tmp_path, monkeypatch):
    import os

    from crag_dspy import program_file

    device = tmp_path / "z.json"
    device.symlink_to("/dev/zero")  # was read until memory ran out
    with pytest.raises(ProgramError, match="z.json: not a regular file"):
        read_program(device)
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)  # opening it waited for a writer for ever
    with pytest.raises(ProgramError, match="f.json: not a regular file"):
        read_program(fifo)
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"})
    monkeypatch.setattr(program_file, "MAX_PROGRAM_BYTES", path.stat().st_size - 1)
    with pytest.raises(ProgramError, match="p.json: program is larger than"):
        read_program(path)


def test_an_unknown_top_level_key_is_refused_whatever_its_value(tmp_path):
    doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"}).read_text())
    for value in ({"demos": []}, {}):
        path = _write(tmp_path, "bad.json", json.dumps({**doc, "grader.predictor": value}))
        with pytest.raises(
            ProgramError, match="invalid program: grader.predictor: not a part of a CRAG program"
        ):
            read_program(path)


def test_the_state_keys_a_program_may_hold_are_the_module_s_parameters():
    from crag_dspy.program_file import PROGRAM_PARAMETERS

    assert set(PROGRAM_PARAMETERS) == {name for name, _ in compiled_crag().named_parameters()}


def test_a_program_never_decides_which_folder_is_read(tmp_path, capsys):
    from test_compile import make_domain

    evil = make_domain(tmp_path / "evil")  # a valid domain the program points at by path
    for metadata in ({"domain": str(evil)}, {"domain": "../../evil"}):
        doc = json.loads(save_program(compiled_crag(), tmp_path / "p.json", {"domain": "x"}).read_text())
        doc["metadata"].update(metadata)
        path = _write(tmp_path, "p.json", json.dumps(doc))
        assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
        assert "metadata.domain: " in capsys.readouterr().err
    assert not (tmp_path / "chroma").exists()  # refused before anything was resolved or ingested


def test_a_recorded_domain_dir_is_not_used_to_locate_the_domain(tmp_path, monkeypatch):
    from test_compile import make_domain, script

    from crag_dspy.app import open_program
    from crag_dspy.settings import Settings

    (tmp_path / "data").mkdir()
    bundled = make_domain(tmp_path / "data" / "tiny")
    monkeypatch.setattr("crag_dspy.settings.DEFAULT_DATA_DIR", bundled.parent)
    evil = make_domain(tmp_path / "evil")  # also named "tiny", with other text
    (evil / "corpus.jsonl").write_text(
        json.dumps({"id": "secret", "title": "Secret", "text": "The zeta code is LEAKED."}) + "\n"
    )
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "tiny", "domain_dir": str(evil)})
    loaded = open_program(
        path, Settings(chroma_path=tmp_path / "chroma"), lm=ScriptedLM(script), progress=False
    )
    texts = [p.text for p in loaded.crag.retriever.retrieve("What is the zeta code?", 6)]
    assert texts and not any("LEAKED" in t for t in texts) and any("Z100" in t for t in texts)


def test_a_program_of_a_domain_that_is_not_bundled_says_to_name_its_folder(tmp_path, capsys):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "popqa-elsewhere"})
    assert _ask(["--program", str(path)], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert "compiled for domain 'popqa-elsewhere', which is not a bundled domain" in err
    assert "--domain-dir" in err and not (tmp_path / "chroma").exists()


@pytest.mark.parametrize("name", ["../..", "/etc", "data/default", "..", "a b"])
def test_domain_names_are_names_not_paths(tmp_path, capsys, monkeypatch, name):
    from crag_dspy.settings import Settings

    assert _ask(["--domain", name], tmp_path / "chroma") == 2
    err = capsys.readouterr().err
    assert f"error: --domain {name!r} is not a domain name" in err and "--domain-dir" in err
    assert not (tmp_path / "chroma").exists()
    with pytest.raises(ValueError, match="not a domain name"):
        Settings(domain=name)
    monkeypatch.setenv("CRAG_DOMAIN", name)
    with pytest.raises(ValueError, match="not a domain name"):
        Settings()


def test_a_program_compiled_on_other_data_is_refused_unless_forced(tmp_path, capsys, caplog):
    from test_compile import make_domain, script

    from crag_dspy.app import open_program
    from crag_dspy.domain import load_domain
    from crag_dspy.settings import Settings

    root = make_domain(tmp_path / "tiny")
    compiled_on = load_domain(root).file_hashes()
    path = save_program(
        compiled_crag(), tmp_path / "p.json", {"domain": "tiny", "dataset_hashes": compiled_on}
    )
    with (root / "corpus.jsonl").open("a") as f:  # the data changed since the compile
        f.write(json.dumps({"id": "new", "title": "New", "text": "A new document."}) + "\n")
    now = load_domain(root).file_hashes()["corpus.jsonl"]
    settings = Settings(domain_dir=root, chroma_path=tmp_path / "chroma")
    with pytest.raises(ProgramError) as info:
        open_program(path, settings, domain_from_program=False, lm=ScriptedLM(script), progress=False)
    message = str(info.value)
    assert f"corpus.jsonl: program {compiled_on['corpus.jsonl'][:12]}, domain {now[:12]}" in message
    assert "--force" in message and "qa.jsonl" not in message  # only what differs
    assert not (tmp_path / "chroma").exists()
    # The CLI: one line, exit 2; --force loads it with a warning.
    argv = ["--program", str(path), "--domain-dir", str(root)]
    assert _ask(argv, tmp_path / "chroma") == 2
    assert "corpus.jsonl: program" in capsys.readouterr().err
    loaded = open_program(
        path, settings, domain_from_program=False, lm=ScriptedLM(script), progress=False, force=True
    )
    assert loaded.compiled and "using it anyway (--force)" in caplog.text


def test_a_program_nested_too_deeply_is_a_clear_error(tmp_path):
    path = _write(
        tmp_path, "p.json", '{"format": "crag-dspy-program", "state": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(ProgramError, match="p.json: corrupt program JSON: nested too deeply"):
        read_program(path)


# --- the program the default domain ships, and programs by domain name --------------------------------


def test_the_default_domain_ships_a_program_of_this_format_compiled_on_its_current_data():
    from crag_dspy.domain import load_domain
    from crag_dspy.program import check_dataset
    from crag_dspy.settings import DEFAULT_DATA_DIR

    path = DEFAULT_DATA_DIR / "default" / "program.json"
    document = read_program(path, domain="default")
    assert document["metadata"]["format_version"] == PROGRAM_FORMAT_VERSION
    # Changing the domain's data without recompiling this program fails here, not at a user's ask.
    check_dataset(document, load_domain(path.parent).file_hashes(), path)
    assert "domain_dir" not in document["metadata"]  # no folder of the machine that compiled it
    crag = load_program(
        path, lm=ScriptedLM(lambda s, u: {}), retriever=ListRetriever([]), web_search=ListWebSearch()
    )
    assert (crag.thresholds.lower, crag.thresholds.upper) == (
        document["thresholds"]["lower"],
        document["thresholds"]["upper"],
    )


def test_a_bundled_domains_name_stands_for_the_program_it_ships(tmp_path, monkeypatch):
    from crag_dspy.app import resolve_program
    from crag_dspy.settings import DEFAULT_DATA_DIR

    assert resolve_program("default") == DEFAULT_DATA_DIR / "default" / "program.json"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default").write_text("{}")  # a file of that name in the working directory wins
    assert resolve_program("default") == Path("default")
    assert resolve_program("p.json") == Path("p.json")  # a path stays a path (missing: read_program says so)
    with pytest.raises(ProgramError, match="no bundled domain 'nosuchdomain' ships a program"):
        resolve_program("nosuchdomain")


def test_load_program_uses_the_lm_the_caller_configured_and_never_builds_one(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("load_program built an LM although dspy.configure named one")

    monkeypatch.setattr("crag_dspy.app.build_lm", refuse)
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"})
    lm = ScriptedLM(lambda s, u: {"answer": "x"})
    with dspy.context(lm=lm):
        crag = load_program(path, retriever=ListRetriever([]), web_search=ListWebSearch())
    assert crag.lm is None  # dspy.settings.lm at call time, as every DSPy module
    with pytest.raises(AssertionError, match="built an LM"):
        load_program(path, retriever=ListRetriever([]), web_search=ListWebSearch())


# --- DSPy's own save/load (issue 25, 1) -----------------------------------------------------------------


def test_crag_save_and_load_round_trip_state_and_config_through_dspys_methods(tmp_path):
    original = compiled_crag()
    original.config = original.config.replace(
        internal_retries=2, lm_calls={"retries": 0, "use_logprobs": False}
    )
    original.thresholds.load_state({"lower": 0.2, "upper": 0.6, "by_type": {"person": [0.1, 0.4]}})
    path = tmp_path / "p.json"
    original.save(path)
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    assert fresh.load(path) is fresh
    assert fresh.dump_state() == original.dump_state()
    # The whole config, how the LM is called included: a save/load round trip, not an app's load.
    assert fresh.config == original.config.replace(lower=0.2, upper=0.6)
    assert fresh.config.lm_calls.retries == 0 and fresh.grader.use_logprobs is False
    # The file is a program file like the compile's: the app's reader takes it (it names no domain).
    document = read_program(path)
    assert document["metadata"].get("domain") is None


def test_a_program_saved_with_crag_save_runs_on_the_domain_the_settings_name(
    tmp_path, monkeypatch, caplog, capsys
):
    # Issue 61: it crashed with KeyError 'domain'. It holds config, thresholds and demos, not the domain
    # (CRAG cannot know its data): it runs on the configured domain, with a warning that it is unchecked.
    from test_compile import make_domain, script

    from crag_dspy.cli import main

    (tmp_path / "data").mkdir()
    make_domain(tmp_path / "data" / "tiny")
    monkeypatch.setattr("crag_dspy.settings.DEFAULT_DATA_DIR", tmp_path / "data")
    monkeypatch.setenv("CRAG_DOMAIN", "tiny")
    monkeypatch.setenv("CRAG_CHROMA_PATH", str(tmp_path / "chroma"))
    path = tmp_path / "p.json"
    saved = compiled_crag()
    saved.answerer = CRAG(None, None).answerer  # the instructions the scripted LM answers to
    saved.save(path)
    document = read_program(path, domain="tiny")  # a warning, not a refusal
    assert document["metadata"].get("domain") is None
    assert "not checked against the data of domain 'tiny'" in caplog.text
    crag = load_program(path, lm=ScriptedLM(script), progress=False)
    assert (crag.thresholds.lower, crag.thresholds.upper, crag.config.k) == (0.12, 0.83, 4)
    assert len(crag.grader.predict.demos) == 2
    assert crag(question="What is the zeta code?").answer == "Z100"
    # The CLI: `ask --program <file>` on the configured domain, and on one named by --domain-dir.
    monkeypatch.setattr("crag_dspy.app.build_lm", lambda settings: ScriptedLM(script))
    for extra in ([], ["--domain-dir", str(tmp_path / "data" / "tiny")]):
        assert main(["ask", "What is the zeta code?", "--program", str(path), *extra]) == 0
        assert "answer: Z100" in capsys.readouterr().out


def test_dspys_plain_module_load_reads_a_program_file(tmp_path):
    path = save_program(compiled_crag(), tmp_path / "p.json", {"domain": "default"})
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    dspy.Module.load(fresh, path)  # dspy's own reader: dependency versions in metadata, then load_state
    assert fresh.dump_state() == compiled_crag().dump_state()
    assert (fresh.config.k, fresh.config.max_strips, fresh.thresholds.upper) == (4, 3, 0.83)


def test_a_bad_state_leaves_the_module_as_it_was(tmp_path):
    state = compiled_crag().dump_state()
    target = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(k=7))
    with pytest.raises(ValueError, match="k"):
        target.load_state({**state, "config": {**state["config"], "k": 0}})
    with pytest.raises(Exception, match="signature"):
        target.load_state({**state, "answerer": {"demos": []}})
    assert target.config == CRAGConfig(k=7) and target.grader.predict.demos == []
    with pytest.raises(ValueError, match="holds its 'config'"):
        target.load_state({k: v for k, v in state.items() if k != "config"})


# Options as data: test_secrets refuses a literal allow_pickle=... outside its own checks.
REFUSED = [
    ("save", "p.pkl", {}),
    ("save", "dir", {"save_program": True}),
    ("load", "p.json", {"allow_pickle": True}),
    ("load", "p.json", {"allow_unsafe_lm_state": True}),
]


@pytest.mark.parametrize(("method", "name", "options"), REFUSED)
def test_crag_save_and_load_never_pickle(tmp_path, method, name, options):
    crag = compiled_crag()
    crag.save(tmp_path / "p.json")
    with pytest.raises(ProgramError):
        getattr(crag, method)(tmp_path / name, **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def format_6_program(crag: CRAG, metadata: dict) -> dict:
    """``crag`` saved as format 6 did: state, config and metadata in an envelope."""
    state = crag.dump_state()
    return {
        "format": "crag-dspy-program",
        "format_version": 6,
        "crag_dspy_version": "0.1.0",
        "dspy_version": "3.4.1",
        "created": "2026-12-01T19:40:18+00:00",
        "config": state.pop("config"),
        "metadata": metadata,
        "state": json.loads(json.dumps(state)),
    }


def test_a_format_6_program_converts_to_the_same_state(tmp_path):
    from optimize.convert_program import main as convert

    crag = compiled_crag()
    old = format_6_program(crag, {"domain": "hr", "seed": 2})
    path = _write(tmp_path, "p.json", json.dumps(old))
    with pytest.raises(ProgramError, match="format version 6;.*--domain hr"):
        read_program(path)
    assert convert([str(path), str(tmp_path / "new.json")]) == 0
    converted = CRAG(ListRetriever([]), ListWebSearch()).load(tmp_path / "new.json")
    assert converted.dump_state() == crag.dump_state()
    metadata = read_program(tmp_path / "new.json")["metadata"]
    assert (metadata["created"], metadata["dependency_versions"]["dspy"], metadata["seed"]) == (
        old["created"],
        "3.4.1",
        2,
    )


def test_a_program_that_cannot_be_converted_is_a_usage_error_and_loses_nothing(tmp_path, capsys):
    from optimize.convert_program import main as convert

    good = format_6_program(compiled_crag(), {"domain": "hr"})
    out_of_range = {**good, "config": {**good["config"], "k": 0}}  # converts, but read_program refuses k = 0
    cases = [
        (tmp_path / "missing.json", None, "cannot read program (No such file or directory)"),
        (tmp_path / "broken.json", "{not json", "corrupt or truncated program JSON"),
        (tmp_path / "list.json", "[1, 2]", "cannot convert: not a format-6 crag-dspy program"),
        (tmp_path / "v7.json", json.dumps({**good, "format_version": 7}), "not a format-6 crag-dspy program"),
        (
            tmp_path / "partial.json",
            json.dumps({k: v for k, v in good.items() if k != "state"}),
            "cannot convert: a format-6 program needs state",
        ),
        (
            tmp_path / "bad.json",
            json.dumps(out_of_range),
            "the converted program would not load: invalid program",
        ),
    ]
    for path, text, message in cases:
        if text is not None:
            path.write_text(text)
        with pytest.raises(SystemExit) as exit_:
            convert([str(path)])  # in place
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"error: {path}: " in err and message in err, err
        assert "Traceback" not in err
        # The old file is as it was, and no half-converted file is left beside it.
        assert (path.read_text() if path.exists() else None) == text
        assert sorted(p.name for p in tmp_path.glob(path.name + "*")) == ([path.name] if text else [])


def test_crag_load_finds_a_trained_evaluator_beside_the_file(tmp_path, monkeypatch):
    from crag_dspy.judges.fusion import LinearScore

    class Weights:  # what save_program asks of a trained evaluator; the real one is in test_evaluator
        base_model, max_length = "base", 64

        def save(self, folder):
            folder.mkdir()
            return {"model.safetensors": {"size": 1, "sha256": SHA}}

    crag = compiled_crag()
    crag.grading.use("evaluator", Weights(), LinearScore({"evaluator": 1.0}, 0.0))
    crag.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["grading"]["evaluator"]["path"] == "p.evaluator"
    opened = []
    monkeypatch.setattr(
        "crag_dspy.program_file.RelevanceEvaluator.load", lambda folder, files: opened.append(folder) or "w"
    )
    loaded = CRAG(ListRetriever([]), ListWebSearch()).load(tmp_path / "p.json")
    assert opened == [tmp_path / "p.evaluator"] and loaded.grading.evaluator == "w"
    assert loaded.grading.mode == "evaluator"
    # Plain dspy.Module.load knows no folder: the grade source says how to load the weights.
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    dspy.Module.load(fresh, tmp_path / "p.json")
    with pytest.raises(Exception, match="weights are not loaded"):
        fresh.grading.evaluator_logits("q", ["d"])
