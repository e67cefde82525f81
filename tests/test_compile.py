"""The whole compile on a tiny generated domain with a scripted LM (control flow, not quality)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import NO_LM, ScriptedLM, field

from crag_dspy.config import CRAGConfig
from crag_dspy.judges.calibration import Calibration
from crag_dspy.routing import decide_action
from crag_dspy.settings import Settings
from optimize.compile import compile_program, main
from optimize.options import CompileOptions
from optimize.thresholds import QuestionRoutes, route_accuracy, tune_thresholds

KB = {"zeta": "Z100", "theta": "T200", "kappa": "K300", "sigma": "S400", "delta": "D500", "lambda": "L600"}
WEB = {"omega": "W700", "gamma": "G800", "rho": "R900", "tau": "U010"}


ROOT = Path(__file__).resolve().parents[1]


def lines(items) -> str:
    return "".join(json.dumps(x) + "\n" for x in items)


def write_code_sheets(root: Path) -> None:
    """A new domain folder ``root`` with one code sheet per KB key (corpus) and per WEB key (web)."""
    root.mkdir()

    def doc(i, key, code, web=False):
        d = {
            "id": f"{'web' if web else 'kb'}-{i}",
            "title": f"{key.title()} sheet",
            "text": f"The {key} code is {code}. It was issued in 2024.\n\nThe {key} office is open daily.",
        }
        return d | ({"url": f"https://{key}.example"} if web else {})

    (root / "corpus.jsonl").write_text(lines(doc(i, k, c) for i, (k, c) in enumerate(KB.items())))
    (root / "web.jsonl").write_text(lines(doc(i, k, c, True) for i, (k, c) in enumerate(WEB.items())))


def make_domain(root: Path) -> Path:
    write_code_sheets(root)
    qa, splits = [], ["train", "val", "test"]
    for i, (key, code) in enumerate([*KB.items(), *WEB.items()]):
        qa.append(
            {"id": f"q{i}", "question": f"What is the {key} code?", "answers": [code], "split": splits[i % 3]}
        )
    (root / "qa.jsonl").write_text(lines(qa))
    rel = []
    for i, (key, code) in enumerate(KB.items()):
        other = list(KB)[(i + 1) % len(KB)]
        split = "train" if i < 4 else "val"
        rel.append(
            {
                "question": f"What is the {key} code?",
                "passage": f"{key.title()} sheet\nThe {key} code is {code}.",
                "label": 1,
                "split": split,
            }
        )
        rel.append(
            {
                "question": f"What is the {key} code?",
                "passage": f"{other.title()} sheet\nThe {other} code is X.",
                "label": 0,
                "split": split,
            }
        )
    (root / "relevance.jsonl").write_text(lines(rel))
    (root / "domain.toml").write_text('name = "tiny"\nk = 2\n')
    return root


def key_of(question: str) -> str:
    return re.search(r"the (\w+) code", question).group(1)


def script(system: str, user: str):
    question = field(user, "question")
    if "You judge" in system:  # grader and strip filter
        passage = field(user, "document") or field(user, "strip")
        return 0.9 if f"The {key_of(question)} code" in passage else 0.1
    if "web search query" in system:
        return {"query": f"{key_of(question)} code"}
    if "Answer the question using only the context" in system:
        match = re.search(rf"The {key_of(question)} code is (\w+)", field(user, "context"))
        return {"answer": match.group(1) if match else "I don't know"}
    raise AssertionError(system[:60])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("compile")
    domain = make_domain(tmp_path / "tiny")
    holder = {}

    def needs_demos(system, user):
        # The grader only ranks documents when shown demos, so the few-shot candidate must win and ship.
        if "You judge search results" in system and len(holder["lm"].last_messages) <= 2:
            return 0.6
        return script(system, user)

    holder["lm"] = lm = ScriptedLM(needs_demos)
    settings = Settings(domain_dir=domain, chroma_path=tmp_path / "chroma", web_search="offline")
    out = tmp_path / "out" / "program.json"
    report = compile_program(settings, CompileOptions(optimizer="labeled", seed=1, out=out), lm=lm)
    return report, out, lm, settings


def test_compile_writes_program_report_and_plot(compiled):
    report, out, _lm, _ = compiled
    program = json.loads(out.read_text())
    assert program["metadata"]["format"] == "crag-dspy-program" and program["metadata"]["domain"] == "tiny"
    assert set(program["metadata"]["dataset_hashes"]) >= {"corpus.jsonl", "qa.jsonl", "relevance.jsonl"}
    assert len(program["grader.predict"]["demos"]) == 4  # compiled demos survived saving
    thresholds = program["thresholds"]
    assert 0.0 <= thresholds["lower"] <= thresholds["upper"] <= 1.0
    grader = report["stages"]["grader"]
    assert grader["kept"] == "few-shot" and grader["after"]["accuracy"] == 1.0
    assert grader["candidates"]["zero-shot"]["val"]["accuracy"] == grader["before"]["accuracy"] == 0.5
    # The tiny domain has too few relevance pairs to train an evaluator: the LLM judge ships, and why.
    source = report["stages"]["grade_source"]
    assert source["shipped"] == "llm" and "too few labelled train pairs" in source["why"]
    assert program["grading"]["mode"] == "llm"
    assert "## grade source (shipped: llm)" in out.with_suffix(".report.md").read_text()
    for suffix in (".report.md", ".report.json", ".landscape.png", ".optuna.log", ".frontier.png"):
        assert out.with_suffix(suffix).is_file(), suffix
    # What routing buys on val, with the baselines' answers counted: the frontier's own LM work.
    frontier, md = report["thresholds"]["frontier"], out.with_suffix(".report.md").read_text()
    assert frontier["at"]["accuracy"] == pytest.approx(report["thresholds"]["accuracy"])
    assert report["thresholds"]["baseline_lm_calls"] > 0 and "the baselines' answers" in md
    assert "## What routing buys" in md and "Objective: accuracy." in md
    # The defaults compared against are on the shipped grader's scale, and the report says how.
    thresholds = report["thresholds"]
    assert f"Defaults: {thresholds['defaults_note']}." in md
    assert frontier["defaults"]["lower"] == thresholds["default_lower"] if "defaults" in frontier else True
    assert {r["name"] for r in report["test"]} == {"CRAG (compiled)", "CRAG (uncompiled)", "plain RAG"}
    # Where the time went, stage by stage, adding up to the whole run.
    stages = report["stage_seconds"]
    assert list(stages) == ["setup", "grader", "grade source", "strip filter", "thresholds", "test"]
    assert sum(stages.values()) == pytest.approx(report["seconds"], abs=0.5)
    assert "Wall time by stage: setup " in out.with_suffix(".report.md").read_text()
    # The scripted LM is not the embedded engine: no engine build is claimed for this run.
    assert "engine" not in report and "Engine:" not in out.with_suffix(".report.md").read_text()


def test_threshold_trials_make_zero_lm_calls(compiled):
    report, out, *_ = compiled
    t = report["thresholds"]
    assert t["trials"] >= t["grid_points"] > 0 and t["lm_calls_during_trials"] == 0
    assert t["precompute_lm_calls"] > 0
    # The routing cost of what ships is reported (a val question needs at least its grades).
    assert t["requests_per_question"] >= 2 and t["default_requests_per_question"] >= 2
    md = out.with_suffix(".report.md").read_text()
    assert f"Shipped: **{t['shipped']}**" in md and "valid cells between the observed grades" in md
    # The tiny val split is too small to show any gain beyond noise: the defaults ship, saying why; the
    # compiled grader's calibration weighs no evidence, so they are 0.3 / 0.7 carried through it.
    assert t["shipped"] == "defaults" and t["reason"] and "carried" in t["defaults_note"]
    calibration = Calibration().load_state(json.loads(out.read_text())["grader.calibration"])
    carried = tuple(round(calibration(d), 6) for d in (0.3, 0.7))
    assert (t["lower"], t["upper"]) == (t["default_lower"], t["default_upper"]) == carried != (0.3, 0.7)


def test_compiled_program_loads_in_a_fresh_process(compiled):
    _, out, _, settings = compiled
    code = f"""
