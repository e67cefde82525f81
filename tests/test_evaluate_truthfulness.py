"""Truthfulness (Meta's CRAG benchmark: right +1, "I don't know" 0, wrong -1), hallucinations and right
citations in the evaluation's rows, summary and report, on hand-built questions and outcomes: no LM,
no store."""

import json
from types import SimpleNamespace

import pytest

from crag_dspy.domain import QAPair
from crag_dspy.routing import Action
from optimize.evaluate import answer_fields, summarize
from optimize.report import _signs, write_evaluation_report
from optimize.variants import Outcome, Variant

PLAIN = Variant("plain RAG", "plain_rag", "default", "baseline")
CRAG_ROW = Variant("CRAG (program)")
IDK = ["I don't know"]


def cite(doc_id, page=None):
    """A stand-in for ``crag_dspy.citations.Citation``: what the evaluation reads of one."""
    return SimpleNamespace(doc_id=doc_id, page=page, quote="...")


def qa(qid, answers, evidence=None):
    extra = {"evidence": evidence} if evidence is not None else {}
    return QAPair(id=qid, question=f"question {qid}?", answers=answers, split="test", **extra)


# The questions: answerable with evidence (with a page, without one), unanswerable, answerable without
# evidence.
QUESTIONS = {
    "q1": qa("q1", ["90 days"], [{"doc_id": "pdf/a.pdf", "page": 3, "quote": "every 90 days"}]),
    "q2": qa("q2", ["Z100"], [{"doc_id": "pdf/b.pdf", "quote": "code Z100"}]),
    "q3": qa("q3", IDK),
    "q4": qa("q4", ["IP68"]),
    "q5": qa("q5", ["5 bar"], [{"doc_id": "pdf/c.pdf", "page": 1, "quote": "5 bar"}]),
    "q6": qa("q6", ["7 days"], [{"doc_id": "pdf/d.pdf", "page": 2, "quote": "7 days"}]),
}
OUTCOMES = {
    CRAG_ROW: {
        "q1": Outcome("Every 90 days.", Action.CORRECT, citations=(cite("pdf/a.pdf", 3),)),  # cited right
        "q2": Outcome("Z100", Action.CORRECT, citations=(cite("pdf/b.pdf", 9),)),  # any page of b: right
        "q3": Outcome("I don't know", Action.INCORRECT),  # unanswerable, abstained: right
        "q4": Outcome("I do not know.", Action.AMBIGUOUS),  # answerable, abstained: 0
        "q5": Outcome(None, error="CRAGRunError: boom"),  # failed: wrong
        "q6": Outcome("7 days", Action.CORRECT, citations=(cite("pdf/d.pdf", 5),)),  # right, wrong page
    },
    PLAIN: {
        "q1": Outcome("30 days"),  # wrong
        "q2": Outcome("Z100"),
        "q3": Outcome("It is 90 days."),  # unanswerable, answered: a hallucination
        "q4": Outcome("IP68"),
        "q5": Outcome("I don't know"),
        "q6": Outcome("7 days"),
    },
}


def make_rows(questions=QUESTIONS, outcomes=OUTCOMES):
    """Question rows as ``_question_rows`` builds them, with a made-up cost."""
    rows = []
    for qid, q in questions.items():
        for variant, answers in outcomes.items():
            outcome = answers[qid]
            rows.append(
                {
                    "id": qid,
                    "variant": variant.name,
                    **answer_fields(q, outcome),
                    "requests": 2,
                    "tokens": 110,
                    "calls": 1,
                    "prompt_tokens": 100,
                    "cached_prompt_tokens": 0,
                    "completion_tokens": 10,
                    "seconds": 0.5,
                    "errors": [outcome.error] if outcome.error else [],
                    "retrieval_has_answer": qid != "q1",
                }
            )
    return rows


def by_name(table):
    return {row["name"]: row for row in table}


