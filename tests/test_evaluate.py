"""The evaluation harness end to end on the tiny generated domain with a scripted LM: the table's
structure, the paper's ablations as configuration, and shared work that is never recomputed."""

import json
from pathlib import Path

import pytest
from fakes import NO_LM, ScriptedLM, field
from test_compile import key_of, make_domain, script

from crag_dspy import CRAG
from crag_dspy.baselines import NoRetrieval, PlainRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.domain import load_domain
from crag_dspy.faults import LMDownError
from crag_dspy.program import save_program
from crag_dspy.settings import Settings
from optimize.datasets import qa_split
from optimize.evaluate import evaluate_domain, main
from optimize.shared_work import SharedWork
from optimize.variants import Outcome, Programs, run_variant, table_variants

NAMES = [
    "no retrieval",
    "plain RAG",
    "RAG + web always",
    "CRAG (default thresholds)",
    "CRAG (program)",
    "CRAG + internal retry",
    "w/o Correct",
    "w/o Incorrect",
    "w/o Ambiguous",
    "w/o refinement",
    "w/o rewriting",
    "w/o external selection",
]


def eval_script(system: str, user: str):
    if "from what you know" in system:  # no retrieval: the tiny domain is invented, the model cannot know
        return {"answer": "I don't know"}
    if "queries tried so far" in system:  # the internal retry's query for round 2
        return {"query": f"{key_of(field(user, 'question'))} sheet"}
    return script(system, user)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    domain = make_domain(tmp / "tiny")
    settings = Settings(domain_dir=domain, chroma_path=tmp / "chroma", web_search="offline")
    # A "compiled" program with a wide AMBIGUOUS band: grades are 0.9 / 0.1, so every question is AMBIGUOUS.
    program = CRAG(None, None, CRAGConfig(lower=0.05, upper=0.95, k=2))
    save_program(program, tmp / "program.json", {"domain": "tiny"})
    return tmp, settings


@pytest.fixture(scope="module")
def evaluated(setup):
    tmp, settings = setup
    lm = ScriptedLM(eval_script)
    report = evaluate_domain(
        settings, lm=lm, program=tmp / "program.json", out=tmp / "out" / "tiny-test", progress=False
    )
    return report, lm


def rows_of(report):
    return {row["name"]: row for row in report["variants"]}


def test_table_has_every_variant_in_order_and_writes_json_md_png(evaluated, setup):
    report, _ = evaluated
    tmp, _ = setup
    assert [row["name"] for row in report["variants"]] == NAMES
    assert report["questions"] == 3 and all(row["n"] == 3 for row in report["variants"])
    for suffix in (".json", ".md", ".png"):
        assert (tmp / "out" / f"tiny-test{suffix}").is_file(), suffix
    saved = json.loads((tmp / "out" / "tiny-test.json").read_text())
    assert [row["name"] for row in saved["variants"]] == NAMES
    assert len(saved["rows"]) == 3 * len(NAMES)
    md = (tmp / "out" / "tiny-test.md").read_text()
    for name in NAMES:
        assert f"| {name} |" in md
    assert "## Actions" in md and "## Grader quality" in md
    # Intervals on every accuracy, and paired tests of each CRAG row against every other row.
    assert "| no retrieval | 0.0% [0.0, 56.1] (0/3) |" in md
    assert "| CRAG (program) | no retrieval | 3 | 0 | 0.250 | no measured difference |" in md
    assert "| CRAG (default thresholds) | plain RAG | 1 | 0 | 1.000 | no measured difference |" in md
    # Truthfulness next to accuracy: the tiny domain has no unanswerable question and no evidence, so
    # abstentions are not broken down and there is no cited-right column.
    assert (
        "| variant | accuracy | abstained | hallucinated | truthfulness [95% CI] | correction success |" in md
    )
    assert (
        "| no retrieval | 0.0% [0.0, 56.1] (0/3) | 3 (100.0%) | 0.0% [0.0, 56.1] (0/3) | +0.00 [+0.00, +0.00] |"
        in md
    )
    assert (
        "| CRAG (program) | no retrieval | 3 | 0 | 0.250 | no measured difference | 3 / 0 / 0 | 0.250 |" in md
    )
    assert "cited right" not in md
    assert all(r["score"] == (1 if r["correct"] else 0 if r["abstained"] else -1) for r in saved["rows"])
    # CRAG rows carry their citations as JSON; the baselines cite nothing; no evidence: not measured.
    kinds = {v["name"]: v["kind"] for v in saved["variants"]}
    assert all(r["citations"] == [] for r in saved["rows"] if kinds[r["variant"]] != "crag")
    crag_rows = [r for r in saved["rows"] if r["variant"] == "CRAG (default thresholds)"]
    assert all(r["citations"] and set(r["citations"][0]) == {"doc_id", "page"} for r in crag_rows)
    assert all(r["cited_right"] is None for r in saved["rows"])
    assert (tmp / "out" / "tiny-test.png").read_bytes()[:4] == b"\x89PNG"