import sys, json
sys.path.insert(0, {str(Path(__file__).parent)!r})
from crag_dspy.app import load_program
from crag_dspy.settings import Settings
from fakes import ScriptedLM
from test_compile import script
crag = load_program({str(out)!r}, settings=Settings(domain_dir={str(settings.domain_dir)!r},
                    chroma_path={str(settings.chroma_path)!r}, web_search="offline"), lm=ScriptedLM(script), progress=False)
pred = crag(question="What is the omega code?")
print(json.dumps({{"state": crag.dump_state(), "answer": pred.answer, "action": pred.action,
                  "scores": [d.score for d in pred.trace.documents]}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    saved = json.loads(out.read_text())
    assert loaded["state"] == {name: state for name, state in saved.items() if name != "metadata"}
    t = loaded["state"]["thresholds"]
    assert loaded["action"] == decide_action(loaded["scores"], t["lower"], t["upper"]).value
    assert loaded["answer"] == "W700"


def test_tuning_is_pure_rerouting_and_resumable(tmp_path):
    routes = [
        QuestionRoutes(
            "a",
            [0.9],
            {"CORRECT": "x", "AMBIGUOUS": "y", "INCORRECT": "z"},
            {"CORRECT": True, "AMBIGUOUS": False, "INCORRECT": False},
        ),
        QuestionRoutes(
            "b",
            [0.2],
            {"CORRECT": "x", "AMBIGUOUS": "y", "INCORRECT": "z"},
            {"CORRECT": False, "AMBIGUOUS": False, "INCORRECT": True},
        ),
    ]
    assert route_accuracy(routes, 0.3, 0.7) == 1.0 and route_accuracy(routes, 0.1, 0.95) == 0.0
    db = tmp_path / "study.log"
    first = tune_thresholds(routes, storage=db)
    assert first.tuned_accuracy == 1.0 and first.accuracy == 1.0 and first.shipped == "defaults"
    assert not math.isnan(first.trials_per_second)
    resumed = tune_thresholds(routes, storage=db)
    assert resumed.trials == first.trials and math.isnan(resumed.trials_per_second)  # nothing left to run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--domain-dir", "/nonexistent"], "domain directory not found"),
        (["--stages", "grader,bogus"], "unknown stage"),
        (["--objective", "web<0.5"], "use accuracy, truthfulness or web<=X"),
        (["--lm", "gpt-4o"], "not a LiteLLM model string"),
        # Checked before the LM starts or anything is indexed: --lm would fail later if it got there.
        (["--evaluator-base", str(ROOT / "data"), "--lm", "gpt-4o"], "not a transformers model folder"),
    ],
)
def test_bad_invocations_are_clear_errors(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_precompute_answers_each_distinct_context_once():
    from fakes import ListRetriever, ListWebSearch

    from crag_dspy import CRAG
    from crag_dspy.domain import QAPair
    from crag_dspy.protocols import WebResult
    from optimize.thresholds import precompute_routes

    lm = ScriptedLM(script)
    retriever = ListRetriever([("kb-1", "The zeta code is Z100."), ("kb-2", "The theta code is T200.")])
    questions = [
        QAPair(id="a", question="What is the zeta code?", answers=["Z100"], split="val"),
        QAPair(id="b", question="What is the omega code?", answers=["W700"], split="val"),
    ]
    # Standalone LM requests per action: 2 grades, + a rewrite and the web strip's judgement for the
    # web actions, + the internal strip's judgement where it is read, + an answer ("b"'s documents are
    # both graded irrelevant: the better-graded one, kb-1 by rank, still reaches the strip filter,
    # which drops it, and CORRECT answers from it as the internal reserve; "a"'s web strip is about
    # omega and dropped, so INCORRECT answers from it as the web's reserve).
    for web, answer_calls, requests in (
        (
            ListWebSearch([WebResult("O", "u", "The omega code is W700.")]),
            6,
            [{"CORRECT": 3, "AMBIGUOUS": 5, "INCORRECT": 5}, {"CORRECT": 4, "AMBIGUOUS": 6, "INCORRECT": 5}],
        ),
        (
            ListWebSearch([]),
            2,
            [{"CORRECT": 3, "AMBIGUOUS": 4, "INCORRECT": 4}, {"CORRECT": 4, "AMBIGUOUS": 5, "INCORRECT": 4}],
        ),
    ):  # no web: one context per question ("b"'s INCORRECT falls back to internal knowledge, no reserve)
        lm.calls.clear()
        routes, usage = precompute_routes(
            CRAG(retriever, web, CRAGConfig(k=2, reserve_strips=1), lm=lm), questions, progress=False
        )
        answers = [u for s, u in lm.calls if "Answer the question" in s]
        assert len(answers) == len(set(answers)) <= answer_calls
        assert len(lm.calls) == len(set(lm.calls)) == usage.calls
        assert [r.requests for r in routes] == requests
        # One web search for each route that reads the web (a search that found nothing is one too).
        assert [r.web for r in routes] == [{"CORRECT": 0, "AMBIGUOUS": 1, "INCORRECT": 1}] * 2
    assert routes[0].correct["CORRECT"] and not routes[1].correct["CORRECT"]


def test_a_compiled_judge_that_is_worse_on_val_is_not_shipped(tmp_path):
    holder = {}

    def demos_make_it_say_yes(system, user):
        if "You judge" in system and len(holder["lm"].last_messages) > 2:
            return 0.9  # with demos in the conversation, everything is "relevant"
        return script(system, user)

    holder["lm"] = lm = ScriptedLM(demos_make_it_say_yes)
    crag, _, result, _ = compile_tiny_grader(tmp_path, lm, optimizer="labeled", demos=2)
    few_shot = result["candidates"]["few-shot"]
    assert few_shot["demos"] == 2 and few_shot["val"]["accuracy"] < result["before"]["accuracy"] == 1.0
    # All-yes scores cannot be calibrated: the compile says so instead of inventing a map.
    assert few_shot["calibration"]["fitted"] is False and "do not rank" in few_shot["calibration"]["reason"]
    assert result["kept"] == "zero-shot" and crag.grader.predict.demos == []
    assert result["after"] == result["candidates"]["zero-shot"]["val"]


def compile_tiny_grader(tmp_path, lm, demos=0, optimizer="none"):
    """``_compile_judge`` on the tiny domain's grader (8 calibration pairs) with a scripted LM;
    returns the CRAG, the LM, the result and the val examples."""
    import dspy
    from fakes import ListRetriever, ListWebSearch

    from crag_dspy import CRAG
    from crag_dspy.domain import load_domain
    from optimize.datasets import relevance_examples
    from optimize.optimizer import compile_judge as _compile_judge

    domain = load_domain(make_domain(tmp_path / "tiny"))
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    train = relevance_examples(domain.relevance, "train")
    val = relevance_examples(domain.relevance, "val")
    assert len(train) == 8
    with dspy.context(lm=lm):
        result = _compile_judge(
            crag,
            "grader",
            train,
            val,
            "relevant",
            optimizer=optimizer,
            demos=demos,
            calibration_pairs=8,
            seed=0,
            progress=False,
        ).report
    return crag, lm, result, val


TRAIN_KEYS = set(list(KB)[:4])  # make_domain puts the first four KB questions' pairs in train


def test_a_calibration_that_does_not_transfer_to_val_is_not_shipped(tmp_path):
    def drifting(system, user):
        p = script(system, user)
        if key_of(field(user, "question")) in TRAIN_KEYS:  # train: yes-sayer; val: well calibrated
            return 0.99 if p == 0.9 else 0.97
        return p

    crag, _, result, _ = compile_tiny_grader(tmp_path, ScriptedLM(drifting), demos=4)
    # --optimizer none compiles no demos
    assert list(result["candidates"]) == ["zero-shot", "zero-shot + evidence"]
    for candidate in result["candidates"].values():
        assert candidate["calibration"]["fitted"] is True
        assert candidate["val"]["accuracy"] < result["before"]["accuracy"] == 1.0
    assert result["kept"] == "uncompiled" and result["calibration"] is None
    assert result["after"] == result["before"]
    assert crag.grader.calibration.is_identity


def test_calibration_fixes_a_biased_judge_and_is_saved(tmp_path):
    """A judge that ranks well but says yes to everything (P(yes) 0.95 vs 0.8) is 50% accurate at the
    raw 0.5 cut; the calibration fitted on held-out train pairs makes it right on val."""

    def biased(system, user):
        p = script(system, user)
        return 0.95 if p == 0.9 else 0.8 if p == 0.1 else p

    crag, _, result, _ = compile_tiny_grader(tmp_path, ScriptedLM(biased))
    assert result["before"]["accuracy"] == 0.5 and result["after"]["accuracy"] == 1.0
    assert result["kept"] == "zero-shot" and result["calibration"]["fitted"] is True
    assert result["calibration"]["pairs"] == 8
    assert 0.8 < result["calibration"]["cut"] < 0.95
    assert crag.grader.dump_state()["calibration"] == {
        "slope": result["calibration"]["slope"],
        "intercept": result["calibration"]["intercept"],
        "weights": {},
    }


def test_evidence_calibration_ships_when_the_lm_alone_cannot_separate_the_labels(tmp_path):
    """P(yes) that ranks each question's passages right but overlaps across questions (0.45 for some
    positives, 0.55 for some negatives) caps any cut of P(yes) alone; whether the passage holds the
    question's terms tells the rest, and the calibration that weighs it ships with its weights."""
    import dspy

    hard = {"theta", "sigma", "lambda"}  # train and val each have hard questions

    def overlapping(system, user):
        p = script(system, user)
        if "You judge" not in system or key_of(field(user, "question")) not in hard:
            return 0.7 if p == 0.9 else 0.3 if p == 0.1 else p
        return 0.45 if p == 0.9 else 0.55

    crag, lm, result, val = compile_tiny_grader(tmp_path, ScriptedLM(overlapping))
    candidates = result["candidates"]
    assert result["before"]["accuracy"] == 0.5
    assert candidates["zero-shot"]["val"]["accuracy"] < 1.0
    assert result["kept"] == "zero-shot + evidence" and result["after"]["accuracy"] == 1.0
    weights = crag.grader.dump_state()["calibration"]["weights"]
    assert weights == result["calibration"]["weights"] and weights["term_coverage"] > 0
    # The grader now reports the evidence it weighed for each judgement.
    with dspy.context(lm=lm):
        judgement = crag.grader(question=val[0].question, document=val[0].document).judgement
    assert judgement.evidence == {"term_coverage": 1.0, "digit_term_coverage": 1.0, "sentence_coverage": 1.0}


def test_routes_fingerprint_changes_with_anything_a_trial_scores():
    from optimize.thresholds import routes_fingerprint

    correct = {"CORRECT": True, "INCORRECT": False, "AMBIGUOUS": False}
    base = [QuestionRoutes("q1", [0.2, 0.9], {"CORRECT": "a", "INCORRECT": "b", "AMBIGUOUS": "c"}, correct)]
    # Other answer texts and another key order score every trial the same.
    reordered = dict(reversed(correct.items()))
    same = [QuestionRoutes("q1", [0.2, 0.9], {"CORRECT": "x", "INCORRECT": "y", "AMBIGUOUS": "z"}, reordered)]
    regraded = [QuestionRoutes("q1", [0.2, 0.8], base[0].answers, base[0].correct)]
    rejudged = [QuestionRoutes("q1", [0.2, 0.9], base[0].answers, {**base[0].correct, "AMBIGUOUS": True})]
    assert routes_fingerprint(base) == routes_fingerprint(same)  # answer text does not score a trial
    assert len({routes_fingerprint(r) for r in (base, regraded, rejudged)}) == 3


QA_TRAIN_KEYS = {key for i, key in enumerate([*KB, *WEB]) if i % 3 == 0}  # make_domain's QA train split


@pytest.mark.parametrize("demos_help", [True, False])
def test_rewriter_and_answerer_demos_ship_only_when_they_raise_val_accuracy(tmp_path, demos_help):
    holder = {}

    def answering(system, user):
        with_demos = len(holder["lm"].last_messages) > 2
        if "Answer the question using only the context" in system:
            known = key_of(field(user, "question")) in QA_TRAIN_KEYS
            # Demos that help: the answerer was right only on train questions without them. Demos that
            # hurt: it abstains with them. Either way the bootstrap collects demos from train runs.
            if (with_demos and not demos_help) or (not with_demos and demos_help and not known):
                return {"answer": "I don't know"}
        return script(system, user)

    holder["lm"] = lm = ScriptedLM(answering)
    settings = Settings(
        domain_dir=make_domain(tmp_path / "tiny"), chroma_path=tmp_path / "chroma", web_search="offline"
    )
    out = tmp_path / "program.json"
    report = compile_program(
        settings, CompileOptions(stages=("grader", "answerer"), out=out, evaluate_test=False), lm=lm
    )
    generation = report["stages"]["generation"]
    assert generation["demos"]["answerer"] > 0
    accuracy = generation["val_accuracy"]
    assert (accuracy["with demos"] > accuracy["without demos"]) is demos_help
    assert generation["kept"] == ("with demos" if demos_help else "without demos")
    shipped = json.loads(out.read_text())["answerer"]["demos"]
    assert bool(shipped) is demos_help
    assert f"shipped: {generation['kept']}" in out.with_suffix(".report.md").read_text()
    assert report["thresholds"]["lm_calls_during_trials"] == 0


@pytest.mark.parametrize("retry_helps", [True, False])
def test_internal_retry_ships_only_with_a_gain_beyond_noise(tmp_path, retry_helps):
    # The first retrieval grades every passage low, so every val question goes to the web, whose
    # answerer abstains. A retry round's passages (found with the rewritten query) grade high when
    # retries help, and then the answer comes from them.
    def retrying(system, user):
        question = field(user, "question")
        if "You judge" in system:
            passage = field(user, "document") or field(user, "strip") or ""
            return 0.9 if retry_helps and "RETRIED" in passage else 0.1
        if "web search query" in system:
            return {"query": f"{key_of(question)} RETRY"}
        if "queries tried so far" in system:
            return {"query": f"{key_of(question)} again"}
        if "Answer the question using only the context" in system:
            context = field(user, "context")
            match = re.search(rf"RETRIED {key_of(question)} code is (\w+)", context)
            return {"answer": match.group(1) if match else "I don't know"}
        raise AssertionError(system[:60])

    root = make_domain(tmp_path / "tiny")
    # One passage per question that only the rewritten query ("<key> RETRY") ranks first.
    corpus = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()]
    for i, (key, code) in enumerate([*KB.items(), *WEB.items()]):
        corpus.append(
            {"id": f"kb-r{i}", "title": f"{key} RETRY", "text": f"RETRIED {key} code is {code}. {key} RETRY."}
        )
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    settings = Settings(domain_dir=root, chroma_path=tmp_path / "chroma", web_search="offline")
    out = tmp_path / "program.json"
    report = compile_program(
        settings,
        CompileOptions(stages=("retry",), out=out, evaluate_test=False, grader="llm"),
        lm=ScriptedLM(retrying),
    )
    retry = report["internal_retry"]
    assert retry["questions"] > 0 and retry["rounds"] == 2
    assert retry["shipped"] is (retry_helps and retry["p"] < 0.05)
    assert json.loads(out.read_text())["config"]["internal_retries"] == (2 if retry["shipped"] else 0)
    if retry_helps:  # every val question is answered with the rounds; too few questions to ship them
        assert retry["right"]["with"] == retry["questions"] and not retry["shipped"]
    else:
        assert retry["right"]["with"] == retry["right"]["without"] and "not shipped" in retry["why"]
    assert "## internal retry (shipped:" in out.with_suffix(".report.md").read_text()


def test_one_failed_question_is_counted_wrong_in_every_qa_stage_and_the_compile_goes_on(tmp_path):
    domain = make_domain(tmp_path / "tiny")
    settings = Settings(domain_dir=domain, chroma_path=tmp_path / "chroma", web_search="offline")

    def two_unanswerable(system, user):  # delta is a val question, kappa a test question
        if "Answer the question using only the context" in system and key_of(field(user, "question")) in (
            "delta",
            "kappa",
        ):
            return {"answer": ""}  # the LM answers, unusably: these questions' failure, not an outage
        return script(system, user)

    out = tmp_path / "out" / "program.json"
    report = compile_program(
        settings, CompileOptions(stages=("retry",), out=out), lm=ScriptedLM(two_unanswerable)
    )
    assert out.is_file() and out.with_suffix(".report.md").is_file()
    (failed,) = report["thresholds"]["failed"]
    assert failed["id"] == "q4" and "LMUnavailableError" in failed["error"]  # q4: the delta question
    assert report["thresholds"]["questions"] == 3
    assert {(f["id"], f["rounds"]) for f in report["internal_retry"]["failed"]} == {("q4", 0), ("q4", 2)}
    compiled = next(r for r in report["test"] if r["name"] == "CRAG (compiled)")
    rows = {row["id"]: row for row in compiled["rows"]}
    assert "no usable answer" in rows["q2"]["error"] and rows["q2"]["correct"] is False  # q2: kappa
    assert compiled["n"] == 3 and sum(r["correct"] for r in rows.values()) == 2


def test_an_lm_that_is_down_stops_the_compile_fast_with_one_line(tmp_path, capsys, monkeypatch):
    domain = make_domain(tmp_path / "tiny")
    lm = ScriptedLM(lambda system, user: ConnectionError("connection refused"))
    monkeypatch.setattr("optimize.compile.build_lm", lambda *a, **k: lm)
    argv = ["--domain-dir", str(domain), "--chroma-path", str(tmp_path / "chroma"), "--grader", "llm"]
    argv += NO_LM
    assert main([*argv, "--out", str(tmp_path / "out" / "program.json")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "error: the LM scripted/fake failed 2 calls of 2 questions in a row, each after retries with backoff "
        "(ConnectionError: connection refused); the run stopped"
    )
    assert "Traceback" not in err and len(lm.calls) == 2  # the first two grader calls, not the whole val set
    assert not (tmp_path / "out" / "program.json").exists()


def test_evaluator_flags_reach_its_training_config(monkeypatch, tmp_path):
    seen = {}

    def record(settings, options):  # stands in for the compile: only what main passes it matters here
        seen["options"] = options
        raise KeyboardInterrupt

    monkeypatch.setattr("optimize.compile.compile_program", record)
    argv = ["--evaluator-frozen-layers", "0", "--evaluator-epochs", "2", "--out", str(tmp_path / "p.json")]
    assert main(argv) == 130  # stopped by the stand-in's Ctrl-C
    training = seen["options"].evaluator_training
    assert training.frozen_layers == 0 and training.max_epochs == 2
    assert seen["options"].distill is False
    assert main(["--evaluator-distill", "--grader", "evaluator", "--out", str(tmp_path / "p.json")]) == 130
    assert seen["options"].distill is True and seen["options"].grader == "evaluator"


def test_distilling_for_the_llm_grade_source_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(
        "optimize.compile.compile_program", lambda *a, **k: pytest.fail("the compile started")
    )
    assert main(["--evaluator-distill", "--grader", "llm"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --evaluator-distill trains the evaluator; --grader llm ships none\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--demos", "-1"], "argument --demos: must be at least 0, got -1"),
        (["--calibration-pairs", "-3"], "argument --calibration-pairs: must be at least 0, got -3"),
        (["--val-limit", "-1"], "argument --val-limit: must be at least 0, got -1"),
        (["--judge-val-limit", "-1"], "argument --judge-val-limit: must be at least 0, got -1"),
        (["--test-limit", "-2"], "argument --test-limit: must be at least 0, got -2"),
        (["--evaluator-epochs", "0"], "argument --evaluator-epochs: must be at least 1, got 0"),
        (
            ["--evaluator-frozen-layers", "-1"],
            "argument --evaluator-frozen-layers: must be at least 0, got -1",
        ),
        (["--num-threads", "0"], "argument --num-threads: must be at least 1, got 0"),
        (["--seed", "-1"], "argument --seed: must be at least 0, got -1"),  # numpy refuses it, late
        (["--demos", "many"], "argument --demos: 'many' is not a whole number"),
        (
            ["--trials", "-1"],
            "unrecognized arguments: --trials -1",
        ),  # the Optuna grid search has no trial count
    ],
)
def test_meaningless_counts_are_refused_by_the_argument_parser(argv, message, capsys, monkeypatch):
    def refuse(*args, **kwargs):  # a count that got past the parser would start the compile's LM
        raise AssertionError(f"{argv} reached the compile")

    monkeypatch.setattr("optimize.compile.build_lm", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_documents_only_domain_is_refused_before_any_lm_call_with_guidance(tmp_path, capsys, monkeypatch):
    domain = tmp_path / "pump"
    (domain / "corpus").mkdir(parents=True)
    (domain / "corpus" / "pump.md").write_text("# Pump\n\nThe pump moves 40 litres per minute.\n")

    def refuse(*args, **kwargs):
        raise AssertionError("the compile built its LM")

    monkeypatch.setattr("optimize.compile.build_lm", refuse)
    argv = ["--domain-dir", str(domain), "--chroma-path", str(tmp_path / "chroma")]
    assert main([*argv, *NO_LM]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {domain}: not enough labelled data to compile:")
    assert "relevance.jsonl train pairs: 0 of at least 2" in err and "qa.jsonl val questions" in err
    assert f"crag-dspy synthesize --domain-dir {domain}" in err  # the command that makes it
    assert "python -m optimize.relevance_pairs" in err and "Traceback" not in err
    assert not (tmp_path / "chroma").exists()  # nothing opened, nothing asked


def test_an_out_path_that_cannot_be_written_is_refused_before_the_lm_starts(tmp_path, capsys, monkeypatch):
    root = make_domain(tmp_path / "tiny")

    def refuse(*args, **kwargs):
        raise AssertionError("the compile built its LM")

    monkeypatch.setattr("optimize.compile.build_lm", refuse)
    argv = ["--domain-dir", str(root), "--chroma-path", str(tmp_path / "chroma"), *NO_LM]
    (tmp_path / "a-file").write_text("")
    cases = [
        (tmp_path, "is a folder; --out names the file the program is written to"),
        (
            tmp_path / "a-file" / "p.json",
            f"cannot write the program there ({tmp_path / 'a-file'} is a file, not a folder)",
        ),
    ]
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # as root every folder is writable: nothing to refuse there
        cases.append((locked / "p.json", "cannot write the program there (Permission denied)"))
    for out, reason in cases:
        assert main([*argv, "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"error: {out}: {reason}\n"
    assert not (tmp_path / "chroma").exists()  # nothing opened, nothing asked
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".check")] == []