@pytest.mark.parametrize(
    ("q", "outcome", "expected"),
    [
        (QUESTIONS["q3"], Outcome("I don't know"), (True, True, 1)),  # unanswerable, abstained: right
        (QUESTIONS["q3"], Outcome("90 days"), (False, False, -1)),  # unanswerable, answered: wrong
        (QUESTIONS["q4"], Outcome("I don't know"), (False, True, 0)),  # answerable, abstained
        (QUESTIONS["q4"], Outcome("IP68"), (True, False, 1)),
        (QUESTIONS["q4"], Outcome("IP67"), (False, False, -1)),
        (QUESTIONS["q4"], Outcome(None, error="boom"), (False, False, -1)),  # an error is wrong
        (QUESTIONS["q3"], Outcome(None, error="boom"), (False, False, -1)),
    ],
)
def test_a_row_scores_right_abstained_and_wrong(q, outcome, expected):
    fields = answer_fields(q, outcome)
    assert (fields["correct"], fields["abstained"], fields["score"]) == expected
    assert fields["cited_right"] is None and fields["citations"] == []  # no evidence: not measured


@pytest.mark.parametrize(
    ("qid", "outcome", "cited_right"),
    [
        ("q1", Outcome("90 days", citations=(cite("pdf/a.pdf", 3),)), True),
        ("q1", Outcome("90 days", citations=(cite("pdf/a.pdf", 4),)), False),  # the evidence's page differs
        ("q1", Outcome("90 days", citations=(cite("pdf/a.pdf"),)), False),  # no page where one is expected
        ("q1", Outcome("90 days", citations=(cite("pdf/x.pdf", 3), cite("pdf/a.pdf", 3))), True),
        ("q1", Outcome("90 days"), False),  # right, citing nothing
        ("q1", Outcome("30 days", citations=(cite("pdf/a.pdf", 3),)), False),  # a wrong answer
        ("q1", Outcome("I don't know", citations=(cite("pdf/a.pdf", 3),)), False),
        ("q2", Outcome("Z100", citations=(cite("pdf/b.pdf", 9),)), True),  # evidence without a page
        ("q2", Outcome("Z100", citations=(cite("pdf/b.pdf"),)), True),
        ("q2", Outcome("Z100", citations=(cite("pdf/a.pdf", 3),)), False),
        ("q4", Outcome("IP68", citations=(cite("pdf/a.pdf", 3),)), None),  # no evidence: not measured
    ],
)
def test_a_row_is_cited_right_when_right_and_citing_the_evidence(qid, outcome, cited_right):
    assert answer_fields(QUESTIONS[qid], outcome)["cited_right"] is cited_right


def test_a_row_stores_citations_as_json_and_reads_evidence_from_qa_jsonl(tmp_path):
    # Evidence is an extra field of a qa.jsonl line, kept by the loader.
    q = QAPair.model_validate_json(
        json.dumps(
            {
                "id": "q1",
                "question": "How often?",
                "answers": ["90 days"],
                "split": "test",
                "evidence": [{"doc_id": "pdf/a.pdf", "page": 3, "quote": "every 90 days"}],
            }
        )
    )
    fields = answer_fields(q, Outcome("90 days", Action.CORRECT, citations=(cite("pdf/a.pdf", 3),)))
    assert fields["citations"] == [{"doc_id": "pdf/a.pdf", "page": 3}]
    assert fields["cited_right"] is True and fields["action"] == "CORRECT" and fields["answerable"]
    assert json.loads(json.dumps(fields)) == fields  # the row is JSON as it is


def test_summarize_counts_truthfulness_hallucinations_and_citations():
    table = by_name(summarize(make_rows(), [PLAIN, CRAG_ROW]))
    crag = table["CRAG (program)"]
    # Scores: q1 +1, q2 +1, q3 +1 (unanswerable, "I don't know"), q4 0, q5 -1 (error), q6 +1.
    assert crag["correct"] == 4 and crag["errors"] == 1
    assert crag["abstained"]["n"] == 2 and crag["abstained"]["of"] == 6
    assert crag["hallucination"]["n"] == 1 and crag["hallucination"]["rate"] == pytest.approx(1 / 6)
    assert crag["truthfulness"]["mean"] == pytest.approx(3 / 6)
    low, high = crag["truthfulness"]["interval"]
    assert -1 <= low < 0.5 < high <= 1
    right = crag["answerable_right"]
    assert (right["n"], right["of"], right["rate"]) == (3, 5, 0.6)
    assert right["interval"] == pytest.approx([0.2307, 0.8824], abs=1e-4)  # Wilson 95% of 3/5
    assert (crag["answerable_abstained"]["n"], crag["answerable_abstained"]["of"]) == (1, 5)
    assert (crag["unanswerable_abstained"]["n"], crag["unanswerable_abstained"]["of"]) == (1, 1)
    # Right answers to answerable questions with evidence: q1 (page 3), q2 (no page), q6 (wrong page).
    assert (crag["cited"]["n"], crag["cited"]["of"]) == (2, 3)
    assert crag["cited"]["rate"] == pytest.approx(2 / 3) and len(crag["cited"]["interval"]) == 2

    plain = table["plain RAG"]
    # Scores: q1 -1, q2 +1, q3 -1 (unanswerable, answered), q4 +1, q5 0, q6 +1.
    assert plain["correct"] == 3 and plain["abstained"]["n"] == 1
    assert plain["hallucination"]["n"] == 2
    assert plain["truthfulness"]["mean"] == pytest.approx(1 / 6)
    assert (plain["unanswerable_abstained"]["n"], plain["unanswerable_abstained"]["of"]) == (0, 1)
    assert plain["cited"] is None  # a baseline cites nothing: not measured
    # truthfulness = accuracy - hallucination rate, every row
    for row in table.values():
        assert row["truthfulness"]["mean"] == pytest.approx(row["accuracy"] - row["hallucination"]["rate"])