def test_the_frontier_is_the_table_rerouted_and_the_rows_say_what_each_question_used(evaluated, setup):
    report, _ = evaluated
    tmp, _ = setup
    frontier, rows = report["frontier"], rows_of(report)
    # The precompute and the table's CRAG rows are the same flow: at each row's thresholds the frontier
    # gives that row's accuracy and action mix, with no LM call of its own beyond the forced actions.
    for key, name in (("at", "CRAG (program)"), ("defaults", "CRAG (default thresholds)")):
        point, row = frontier[key], rows[name]
        assert point["accuracy"] == pytest.approx(row["accuracy"]), name
        assert point["actions"] == {a: s["taken"] for a, s in row["actions"].items()}, name
        assert point["oracle"]["value"] >= point["accuracy"]
        assert point["headroom"]["value"] == pytest.approx(point["oracle"]["value"] - point["accuracy"])
        # Its LM tokens too: each question's route costs what the row's run of the same flow did.
        assert point["tokens"] > 0 and point["tokens"] == pytest.approx(
            row["standalone"]["tokens"] / row["n"]
        )
    for name in ("plain RAG", "RAG + web always"):
        assert frontier["baselines"][name]["tokens"] == pytest.approx(
            rows[name]["standalone"]["tokens"] / rows[name]["n"]
        )
    assert (
        frontier["accuracy_tokens_frontier"] and "LM tokens/q" in (tmp / "out" / "tiny-test.md").read_text()
    )
    assert frontier["baselines"]["plain RAG"]["accuracy"] == pytest.approx(rows["plain RAG"]["accuracy"])
    assert frontier["baselines"]["RAG + web always"]["accuracy"] == pytest.approx(
        rows["RAG + web always"]["accuracy"]
    )
    best = max(p["accuracy"] for p in frontier["points"])
    assert frontier["accuracy_frontier"][-1]["accuracy"] == pytest.approx(best)
    assert (tmp / "out" / "tiny-test-frontier.png").is_file()
    assert "## What routing buys" in (tmp / "out" / "tiny-test.md").read_text()
    for row in report["rows"]:  # any table row can be recomputed from the file
        assert {"action", "sources", "web_searches", "calls", "requests", "tokens", "score"} <= set(row)
        if row["variant"] == "RAG + web always":
            assert row["web_searches"] == 1 and row["sources"] == ["internal", "web"]
        if row["variant"] == "plain RAG":
            assert row["web_searches"] == 0 and row["sources"] == ["internal"]


def test_accuracy_actions_and_correction(evaluated):
    rows = rows_of(evaluated[0])
    # test split: kappa and lambda (answer in the KB), rho (answer only on the web)
    assert rows["no retrieval"]["accuracy"] == 0.0
    assert rows["plain RAG"]["correct"] == 2  # the web-only question has no answer in the KB
    assert rows["RAG + web always"]["correct"] == 3  # the raw question finds the web page too
    crag = rows["CRAG (default thresholds)"]
    assert crag["correct"] == 3
    assert {a: s["taken"] for a, s in crag["actions"].items()} == {
        "CORRECT": 2,
        "AMBIGUOUS": 0,
        "INCORRECT": 1,
    }
    assert crag["correction"] == {"n": 1, "of": 1, "rate": 1.0}
    assert rows["plain RAG"]["correction"] == {"n": 0, "of": 1, "rate": 0.0}
    program = rows["CRAG (program)"]
    assert program["actions"]["AMBIGUOUS"]["taken"] == 3 and program["correct"] == 3
    # Removing AMBIGUOUS puts 0.9-graded questions above the single threshold (0.05 + 0.95) / 2 = 0.5.
    no_ambiguous = rows["w/o Ambiguous"]["actions"]
    assert no_ambiguous["CORRECT"]["taken"] == 2 and no_ambiguous["INCORRECT"]["taken"] == 1
    assert rows["w/o Correct"]["actions"]["AMBIGUOUS"]["taken"] == 3
    for row in rows.values():
        assert row["errors"] == 0
    (grader,) = evaluated[0]["grader"]  # both programs share one grader; the test split has no pairs
    assert grader["data"].startswith("retrieved passages") and grader["accuracy"] == 1.0


