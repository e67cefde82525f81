import json
from pathlib import Path

import dspy

from crag_dspy.domain import load_domain
from optimize.datasets import interleave_balanced, relevance_examples, strip_examples


def test_interleave_balanced_alternates_and_is_seeded():
    examples = [dspy.Example(x=i, y=i % 3 == 0) for i in range(12)]
    out = interleave_balanced(examples, "y", seed=1)
    assert [e.y for e in out[:8]] == [True, False] * 4
    assert sorted(e.x for e in out) == list(range(12))
    assert [e.x for e in out] == [e.x for e in interleave_balanced(examples, "y", seed=1)]
    assert [e.x for e in out] != [e.x for e in interleave_balanced(examples, "y", seed=2)]


def test_strip_labels_follow_gold_aliases(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "a", "title": "T", "text": "x"}) + "\n")
    qa = {"id": "q", "question": "What is the fee?", "answers": ["4,800 velds"], "split": "test"}
    (tmp_path / "qa.jsonl").write_text(json.dumps(qa) + "\n")
    passage = "Fees\nThe fee is 4800 velds. Members vote. Meetings are monthly. Dues are paid in May. Bye."
    rel = [
        {"question": "What is the fee?", "passage": passage, "label": 1, "split": "train"},
        {
            "question": "What is the fee?",
            "passage": "Other\nThe fee is unknown.",
            "label": 0,
            "split": "train",
        },
        {
            "question": "Unknown aliases?",
            "passage": "P\nOne. Two. Three. Four. Five.",
            "label": 1,
            "split": "train",
        },
    ]
    (tmp_path / "relevance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rel))
    domain = load_domain(tmp_path)
    examples = strip_examples(domain, "train", sentences_per_strip=3)
    assert [(e.strip.split(".")[0], e.keep) for e in examples] == [
        ("The fee is 4800 velds", True),
        ("Dues are paid in May", False),
        ("The fee is unknown", False),
    ]
    grader = relevance_examples(domain.relevance, "train")
    assert (
        grader[0].document == passage
        and grader[0].relevant is True
        and set(grader[0].inputs().keys()) == {"question", "document"}
    )


def test_round_robin_takes_groups_in_turn_and_keeps_order():
    from optimize.datasets import round_robin

    items = ["kb1", "kb2", "kb3", "web1", "none1", "web2"]
    kind = lambda s: s.rstrip("0123456789")
    assert round_robin(items, kind) == ["kb1", "web1", "none1", "kb2", "web2", "kb3"]
    assert round_robin(items, kind, 4) == ["kb1", "web1", "none1", "kb2"]
    assert round_robin(items, kind, 0) == []
    assert round_robin([], kind, 3) == []
    assert round_robin([None, None], lambda x: "same") == [None, None]  # None is an item, not a gap


def test_spread_takes_whole_groups_evenly_over_the_items():
    from optimize.datasets import spread

    items = [f"q{i}{side}" for i in range(10) for side in "+-"]  # ten questions, a pair each
    question = lambda s: s[:-1]
    assert spread(items, question, 6) == ["q0+", "q0-", "q3+", "q3-", "q6+", "q6-"]
    sample = spread(items, question, 8)
    assert len(sample) == 8 and sample == sorted(sample, key=items.index)
    assert {s[:-1] for s in sample} == {"q0", "q2", "q5", "q7"}  # pairs stay together
    assert spread(items, question, None) == items == spread(items, question, 100)
    assert spread(items, question, 1) == ["q0+"]
    assert spread([], question, 5) == []


def test_the_default_val_sample_spans_both_question_files():
    from crag_dspy.domain import load_domain
    from optimize.datasets import relevance_examples, spread

    val = relevance_examples(load_domain("data/default").relevance, "val")
    first, spread_out = val[:80], spread(val, lambda e: e.question, 80)
    lines = Path("data/default/relevance.jsonl").read_text(encoding="utf-8").splitlines()
    origin = {r["question"]: r["question_id"].split("-")[0] for r in map(json.loads, lines)}
    assert {origin[e.question] for e in first} == {"qa"}  # why the first 80 was a biased sample
    assert {origin[e.question] for e in spread_out} == {"qa", "rq"}
    positives = sum(e.relevant for e in spread_out)
    assert len(spread_out) == 80 and abs(positives - 40) <= 2


def test_qa_split_limit_spans_every_kind():
    from crag_dspy.domain import load_domain
    from optimize.datasets import qa_split

    domain = load_domain("data/default")
    every = qa_split(domain, "test")
    head = qa_split(domain, "test", 8)
    assert {q.kind for q in head} == {q.kind for q in every}
    assert {q.split for q in every} == {"test"}
    assert sorted(q.id for q in every) == sorted(q.id for q in domain.qa if q.split == "test")
