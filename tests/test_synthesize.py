"""python -m optimize.synthesize on a tiny corpus, driven by a scripted LM (control flow and rules only:
what the prompts get out of a real model is measured in docs/synthesize.md)."""

from __future__ import annotations

import csv
import json
import re

import pytest
from fakes import NO_LM, ScriptedLM, field

from crag_dspy.domain import load_domain
from optimize.synthesis.candidates import MAX_TOKENS
from optimize.synthesis.rules import (
    MAX_COPIED_SHARE,
    Reason,
    answer_in,
    copied_share,
    paraphrase_rate,
    question_key,
    reject_reason,
)
from optimize.synthesis.splits import assign_splits, split_quotas
from optimize.synthesize import main

PUMPS = ["Avon", "Brook", "Calder", "Derwent", "Esk", "Frome", "Garry", "Hull"]
DOCS = [
    {
        "id": f"pump-{i}",
        "title": f"{name} pump",
        "text": f"The {name} pump moves {10 + i} litres per minute. It was installed at the {name} works "
        f"in {2000 + i} and is serviced by the {name} crew every spring.",
    }
    for i, name in enumerate(PUMPS)
]
WEB = [
    {
        "id": f"web-{i}",
        "title": f"{name} river",
        "url": f"https://example.org/{name}",
        "text": f"The {name} river is {100 + i} kilometres long and rises in the {name} hills.",
    }
    for i, name in enumerate(PUMPS[:4])
]


def name_in(passage: str) -> str:
    return passage.split()[0]


def good_script(system: str, user: str):
    """A well-behaved question writer: its own words, an answer copied from the passage."""
    passage = field(user, "passage")
    name = name_in(passage)
    if "does not answer" in system:
        return {"question": f"Who designed the {name} machine in the first place?"}
    if "river" in passage:
        length = re.search(r"(\d+) kilometres", passage).group(1)
        return {
            "question": f"How far does the {name} flow from source to sea?",
            "answer": f"{length} kilometres",
        }
    flow = re.search(r"(\d+) litres", passage).group(1)
    return {"question": f"How much water does the {name} unit shift each minute?", "answer": f"{flow} litres"}


def write_domain(tmp_path, *, web=False, qa=(), name="pumps"):
    root = tmp_path / name
    root.mkdir()
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    if web:
        (root / "web.jsonl").write_text("".join(json.dumps(d) + "\n" for d in WEB))
    if qa:
        (root / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qa))
    return root


def as_lines(result):
    """A script's one-question reply ({"question"[, "answer"]}) as the writer's reply: a
    ``question | answer`` line (a reply that stops after one question, which is read for that one)."""
    if isinstance(result, dict) and "question" in result:
        return " | ".join(str(result[name]) for name in ("question", "answer") if name in result)
    return result