def test_shared_work_is_never_recomputed(evaluated):
    report, lm = evaluated
    cost = report["cost"]
    assert len(lm.calls) == cost["lm_calls"]
    assert len(set(lm.calls)) == len(lm.calls)  # no identical LM request was made twice
    marginal = sum(row["marginal"]["calls"] for row in report["variants"])
    assert marginal + cost["frontier_lm_calls"] == cost["lm_calls"]  # the frontier adds only its own
    assert cost["lm_requests"] == cost["lm_calls"]  # the scripted LM has no cache: every request is a call
    assert cost["standalone_lm_requests"] == cost["standalone_lm_calls"] > 2 * cost["lm_calls"]
    md = Path(report["files"][1]).read_text()
    assert f"the variants would make {cost['standalone_lm_requests']} LM requests" in md
    # Remapped actions only recombine pieces already computed for the program and the default CRAG
    # (same predictors): they add no LM call at all.
    for name in ("w/o Correct", "w/o Incorrect", "w/o Ambiguous"):
        assert rows_of(report)[name]["marginal"]["requests"] == 0


def test_standalone_cost_is_what_a_variant_costs_alone(evaluated, setup):
    """Run each variant alone, on fresh shared work: it makes exactly its standalone LM calls."""
    report, _ = evaluated
    _, settings = setup
    from crag_dspy.app import assemble
    from crag_dspy.program import apply_program, read_program

    for variant in table_variants(has_program=True):
        lm = ScriptedLM(eval_script)
        crag, backends = assemble(settings, lm, progress=False)
        work = SharedWork()
        program = apply_program(crag.deepcopy(), read_program(settings.domain_dir.parent / "program.json"))
        programs = Programs(program, crag, work)
        closed = NoRetrieval(lm=lm)
        for q in [q for q in backends.domain.qa if q.split == "test"]:
            run_variant(
                variant, q.question, programs, lambda text, c=closed: Outcome(c(question=text).answer)
            )
        assert len(lm.calls) == rows_of(report)[variant.name]["standalone"]["calls"], variant.name


def test_the_internal_retry_row_is_computed_from_the_programs_shared_pieces(evaluated, setup):
    report, _ = evaluated
    retry = rows_of(report)["CRAG + internal retry"]
    # Grades of 0.9 / 0.1 never reach the program's upper 0.95: every question stays AMBIGUOUS after
    # its two rounds, and is answered from every passage graded plus the web.
    assert retry["actions"]["AMBIGUOUS"]["taken"] == 3 and retry["correct"] == 3 and retry["errors"] == 0
    assert 0 < retry["marginal"]["requests"] < retry["standalone"]["requests"]

    tmp, settings = setup
    from crag_dspy.app import assemble
    from crag_dspy.program import apply_program, read_program
    from optimize.variants import Variant

    lm = ScriptedLM(eval_script)
    crag, backends = assemble(settings, lm, progress=False)
    program = apply_program(crag.deepcopy(), read_program(tmp / "program.json"))
    work = SharedWork()
    programs = Programs(program, crag, work)
    (row,) = [v for v in table_variants(True) if v.name == "CRAG + internal retry"]
    q = next(q for q in backends.domain.qa if q.split == "test")
    with work.consumer("program") as by_program:
        run_variant(Variant("CRAG (program)"), q.question, programs, None)
    with work.consumer("retry") as by_retry:
        outcome = run_variant(row, q.question, programs, None)
    kinds = lambda keys: {k[0] for k in keys}
    # The grades, the web query and the web knowledge are the program's; the row adds its two rounds.
    assert {"grade", "rewrite", "web_search", "refine_external"} <= kinds(by_program & by_retry)
    assert kinds(by_retry - by_program) <= {"internal_retry", "judge", "refine_internal", "answer"}
    rounds = [k for k in by_retry if k[0] == "internal_retry"]
    assert len(rounds) == 3 and set(work.owned()) == {"program", "retry"}  # two searches, one revision
    # The same answer as the module itself with two rounds on.
    program.config = program.config.replace(internal_retries=2)
    program.lm = ScriptedLM(eval_script)
    pred = program(question=q.question)
    assert (pred.answer, pred.action) == (outcome.answer, outcome.action.value)
    assert len(pred.trace.internal_rounds) == 2