def test_summarize_is_deterministic_and_measures_no_citations_without_evidence():
    rows = make_rows()
    assert summarize(rows, [PLAIN, CRAG_ROW]) == summarize(rows, [PLAIN, CRAG_ROW])
    bare = {qid: qa(qid, q.answers) for qid, q in QUESTIONS.items()}  # the same questions, no evidence
    table = by_name(summarize(make_rows(bare), [PLAIN, CRAG_ROW]))
    assert table["CRAG (program)"]["cited"] is None and table["plain RAG"]["cited"] is None
    assert table["CRAG (program)"]["truthfulness"]["mean"] == pytest.approx(3 / 6)


def report_of(rows, variants):
    table = summarize(rows, variants)
    for entry in table:
        entry["marginal"] = {"requests": 12}
    return {
        "domain": "tiny",
        "split": "test",
        "questions": len({r["id"] for r in rows}),
        "lm": "scripted/fake",
        "program": None,
        "thresholds": {"main": {"lower": 0.3, "upper": 0.7}},
        "created": "2026-01-01T00:00:00+00:00",
        "variants": table,
        "grader": [],
        "cost": {
            "lm_requests": 24,
            "lm_calls": 12,
            "prompt_tokens": 1200,
            "completion_tokens": 120,
            "standalone_lm_requests": 24,
            "grader_quality_lm_requests": 0,
            "seconds": 6.0,
        },
        "rows": rows,
        "plot": "tiny-test.png",
    }