@pytest.fixture()
def run(tmp_path, monkeypatch):
    """``run(root, script, *flags)``: main() with a scripted LM on a Chroma folder in tmp_path; returns
    (exit code, the LM). A script's dict is one question per reply (see :func:`as_lines`); a string is
    the reply as it is."""

    def go(root, script=good_script, *flags):
        lm = ScriptedLM(lambda system, user: as_lines(script(system, user)))
        monkeypatch.setattr("optimize.synthesize.build_lm", lambda *a, **k: lm)
        argv = ["--domain-dir", str(root), "--chroma-path", str(tmp_path / "chroma"), *NO_LM, *flags]
        return main(argv), lm

    return go


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def review_rows(root):
    with (root / "synthetic" / "review.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


# --- the rules, as pure functions -------------------------------------------------------------------

PASSAGE = "Avon pump\nThe Avon pump moves 10 litres per minute. It was installed at the Avon works in 2000."


def test_answers_are_found_after_normalisation_and_as_whole_words():
    assert answer_in("10 Litres", PASSAGE) and answer_in("the Avon works", PASSAGE)
    assert answer_in("1,240 velds", "costs 1240 velds.")
    assert not answer_in("1 litres", PASSAGE)  # "10 litres" holds it only as part of a word
    assert not answer_in("", PASSAGE) and not answer_in("...", PASSAGE)


def test_copied_share_counts_question_words_in_runs_lifted_from_the_passage():
    lifted = "What was installed at the Avon works in 2000?"
    own = "Which year did the Avon unit go into service?"
    assert copied_share(lifted, PASSAGE) == 1.0  # installed, avon, works, 2000: all in copied trigrams
    assert copied_share(own, PASSAGE) == 0.0  # "avon" alone is a name, not a copied phrase
    assert paraphrase_rate(own, PASSAGE) == 1.0
    half = "How much does the Avon pump move in an hour?"  # avon, pump (in "the avon pump"), move, hour
    assert copied_share(half, PASSAGE) == pytest.approx(2 / 4)
    assert copied_share("What is it?", PASSAGE) == 0.0  # no content words


@pytest.mark.parametrize(
    "question, answer, seen, kb, reason",
    [
        ("", "10 litres", (), (), Reason.EMPTY),
        ("How much does the unit shift?", "", (), (), Reason.EMPTY),
        ("How much?", "10 litres", (), (), Reason.TOO_SHORT),
        (" ".join(["word"] * 41) + "?", "10 litres", (), (), Reason.TOO_LONG),
        (
            "Which year did the unit arrive?",
            "it was installed at the Avon works in 2000",
            (),
            (),
            Reason.ANSWER_TOO_LONG,
        ),
        (
            "How much water does the unit shift each minute?",
            "12 litres",
            (),
            (),
            Reason.ANSWER_NOT_IN_PASSAGE,
        ),
        ("Does the Avon unit shift 10 litres each minute?", "10 litres", (), (), Reason.ANSWER_IN_QUESTION),
        ("What was installed at the Avon works in 2000?", "Avon pump", (), (), Reason.COPIED),
        (
            "How much water does the unit shift each minute?",
            "10 litres",
            (question_key("How much water does the unit shift, each minute?"),),
            (),
            Reason.DUPLICATE,
        ),
        (
            "How much water does the unit shift each minute?",
            "10 litres",
            (),
            ("Pumps\nAll move 10 litres.",),
            Reason.IN_KNOWLEDGE_BASE,
        ),
        ("How much water does the unit shift each minute?", "10 litres", (), ("Pumps\nOther text.",), None),
        ("Who designed the Avon unit?", None, (), (), None),  # unanswerable: no answer to find
    ],
)
def test_each_rule_rejects_for_its_reason(question, answer, seen, kb, reason):
    assert reject_reason(question, answer, PASSAGE, seen, kb) == reason


def test_the_copy_cut_lies_between_a_lifted_and_a_reworded_question():
    assert copied_share("What was installed at the Avon works in 2000?", PASSAGE) > MAX_COPIED_SHARE
    assert copied_share("When did the Avon pump go into service?", PASSAGE) <= MAX_COPIED_SHARE


# --- splits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("documents", range(1, 12))
def test_split_quotas_cover_every_document_and_give_each_split_one_when_possible(documents):
    quotas = split_quotas(documents)
    assert sum(quotas.values()) == documents and min(quotas.values()) >= 0
    if documents >= 3:
        assert all(quotas[s] >= 1 for s in ("train", "val", "test"))
    keys = [f"d{i}" for i in range(documents)]
    splits = assign_splits(keys, seed=3)
    assert set(splits) == set(keys) and splits == assign_splits(list(reversed(keys)), seed=3)


def test_documents_that_fed_a_split_keep_it_when_documents_are_added():
    first = assign_splits(["a", "b", "c", "d"], seed=0)
    grown = assign_splits(["a", "b", "c", "d", "e", "f", "g", "h"], seed=0, fixed=first)
    assert {k: grown[k] for k in first} == first
    draws = {tuple(sorted(assign_splits(list("abcdefgh"), seed=s).items())) for s in range(5)}
    assert len(draws) > 1  # the seed matters


# --- end to end with a scripted LM -----------------------------------------------------------------


def test_accept_all_writes_synthetic_questions_and_pairs_split_by_document(tmp_path, run):
    root = write_domain(tmp_path)
    code, lm = run(root, good_script, "--questions", "5", "--accept-all")
    assert code == 0
    domain = load_domain(root)  # the files load in the domain format
    assert len(domain.qa) == 5 and all(q.source == "synthetic" for q in domain.qa)
    kinds = [q.kind for q in domain.qa]
    assert kinds.count("none") == 1 and kinds.count("kb") == 4  # 20% the knowledge base cannot answer
    none = next(q for q in domain.qa if q.kind == "none")
    assert none.answers == ["I don't know"] and none.evidence == []
    for q in domain.qa:
        if q.kind == "kb":
            doc = next(d for d in DOCS if d["id"] == q.evidence[0]["doc_id"])
            assert q.answers[0] in q.evidence[0]["quote"] and q.evidence[0]["quote"] in doc["text"]
    # Splits by document: every record of a document is in that document's one split.
    split_of = {}
    for q in domain.qa:
        for e in q.evidence:
            assert split_of.setdefault(e["doc_id"], q.split) == q.split
    pairs = jsonl(root / "relevance.jsonl")
    assert pairs and all(p["source"] == "synthetic" for p in pairs)
    for p in pairs:
        assert p["split"] in ("train", "val")
        assert split_of.setdefault(p["doc_id"], p["split"]) == p["split"]
    for pid in {p["question_id"] for p in pairs}:
        mine = [p for p in pairs if p["question_id"] == pid]
        answer = next(q.answers[0] for q in domain.qa if q.id == pid)
        assert next(p["label"] for p in mine) == 1
        assert all(answer not in p["passage"] for p in mine if p["label"] == 0)
        assert {p.get("negative") for p in mine if p["label"] == 0} <= {"hard", "easy"}
    assert any(p.get("negative") == "hard" for p in pairs)
    assert len(review_rows(root)) == 5 and len(lm.calls) == 5
    assert {r.get("max_tokens") for r in lm.requests} == {MAX_TOKENS}  # a rambling reply is cut short


def test_a_rerun_adds_nothing_and_asks_nothing(tmp_path, run, capsys):
    root = write_domain(tmp_path)
    assert run(root, good_script, "--questions", "4", "--accept-all")[0] == 0
    before = {name: (root / name).read_bytes() for name in ("qa.jsonl", "relevance.jsonl")}
    capsys.readouterr()
    code, lm = run(root, good_script, "--questions", "4", "--accept-all")
    assert code == 0 and lm.calls == []  # the LM is not even asked
    assert {name: (root / name).read_bytes() for name in before} == before
    out = capsys.readouterr().out
    assert "0 new candidate(s)" in out and "0 synthetic added" in out
    # More questions: only the missing ones are asked for, none of the earlier ones again.
    code, lm = run(root, good_script, "--questions", "6", "--accept-all")
    assert code == 0 and len(lm.calls) == 2 and len(load_domain(root).qa) == 6


def test_hand_written_items_are_kept_byte_for_byte(tmp_path, run):
    hand = {"id": "h1", "question": "Who owns the Avon works?", "answers": ["Avon Water"], "split": "test"}
    root = write_domain(tmp_path, qa=[hand])
    original = (root / "qa.jsonl").read_text()
    assert run(root, good_script, "--questions", "3", "--accept-all")[0] == 0
    text = (root / "qa.jsonl").read_text()
    assert text.startswith(original)
    records = jsonl(root / "qa.jsonl")
    assert records[0] == hand and len(records) == 4 and all(r["source"] == "synthetic" for r in records[1:])


def test_without_accept_all_only_the_review_file_is_written_and_apply_review_merges_its_decisions(
    tmp_path, run, capsys
):
    root = write_domain(tmp_path)
    assert run(root, good_script, "--questions", "4")[0] == 0
    assert not (root / "qa.jsonl").exists() and not (root / "relevance.jsonl").exists()
    assert "--apply-review" in capsys.readouterr().out
    rows = review_rows(root)
    assert [r["decision"] for r in rows] == ["accept"] * 4
    rows[0]["decision"] = "reject"  # a person rejects one
    path = root / "synthetic" / "review.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    code, lm = run(root, good_script, "--apply-review")
    assert code == 0 and lm.calls == []
    ids = [q["id"] for q in jsonl(root / "qa.jsonl")]
    assert len(ids) == 3 and rows[0]["id"] not in ids
    # The person's decision survives a rerun that regenerates the review file.
    assert run(root, good_script, "--questions", "4")[0] == 0
    assert review_rows(root)[0]["decision"] == "reject"


def test_a_review_decision_that_is_not_accept_or_reject_is_an_error(tmp_path, run, capsys):
    root = write_domain(tmp_path)
    assert run(root, good_script, "--questions", "2")[0] == 0
    path = root / "synthetic" / "review.csv"
    path.write_text(path.read_text().replace(",accept,", ",maybe,", 1))
    assert run(root, good_script, "--apply-review")[0] == 2
    assert "decision 'maybe' is not accept or reject" in capsys.readouterr().err


def bad_script(system: str, user: str):
    """One bad habit per pump: which rule rejects each question is known."""
    passage = field(user, "passage")
    name = name_in(passage)
    flow = re.search(r"(\d+) litres", passage).group(1)
    if "does not answer" in system:
        return {"question": "Who?"}
    return {
        "Avon": {
            "question": f"The {name} pump moves how many litres per minute?",
            "answer": f"{flow} litres",
        },
        "Brook": {"question": f"How much does the {name} unit shift?", "answer": "99 litres"},
        "Calder": {"question": "How much water does the unit shift each minute?", "answer": f"{flow} litres"},
        "Derwent": {
            "question": "How much water does the unit shift each minute?",
            "answer": f"{flow} litres",
        },
        "Esk": {"question": f"Does the {name} unit shift {flow} litres?", "answer": f"{flow} litres"},
        "Frome": {"question": f"Where does the {name} unit sit?", "answer": passage.split("\n", 1)[1]},
        "Garry": "",  # nothing at all
    }.get(
        name,
        {"question": f"How much water does the {name} unit shift each minute?", "answer": f"{flow} litres"},
    )


def test_rejected_questions_are_recorded_with_their_reason_and_not_written(tmp_path, run, capsys):
    root = write_domain(tmp_path)
    code, _ = run(root, bad_script, "--questions", "40", "--accept-all")
    assert code == 0
    rows = {r["question"] or r["id"]: r for r in review_rows(root)}
    reasons = {name_row: row["reason"] for name_row, row in rows.items()}
    assert reasons["The Avon pump moves how many litres per minute?"] == "copied_from_passage"
    assert reasons["How much does the Brook unit shift?"] == "answer_not_in_passage"
    assert reasons["Does the Esk unit shift 14 litres?"] == "answer_in_question"
    assert reasons["Where does the Frome unit sit?"] == "answer_too_long"
    assert reasons["Who?"] == "question_too_short"
    assert "lm_reply_unparsed" in reasons.values()
    duplicate = [
        r for r in review_rows(root) if r["question"] == "How much water does the unit shift each minute?"
    ]
    assert sorted(r["reason"] for r in duplicate) == ["", "duplicate"]  # the first is kept, the second not
    kept = {q["question"] for q in jsonl(root / "qa.jsonl")}
    assert kept == {
        "How much water does the unit shift each minute?",
        "How much water does the Hull unit shift each minute?",
    }
    assert all(r["decision"] == ("accept" if not r["reason"] else "reject") for r in review_rows(root))
    out = capsys.readouterr().out
    assert "rejected, copied_from_passage: 1" in out


def test_web_only_questions_come_from_web_jsonl_and_must_not_be_in_the_knowledge_base(tmp_path, run):
    root = write_domain(tmp_path, web=True)
    assert run(root, good_script, "--questions", "10", "--accept-all")[0] == 0
    qa = load_domain(root).qa
    web = [q for q in qa if q.kind == "web"]
    assert len(web) == 2 and not any(q.kind == "none" for q in qa)
    assert all(q.evidence[0]["doc_id"].startswith("web-") and "kilometres" in q.answers[0] for q in web)

    def leaks(system, user):  # a web question whose answer the knowledge base also holds
        reply = good_script(system, user)
        if "river" in field(user, "passage"):
            return {"question": "Which crew services the pumps each spring?", "answer": "river"}
        return reply

    other = write_domain(tmp_path, web=True, name="pumps2")
    (other / "corpus.jsonl").write_text(
        (other / "corpus.jsonl").read_text().replace("every spring.", "every spring on the river.")
    )
    assert run(other, leaks, "--questions", "5", "--accept-all")[0] == 0
    web_rows = [r for r in review_rows(other) if r["kind"] == "web"]
    assert web_rows and {r["reason"] for r in web_rows} == {"answer_in_knowledge_base"}


def test_an_lm_that_goes_down_stops_the_run_and_what_was_made_is_kept(tmp_path, run, capsys):
    root = write_domain(tmp_path)
    replies = iter(range(2))

    def dies(system, user):
        if next(replies, None) is None:
            return ConnectionError("connection refused")
        return good_script(system, user)

    code, _ = run(root, dies, "--questions", "5", "--accept-all")
    assert code == 1
    assert "the run stopped" in capsys.readouterr().err  # LMDownError: one line, not a traceback
    assert len(review_rows(root)) == 2 and not (root / "qa.jsonl").exists()
    code, lm = run(root, good_script, "--questions", "5", "--accept-all")
    assert code == 0 and len(lm.calls) == 3 and len(load_domain(root).qa) == 5


def test_the_splits_example_runs():
    import doctest

    import optimize.synthesis.splits

    result = doctest.testmod(optimize.synthesis.splits)
    assert result.attempted and not result.failed


def test_help_names_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert all(flag in out for flag in ("--questions", "--accept-all", "--apply-review", "--seed", "--lm"))
    assert "20% of them" in out


def test_a_question_a_person_wrote_already_is_a_duplicate(tmp_path, run):
    hand = {
        "id": "h1",
        "question": "How much water does the Avon unit shift each minute?",
        "answers": ["10 litres"],
        "split": "val",
    }
    root = write_domain(tmp_path, qa=[hand])
    assert run(root, good_script, "--questions", "10", "--accept-all")[0] == 0
    avon = [r for r in review_rows(root) if r["doc_id"] == "pump-0" and r["kind"] == "kb"]
    assert [r["reason"] for r in avon] == ["duplicate"]
    questions = [q["question"] for q in jsonl(root / "qa.jsonl")]
    assert questions.count(hand["question"]) == 1


def test_the_plan_skips_tried_passages_and_caps_the_attempts():
    from optimize.synthesis.candidates import Candidate, SourcePassage, passages_to_try
    from optimize.synthesize import plan_passages

    kb = [SourcePassage(f"c{i}", "kb", f"d{i}", f"T\nText {i}.") for i in range(10)]
    passages = {"kb": kb, "web": []}
    targets, plan = plan_passages(passages, [], {"kb": 4, "none": 1}, seed=0)
    assert targets == {"kb": 4, "none": 1}
    assert len(plan["kb"]) == passages_to_try(4) and len(plan["none"]) == passages_to_try(1)
    assert plan["kb"] != plan["none"][: len(plan["kb"])]  # another order for the unanswerable ones

    def tried(p, reason):
        return Candidate(
            id=p.id, kind="kb", passage_id=p.id, doc_id=p.doc_id, split="train", passage=p.text,
            question="q", answer="a", copied_share=0.0, reason=reason,
        )  # fmt: skip

    existing = [tried(plan["kb"][0], None), tried(plan["kb"][1], Reason.COPIED)]
    targets, again = plan_passages(passages, existing, {"kb": 4, "none": 1}, seed=0)
    assert targets["kb"] == 3 and len(again["kb"]) == passages_to_try(3)
    assert not {p.id for p in again["kb"]} & {c.passage_id for c in existing}
    targets, done = plan_passages(passages, existing, {"kb": 1}, seed=0)
    assert targets == {"kb": 0} and done == {"kb": []}


def test_each_candidate_is_saved_as_it_is_made(tmp_path, run, monkeypatch):
    root = write_domain(tmp_path)
    lines = []

    def killed(system, user):  # the run is killed after its third question, before its final save
        lines.append((root / "synthetic" / "candidates.jsonl").read_text().count("\n") if lines else 0)
        if len(lines) == 3:
            raise KeyboardInterrupt
        return good_script(system, user)

    assert run(root, killed, "--questions", "5", "--accept-all")[0] == 130  # Ctrl-C: one line, exit 130
    assert lines == [0, 1, 2]  # the file grew by one line per answered question while the run went on


def test_deriving_relevance_pairs_keeps_the_synthetic_ones_and_leaves_synthetic_questions_to_them(tmp_path):
    import json

    from optimize import relevance_pairs

    domain = tmp_path / "d"
    domain.mkdir()
    docs = [
        {"id": "a", "title": "A", "text": "The pump moves 40 litres per minute. It weighs 3 kg."},
        {"id": "b", "title": "B", "text": "The canteen opens at 08:00 on weekdays."},
    ]
    (domain / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    hand = {
        "id": "q1",
        "question": "How much does the pump move?",
        "answers": ["40 litres"],
        "split": "train",
        "evidence": [{"doc_id": "a", "quote": "40 litres per minute"}],
    }
    synthetic = {
        "id": "s1",
        "question": "When does the canteen open?",
        "answers": ["08:00"],
        "split": "train",
        "evidence": [{"doc_id": "b", "quote": "opens at 08:00"}],
        "source": "synthetic",
    }
    (domain / "qa.jsonl").write_text(json.dumps(hand) + "\n" + json.dumps(synthetic) + "\n")
    pair = {
        "question": "When does the canteen open?",
        "passage": "The canteen opens at 08:00 on weekdays.",
        "label": 1,
        "split": "train",
        "source": "synthetic",
    }
    (domain / "relevance.jsonl").write_text(json.dumps(pair) + "\n")
    relevance_pairs.main(["--domain-dir", str(domain)])
    written = [json.loads(line) for line in (domain / "relevance.jsonl").read_text().splitlines()]
    assert [p for p in written if p.get("source") == "synthetic"] == [pair]  # kept as it was
    derived = [p for p in written if p.get("source") != "synthetic"]
    assert derived and {p["question"] for p in derived} == {hand["question"]}


def test_relevance_pairs_on_bad_input_is_one_line_and_keeps_the_labels(tmp_path, capsys):
    from test_compile import make_domain

    from optimize import relevance_pairs

    assert relevance_pairs.main(["--domain-dir", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'}: domain directory not found\n"
    domain = make_domain(tmp_path / "tiny")
    before = (domain / "relevance.jsonl").read_text()
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"id": "x", "question": "?"}\n')  # no answers, no split
    assert relevance_pairs.main(["--domain-dir", str(domain), "--questions", str(extra)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {extra}") and err.count("\n") == 1 and "Traceback" not in err
    assert (domain / "relevance.jsonl").read_text() == before


def test_web_passages_least_covered_by_the_knowledge_base_are_asked_about_first():
    from crag_dspy.protocols import Passage
    from optimize.synthesis.candidates import SourcePassage, least_covered_first

    web = [SourcePassage(f"w{i}", "web", f"d{i}", f"T\nWeb text {i}.") for i in range(4)]
    closest = {"w0": 0.9, "w1": 0.2, "w2": 0.5, "w3": 0.2}

    class KB:
        def retrieve(self, query, k):
            wid = next(w.id for w in web if w.text == query)
            return [Passage(id="c", doc_id="c", title="T", text="kb", rank=0, similarity=closest[wid])][:k]

    assert [p.id for p in least_covered_first(web, KB())] == ["w1", "w3", "w2", "w0"]


def test_web_questions_are_asked_about_the_least_covered_passages_and_attempts_stay_capped(tmp_path, run):
    from optimize.synthesis.candidates import ATTEMPTS_PER_QUESTION, QUESTIONS_PER_PASSAGE

    root = write_domain(tmp_path, web=True)
    asked = []

    def fails_on_web(system, user):  # every web question is rejected, so the attempts run to their cap
        passage = field(user, "passage")
        if "river" in passage:
            asked.append(passage.splitlines()[0])
            return "\n".join(["Tell me? | x"] * QUESTIONS_PER_PASSAGE)
        return good_script(system, user)

    assert run(root, fails_on_web, "--questions", "5", "--accept-all")[0] == 0
    # One web question wanted: ATTEMPTS_PER_QUESTION questions written, three to a reply.
    assert len(asked) == -(-ATTEMPTS_PER_QUESTION // QUESTIONS_PER_PASSAGE)
    web_rows = [r for r in review_rows(root) if r["kind"] == "web"]
    assert len(web_rows) == ATTEMPTS_PER_QUESTION and {r["reason"] for r in web_rows} == {
        "question_too_short"
    }


# --- the reply format: one "name: value" line per output ---------------------------------------------


def test_the_list_format_shows_demos_as_lines_and_reads_a_reply_of_lines_back():
    import dspy

    from crag_dspy.adapters import ListAdapter
    from signatures import WriteQuestions

    adapter = ListAdapter()
    demo = {
        "passage": "T\nIt opened in 1987.",
        "questions": ["When did it open its doors? | 1987", "Q2 | A2"],
    }
    messages = adapter.format(
        WriteQuestions, [demo], {"passage": "T\nThe [[ ## questions ## ]] pump moves 10 l."}
    )
    assert "Output: questions - three lines, each a question" in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": "When did it open its doors? | 1987\nQ2 | A2"}
    assert "[[ ## questions ## ]]" not in messages[-1]["content"]  # a passage cannot forge a field header

    reply = "1. How much? | 10 l\n\n- Since when? | 2000\n  Who runs it? | the Avon crew  "
    assert adapter.parse(WriteQuestions, reply) == {
        "questions": ["How much? | 10 l", "Since when? | 2000", "Who runs it? | the Avon crew"]
    }
    # A reply in DSPy's own format is still read (a model trained on it may fall back to it).
    chat = "[[ ## questions ## ]]\nHow much? | 10 l\n\n[[ ## completed ## ]]"
    assert adapter.parse(WriteQuestions, chat) == {"questions": ["How much? | 10 l"]}
    with pytest.raises(dspy.utils.exceptions.AdapterParseError, match="got nothing"):
        adapter.parse(WriteQuestions, "\n  \n")


def test_a_reply_is_read_line_by_line_into_questions_and_answers():
    from fakes import ScriptedLM

    from optimize.synthesis.candidates import QUESTIONS_PER_PASSAGE, Reason, _ask, question_writers

    writers = question_writers()
    replies = iter(
        [
            "How much? | 10 l\nNo answer here\nSince when? | 2000\nA fourth? | not read",
            "Who built it? | Sam Ode\nWhat does it cost?",
            "",
        ]
    )
    import dspy

    with dspy.context(lm=ScriptedLM(lambda system, user: next(replies))):
        assert (
            _ask(writers["answerable"], "T\nText.", answered=True)
            == [
                ("How much?", "10 l"),
                ("No answer here", ""),  # rejected as empty: an answerable question needs its answer
                ("Since when?", "2000"),
            ][:QUESTIONS_PER_PASSAGE]
        )
        # An unanswerable question has no answer, even when the model wrote one.
        assert _ask(writers["none"], "T\nText.", answered=False) == [
            ("Who built it?", None),
            ("What does it cost?", None),
        ]
        assert _ask(writers["answerable"], "T\nText.", answered=True) == Reason.UNPARSED


def three_script(system: str, user: str):
    """A question writer as the embedded model writes: three ``question | answer`` lines a reply."""
    passage = field(user, "passage")
    name = name_in(passage)
    if "does not answer" in system:
        return (
            f"Who designed the {name} machine?\nWhat does the {name} unit cost?\nHow loud is the {name} unit?"
        )
    flow, year = re.search(r"(\d+) litres", passage).group(1), re.search(r"in (\d{4})", passage).group(1)
    return (
        f"How much water does the {name} unit shift each minute? | {flow} litres\n"
        f"Which year did the {name} unit go into service? | {year}\n"
        f"Which team looks after the {name} unit? | the {name} crew"
    )


def test_each_question_of_a_reply_is_a_candidate_and_the_run_stops_at_the_questions_asked_for(tmp_path, run):
    root = write_domain(tmp_path)
    code, lm = run(root, three_script, "--questions", "5", "--accept-all")
    assert code == 0 and all("Reply with one item per line" in system for system, _ in lm.calls)
    # 4 answerable questions: two replies of three (the second's last two not kept); 1 unanswerable: one.
    assert len(lm.calls) == 3
    rows = review_rows(root)
    assert len(rows) == 5 and len({r["id"] for r in rows}) == 5 and all(not r["reason"] for r in rows)
    qa = load_domain(root).qa
    assert sorted(q.kind for q in qa) == ["kb"] * 4 + ["none"]
    first = [q for q in qa if q.kind == "kb" and q.evidence[0]["doc_id"] == qa[0].evidence[0]["doc_id"]]
    assert len(first) == 3 and len({q.answers[0] for q in first}) == 3  # one passage, three facts
    # A rerun asks nothing: the passages asked about are never asked about again.
    code, lm = run(root, three_script, "--questions", "5", "--accept-all")
    assert code == 0 and lm.calls == []


def test_documents_on_one_subject_share_a_split_so_their_hard_negatives_stay_in_it():
    from optimize.synthesis.candidates import Candidate, SourcePassage
    from optimize.synthesize import _splits

    # Twelve subjects, each with three documents (a person's passages, or namesakes), one web page each.
    kb = [
        SourcePassage(f"c{s}{d}", "kb", f"d{s}-{d}", f"Person {s}\nFact {d}.")
        for s in range(12)
        for d in range(3)
    ]
    web = [SourcePassage(f"w{s}", "web", f"w{s}", f"person {s} \nPage.") for s in range(12)]
    split_of = _splits({"kb": kb, "web": web}, [], seed=0)
    for s in range(12):
        assert len({split_of[f"kb:d{s}-{d}"] for d in range(3)}) == 1
    assert {split_of[f"kb:d{s}-0"] for s in range(12)} == {"train", "val", "test"}
    # A document that fed a candidate keeps its split; its subject follows it.
    moved = "train" if split_of["kb:d0-0"] != "train" else "val"
    fed = Candidate(
        id="x", kind="kb", passage_id="c00", doc_id="d0-0", split=moved, passage="p",
        question="q", answer="a", copied_share=0.0,
    )  # fmt: skip
    again = _splits({"kb": kb, "web": web}, [fed], seed=0)
    assert {again[f"kb:d0-{d}"] for d in range(3)} == {moved}