def test_plain_rag_row_answers_like_the_plain_rag_module(evaluated, setup):
    report, _ = evaluated
    _, settings = setup
    from crag_dspy.app import assemble

    lm = ScriptedLM(eval_script)
    crag, _ = assemble(settings, lm, progress=False)
    rag = PlainRAG(crag.retriever, lm=lm, k=crag.config.k)
    questions = {row["id"]: row for row in report["rows"] if row["variant"] == "plain RAG"}
    from crag_dspy.domain import load_domain

    for q in load_domain(settings.domain_dir).qa:
        if q.id in questions:
            assert rag(question=q.question).answer == questions[q.id]["answer"]


def test_val_split_measures_the_grader_on_labelled_pairs(setup):
    tmp, settings = setup
    lm = ScriptedLM(eval_script)
    report = evaluate_domain(settings, lm=lm, split="val", out=tmp / "val" / "tiny-val", progress=False)
    assert [row["name"] for row in report["variants"]][3] == "CRAG (default thresholds)"
    assert "CRAG (program)" not in [row["name"] for row in report["variants"]]
    data = [g["data"] for g in report["grader"]]
    assert data[0] == "relevance.jsonl (val)" and report["grader"][0]["n"] == 4
    # 4 pairs, 3 requests: the grader reads the retrieved "Delta sheet" passage focused to its title and
    # "The delta code is D500.", which is exactly the positive delta pair, so that judgement is shared.
    assert report["cost"]["grader_quality_lm_requests"] == 3
    assert len(lm.calls) == report["cost"]["lm_calls"] == len(set(lm.calls))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--domain-dir", "/nonexistent"], "domain directory not found"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--lm", "gpt-4o"], "not a LiteLLM model string"),
    ],
)
def test_bad_invocations_are_clear_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_program_or_split_fails_before_any_model_loads(setup, tmp_path, capsys):
    tmp, settings = setup
    base = ["--domain-dir", str(settings.domain_dir), "--chroma-path", str(tmp_path / "chroma")]
    (tmp_path / "other.json").write_text(
        (tmp / "program.json").read_text().replace('"domain": "tiny"', '"domain": "other"')
    )
    assert main([*base, "--program", str(tmp_path / "other.json")]) == 2
    assert "compiled for domain 'other'" in capsys.readouterr().err
    assert main([*base, "--program", str(tmp_path / "missing.json")]) == 2
    assert "cannot read program" in capsys.readouterr().err
    empty = make_domain(tmp_path / "empty")
    (empty / "qa.jsonl").write_text("")
    assert main(["--domain-dir", str(empty), "--chroma-path", str(tmp_path / "chroma")]) == 2
    assert "no QA questions in split 'test'" in capsys.readouterr().err


def test_a_program_compiled_on_other_data_is_refused_unless_forced(setup, tmp_path, capsys):
    _, settings = setup
    program = CRAG(None, None, CRAGConfig(lower=0.05, upper=0.95, k=2))
    other = {"corpus.jsonl": "b" * 64}  # what the compile saw: another corpus, no other files
    path = save_program(program, tmp_path / "program.json", {"domain": "tiny", "dataset_hashes": other})
    base = ["--domain-dir", str(settings.domain_dir), "--chroma-path", str(tmp_path / "chroma")]
    assert main([*base, *NO_LM, "--program", str(path)]) == 2
    err = capsys.readouterr().err
    assert "corpus.jsonl: program bbbbbbbbbbbb, domain " in err and "qa.jsonl: program absent, domain " in err
    assert "--force" in err and not (tmp_path / "chroma").exists()  # refused before anything is opened
    report = evaluate_domain(
        settings,
        lm=ScriptedLM(eval_script),
        program=path,
        limit=1,
        rows="main",
        out=tmp_path / "out" / "forced",
        progress=False,
        force=True,
    )
    assert report["program"] == str(path) and report["questions"] == 1


