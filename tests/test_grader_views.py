"""benchmarks/grader_views.py: the grader asked about a passage's best sentences one at a time."""

import importlib.util
from pathlib import Path

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field
from test_focus import CountingEmbedder

from crag_dspy import CRAG
from crag_dspy.focus import SentenceFocus, focus_document, ranked_sentences

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the hotel cap of Travel Policy v4?"
# CountingEmbedder puts "hotel" sentences nearest the question; the term weight then ranks sentences
# by how many of "hotel", "cap" (the question's words beyond the title) they hold.
THREE = (
    "Travel Policy v4\n"
    "Hotel rooms are booked by the travel desk. The hotel cap is 180 velds. Parking is free for visitors."
)
ONE = "Travel Policy v4\nThe hotel cap is 180 velds."


def load_benchmark():
    spec = importlib.util.spec_from_file_location("grader_views", ROOT / "benchmarks" / "grader_views.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("scores", "expected"),
    [([0.1, 0.9, 0.5], [1, 2, 0]), ([0.7, 0.7, 0.2], [0, 1, 2]), ([], [])],
)
def test_ranked_sentences_best_first_ties_in_reading_order(scores, expected):
    assert ranked_sentences(scores) == expected


def test_best_of_takes_the_highest_known_view_and_a_failure_is_unknown():
    views = load_benchmark()
    assert views.best_of([0.2, 0.7, 0.4], 1) == 0.2
    assert views.best_of([0.2, 0.7, 0.4], 2) == 0.7
    assert views.best_of([0.2], 3) == 0.2  # a one-sentence passage has one view
    assert views.best_of([0.2, None], 1) == 0.2
    assert views.best_of([0.2, None], 2) is None


@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        ([0.1, 0.4, 0.6, 0.9], [0, 0, 1, 1], 1.0),
        ([0.1, 0.4, 0.6, 0.9], [1, 0, 1, 0], 0.5),
        ([0.9, 0.1], [0, 1], 0.5),  # reversed: everything yes or everything no
        ([0.5, 0.5], [1, 0], 0.5),  # one score cannot be cut in two
        ([None, 0.9], [1, 1], 0.5),  # unknown is wrong at every cut
    ],
)
def test_best_cut_accuracy(scores, labels, expected):
    assert load_benchmark().best_cut_accuracy(scores, labels) == expected


def test_the_ranked_view_shows_the_title_and_one_sentence_of_that_rank():
    views = load_benchmark()
    focus = SentenceFocus(1, CountingEmbedder())
    first, second = (views.RankedSentenceView(focus, rank) for rank in (0, 1))
    assert first.sentence(QUESTION, THREE) == focus_document(THREE, QUESTION, CountingEmbedder().encode, 1)
    assert first.sentence(QUESTION, THREE) == "Travel Policy v4\nThe hotel cap is 180 velds."
    assert second.sentence(QUESTION, THREE) == "Travel Policy v4\nHotel rooms are booked by the travel desk."
    assert second.sentence(QUESTION, ONE) is None
    with pytest.raises(ValueError, match="no sentence of rank 1"):
        second({"question": QUESTION, "document": ONE})


def grader(script):
    lm = ScriptedLM(script)
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=lm)
    crag.grader.view = SentenceFocus(1, CountingEmbedder())
    return crag.grader, lm


def examples(*documents):
    return [
        dspy.Example(question=QUESTION, document=d, relevant=True).with_inputs("question", "document")
        for d in documents
    ]


def test_each_view_is_one_judgement_and_passages_without_that_sentence_are_not_asked():
    def script(system, user):
        return 0.8 if "hotel cap" in field(user, "document") else 0.1

    judge, lm = grader(script)
    with dspy.context(lm=lm):
        scores, failed = load_benchmark().view_scores(judge, examples(THREE, ONE), 3, progress=False)
    assert failed == 0
    assert [[round(s, 3) for s in per] for per in scores] == [[0.8, 0.1, 0.1], [0.8]]
    shown = [field(user, "document") for _, user in lm.calls]
    assert len(shown) == 4 and shown.count("Travel Policy v4\nThe hotel cap is 180 velds.") == 2


def test_a_failed_view_is_counted_and_unknown():
    def script(system, user):
        if "Parking" in field(user, "document"):
            return RuntimeError("the model server went away")
        return 0.3

    judge, lm = grader(script)
    judge.retries = 0
    with dspy.context(lm=lm):
        scores, failed = load_benchmark().view_scores(judge, examples(THREE), 3, progress=False)
    assert failed == 1
    assert scores[0][:2] == [pytest.approx(0.3, abs=1e-3)] * 2 and scores[0][2] is None


def test_views_need_a_one_sentence_grader():
    judge, _ = grader(lambda system, user: 0.5)
    judge.view = SentenceFocus(2, CountingEmbedder())
    with pytest.raises(ValueError, match="one sentence per passage"):
        load_benchmark().view_scores(judge, examples(THREE), 2, progress=False)


def make_set(n, offset=0):
    """Balanced examples whose passages hold the question's words when relevant."""
    out = []
    for i in range(n):
        relevant = i % 2 == 0
        text = (
            "Travel Policy v4\nThe hotel cap is 180 velds."
            if relevant
            else "Canteen\nSoup is served on Fridays."
        )
        out.append(
            dspy.Example(question=f"{QUESTION} ({offset + i})", document=text, relevant=relevant).with_inputs(
                "question", "document"
            )
        )
    return out


def test_measure_reports_the_second_look_and_the_best_cut():
    views = load_benchmark()
    train, val = make_set(16), make_set(8, offset=100)
    # The model misses every relevant val passage's first sentence but not its second; train is clean.
    train_scores = [[0.9 if e.relevant else 0.1, 0.2] for e in train]
    val_scores = [[0.05, 0.9] if e.relevant else [0.1, 0.2] for e in val]
    one, two = (
        views.measure(
            train, val, [0, 1, 2, 3], train_scores, val_scores, k, calibration_pairs=8, fits=3, seed=0
        )
        for k in (1, 2)
    )
    assert one["uncompiled"]["whole"]["accuracy"] == 0.5 and two["uncompiled"]["whole"]["accuracy"] == 1.0
    assert one["uncompiled"]["sample"]["n"] == 4
    assert two["compiled"]["best_cut_accuracy"] == 1.0
    assert one["compiled"]["best_cut_accuracy"] >= one["compiled"]["whole"]["accuracy"]
    assert two["random_fits"]["n"] == 3 and two["random_fits"]["min"] <= two["random_fits"]["mean"]
    assert set(two["compiled"]["calibration"]["weights"]) == {
        "term_coverage",
        "digit_term_coverage",
        "sentence_coverage",
    }