def test_the_report_table_gains_truthfulness_columns_and_the_paired_sign_test(tmp_path):
    json_path, md_path = write_evaluation_report(report_of(make_rows(), [PLAIN, CRAG_ROW]), tmp_path / "r")
    md = md_path.read_text()
    assert (
        "| variant | accuracy | abstained | hallucinated | truthfulness [95% CI] | cited right "
        "| correction success | LM requests/q (cached) | LM tokens/q | prompt tok/q served "
        "| completion tok/q served | s/q p50 | s/q p95 | new requests | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    ) in md
    crag = next(line for line in md.splitlines() if line.startswith("| CRAG (program) | 66.7%"))
    cells = [c.strip() for c in crag.strip("|").split("|")]
    assert cells[1] == "66.7% [30.0, 90.3] (4/6)"
    assert cells[2] == "2 (33.3%): 1/5 answerable, 1/1 unanswerable"
    assert cells[3] == "16.7% [3.0, 56.4] (1/6)"
    assert cells[4].startswith("+0.50 [") and cells[4].endswith("]")
    assert cells[5] == "2/3 (66.7%)"
    assert cells[8] == "110"  # LM tokens per question: every request's, cached or not
    assert cells[-1] == "1"  # errors
    plain = next(line for line in md.splitlines() if line.startswith("| plain RAG | 50.0%"))
    assert "| 1 (16.7%): 1/5 answerable, 0/1 unanswerable | 33.3% [9.7, 70.0] (2/6) | +0.17 [" in plain
    assert "| n/a |" in plain
    assert (
        'right +1 / "I don\'t know" 0 / wrong -1' in md
        and 'hallucinated = wrong and not "I don\'t know"' in md
    )
    assert "cited right = right answers to answerable questions with gold evidence" in md
    # McNemar: only CRAG right on q1 and q3, only plain RAG on q4. Truthfulness: CRAG wins q1 and q3,
    # loses q4 (0 < +1) and q5 (-1 < 0), ties q2 and q6.
    assert (
        "| CRAG (program) | plain RAG | 2 | 1 | 1.000 | no measured difference | 2 / 2 / 2 | 1.000 "
        "| no measured difference |"
    ) in md
    saved = json.loads(json_path.read_text())
    row = by_name(saved["variants"])["CRAG (program)"]
    assert {"abstained", "hallucination", "truthfulness", "cited", "answerable_right"} <= row.keys()
    assert {"abstained", "score", "citations", "cited_right"} <= saved["rows"][0].keys()


def test_the_report_leaves_out_what_was_not_measured(tmp_path):
    # No evidence: no cited-right column. No unanswerable question: no breakdown of abstentions.
    questions = {qid: qa(qid, q.answers) for qid, q in QUESTIONS.items() if qid != "q3"}
    outcomes = {v: {qid: o for qid, o in answers.items() if qid != "q3"} for v, answers in OUTCOMES.items()}
    _, md_path = write_evaluation_report(
        report_of(make_rows(questions, outcomes), [PLAIN, CRAG_ROW]), tmp_path / "r"
    )
    md = md_path.read_text()
    assert "cited right" not in md and "| n/a |" not in md
    assert (
        "| variant | accuracy | abstained | hallucinated | truthfulness [95% CI] | correction success |" in md
    )
    assert "| CRAG (program) | 60.0% [23.1, 88.2] (3/5) | 1 (20.0%) | 20.0% [3.6, 62.4] (1/5) | +0.40 [" in md


def test_the_verdict_follows_the_sign_test(tmp_path):
    # CRAG abstains where plain RAG is wrong on 6 questions: no accuracy difference at all, a truthfulness
    # difference a coin gives with p = 2 / 64.
    questions = {f"q{i}": qa(f"q{i}", ["90 days"]) for i in range(6)}
    outcomes = {
        CRAG_ROW: {qid: Outcome("I don't know", Action.AMBIGUOUS) for qid in questions},
        PLAIN: {qid: Outcome("30 days") for qid in questions},
    }
    _, md_path = write_evaluation_report(
        report_of(make_rows(questions, outcomes), [PLAIN, CRAG_ROW]), tmp_path / "r"
    )
    assert (
        "| CRAG (program) | plain RAG | 0 | 0 | 1.000 | no measured difference | 6 / 0 / 0 | 0.031 | better |"
    ) in md_path.read_text()


def test_the_compile_reports_test_rows_get_the_sign_test_from_their_answers():
    # measure.py's rows carry answer and correct, no score: abstaining needs no gold.
    rows = [
        {"id": "a", "answer": "I don't know", "correct": False},  # 0
        {"id": "b", "answer": "I don't know", "correct": True},  # +1: unanswerable
        {"id": "c", "answer": None, "correct": False, "error": "boom"},  # -1
        {"id": "d", "answer": "x", "correct": True},  # +1
    ]
    reference = [
        {"id": "a", "answer": "y", "correct": False},  # -1
        {"id": "b", "answer": "y", "correct": False},  # -1
        {"id": "c", "answer": "I don't know", "correct": False},  # 0
        {"id": "d", "answer": "x", "correct": True},  # +1
    ]
    assert _signs(rows, reference) == "2 / 1 / 1, p=1.000"
    assert _signs([{**r, "score": 1} for r in rows], reference) == "3 / 0 / 1, p=0.250"  # its own score


def test_a_web_citation_by_url_counts_for_evidence_naming_the_web_document():
    q = qa("w1", ["90 days"], [{"doc_id": "web-004", "quote": "every 90 days"}])
    outcome = Outcome("every 90 days", Action.INCORRECT, citations=(cite("https://ihsc.example/wq17"),))
    assert answer_fields(q, outcome)["cited_right"] is False  # the URL is not the document's id
    assert answer_fields(q, outcome, {"web-004": "https://ihsc.example/wq17"})["cited_right"] is True
    assert answer_fields(q, outcome, {"web-005": "https://ihsc.example/wq17"})["cited_right"] is False