def test_one_failed_question_is_counted_wrong_with_its_error_and_the_run_goes_on(setup, tmp_path):
    _, settings = setup

    def kappa_unanswerable(system, user):
        if "Answer the question using only the context" in system and "kappa" in field(user, "question"):
            return {"answer": ""}  # the LM answers, unusably: this question's failure, not an outage
        return eval_script(system, user)

    out = tmp_path / "out" / "one-bad"
    report = evaluate_domain(
        settings, lm=ScriptedLM(kappa_unanswerable), rows="main", out=out, progress=False
    )
    assert report["questions"] == 3 and out.with_suffix(".md").is_file()  # the report is written
    kappa = next(
        q.id for q in qa_split(load_domain(settings.domain_dir), "test", None) if "kappa" in q.question
    )
    rows = [r for r in report["rows"] if r["id"] == kappa and r["variant"] != "no retrieval"]
    assert rows and all(r["answer"] is None and r["correct"] is False for r in rows)
    assert all(any("LMUnavailableError" in e and "no usable answer" in e for e in r["errors"]) for r in rows)
    crag = rows_of(report)["CRAG (default thresholds)"]
    assert crag["n"] == 3 and crag["correct"] == 2 and crag["errors"] == 1  # the other two are answered


def test_an_lm_that_is_down_stops_the_run_fast_with_one_line(setup, tmp_path, capsys, monkeypatch):
    _, settings = setup
    answered = []

    def down_after_one_question(system, user):
        question = field(user, "question")
        if answered and question != answered[0]:
            return ConnectionError("connection refused")  # the LM server went away
        answered[:1] = [question]
        return eval_script(system, user)

    lm = ScriptedLM(down_after_one_question)
    with pytest.raises(
        LMDownError, match="the LM scripted/fake failed 2 calls of 2 questions in a row"
    ) as info:
        evaluate_domain(settings, lm=lm, rows="main", out=tmp_path / "out" / "down", progress=False)
    assert "ConnectionError: connection refused" in str(info.value) and "the run stopped" in str(info.value)
    failed = [call for call in lm.calls if answered[0] not in call[1]]
    assert len(failed) == 2  # stopped at the second failed call in a row, not after every question
    assert not (tmp_path / "out").exists()
    # The command line: one line, exit 1, no traceback.
    answered.clear()
    monkeypatch.setattr("optimize.evaluate.build_lm", lambda *a, **k: ScriptedLM(down_after_one_question))
    argv = ["--domain-dir", str(settings.domain_dir), "--chroma-path", str(settings.chroma_path)]
    argv += NO_LM
    assert main([*argv, "--rows", "main", "--out", str(tmp_path / "cli")]) == 1
    err = capsys.readouterr().err  # progress bars, then the one line
    assert err.splitlines()[-1].startswith(
        "error: the LM scripted/fake failed 2 calls of 2 questions in a row"
    )
    assert "Traceback" not in err and not (tmp_path / "cli.md").exists()


def test_an_out_path_that_cannot_be_written_is_refused_before_the_lm_starts(tmp_path, capsys, monkeypatch):
    root = make_domain(tmp_path / "tiny")

    def refuse(*args, **kwargs):
        raise AssertionError("the evaluation built its LM")

    monkeypatch.setattr("optimize.evaluate.build_lm", refuse)
    (tmp_path / "a-file").write_text("")
    argv = ["--domain-dir", str(root), "--chroma-path", str(tmp_path / "chroma"), *NO_LM]
    assert main([*argv, "--out", str(tmp_path / "a-file" / "report")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {tmp_path / 'a-file' / 'report.md'}: cannot write the report there "
        f"({tmp_path / 'a-file'} is a file, not a folder)\n"
    )
    assert not (tmp_path / "chroma").exists()  # nothing opened, nothing asked
