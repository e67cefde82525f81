"""optimize.compare: two evaluation runs of one row, question by question (hand-built rows, no LM)."""

import json

import pytest

from optimize.compare import abstaining_on_incorrect, abstaining_when_ungrounded, compare, main, rows_of

ROW = "CRAG (default thresholds)"


def row(qid, answer, correct, action="CORRECT", answerable=True, abstained=False, score=None):
    score = score if score is not None else (1 if correct else 0 if abstained else -1)
    return {
        "id": qid,
        "variant": ROW,
        "answer": answer,
        "correct": correct,
        "abstained": abstained,
        "score": score,
        "action": action,
        "answerable": answerable,
    }


FIRST = [
    row("q1", "412", True),
    row("q2", "100", False, action="INCORRECT"),  # wrong on INCORRECT: abstaining is +1 better
    row("q3", "30 s", True, action="INCORRECT"),  # right on INCORRECT: abstaining is 1 worse
    row("q4", "I don't know", True, action="INCORRECT", answerable=False, abstained=True),
]
SECOND = [
    row("q1", "412", True),
    row("q2", "I don't know", False, action="INCORRECT", abstained=True),
    row("q3", "I don't know", False, abstained=True),
    row("q4", "I don't know", True, answerable=False, abstained=True),
]


def write(path, rows):
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_compare_counts_right_idk_wrong_and_tests_the_pairs(tmp_path):
    result = compare(
        rows_of(write(tmp_path / "a.json", FIRST), ROW), rows_of(write(tmp_path / "b.json", SECOND), ROW)
    )
    first, second = result["first"], result["second"]
    assert (first["right"], first["idk"], first["wrong"]) == (3, 0, 1)
    assert (second["right"], second["idk"], second["wrong"]) == (2, 2, 0)
    assert first["truthfulness"]["mean"] == pytest.approx(0.5)
    assert second["truthfulness"]["mean"] == pytest.approx(0.5)
    assert first["hallucination"]["n"] == 1 and second["unanswerable_abstained"]["n"] == 1
    assert result["sign_test"]["wins"] == 1 and result["sign_test"]["losses"] == 1
    assert [c["id"] for c in result["changed"]] == ["q2", "q3"]


def test_abstaining_on_incorrect_is_the_counterfactual_of_one_run():
    changed = abstaining_on_incorrect({r["id"]: r for r in FIRST})
    assert [(r["answer"], r["correct"], r["score"]) for r in changed.values()] == [
        ("412", True, 1),
        ("I don't know", False, 0),
        ("I don't know", False, 0),
        ("I don't know", True, 1),  # unanswerable: abstaining is right
    ]


def test_the_cli_names_a_missing_row_and_prints_the_comparison(tmp_path, capsys):
    path = write(tmp_path / "a.json", FIRST)
    with pytest.raises(SystemExit, match="no rows of 'plain RAG'"):
        main([str(path), "--variant", "plain RAG", "--incorrect-abstains"])
    assert main([str(path), "--incorrect-abstains", "--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "a abstaining on INCORRECT: right 2/4" in out and "sign test p = 1.000" in out
    assert json.loads((tmp_path / "c.json").read_text())["second"]["idk"] == 2


def test_abstaining_when_ungrounded_needs_rows_that_recorded_it():
    rows = {r["id"]: r | {"ungrounded": ["100"] if r["id"] == "q2" else []} for r in FIRST}
    changed = abstaining_when_ungrounded(rows)
    assert [r["answer"] for r in changed.values()] == ["412", "I don't know", "30 s", "I don't know"]
    with pytest.raises(SystemExit, match="without 'ungrounded'"):
        abstaining_when_ungrounded({r["id"]: r for r in FIRST})
