"""The grader's sentence focus: pure selection, what the LM is shown, the trace, programs, failures."""

import json

import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.focus import (
    DEFAULT_TERM_WEIGHT,
    SentenceFocus,
    check_term_stems,
    check_term_weight,
    focus_document,
    ranked_excerpt,
    sentence_scores,
    top_sentences,
)
from crag_dspy.program import ProgramError, apply_program, save_program
from crag_dspy.settings import Settings

QUESTION = "What is the hotel cap of Travel Policy v4?"
PASSAGE = (
    "Travel Policy v4\n"
    "Receipts are kept for seven years. Travel Policy v4 sets the hotel cap at 180 velds. "
    "The canteen serves soup on Fridays. Parking is free for visitors."
)


def axis_embed(texts):
    """Unit vectors on two axes: 'hotel' texts point one way, everything else the other; the question
    (first text) sits between, nearer the hotel axis."""
    vectors = []
    for i, text in enumerate(texts):
        if i == 0:
            vectors.append([0.8, 0.6])
        else:
            vectors.append([1.0, 0.0] if "hotel" in text else [0.0, 1.0])
    return vectors


@pytest.mark.parametrize(
    ("similarities", "n", "expected"),
    [
        ([0.1, 0.9, 0.5], 1, [1]),
        ([0.1, 0.9, 0.5], 2, [1, 2]),  # reading order, not similarity order
        ([0.7, 0.7, 0.7], 2, [0, 1]),  # ties: earlier first
        ([0.3], 3, [0]),  # fewer sentences than asked for
        ([], 1, []),
    ],
)
def test_top_sentences(similarities, n, expected):
    assert top_sentences(similarities, n) == expected


def test_ranked_excerpt_is_the_focus_at_rank_zero_and_none_past_the_last_sentence():
    assert ranked_excerpt(PASSAGE, QUESTION, axis_embed, 0) == focus_document(
        PASSAGE, QUESTION, axis_embed, 1
    )
    assert (
        ranked_excerpt(PASSAGE, QUESTION, axis_embed, 0)
        == "Travel Policy v4\nTravel Policy v4 sets the hotel cap at 180 velds."
    )
    assert ranked_excerpt(PASSAGE, QUESTION, axis_embed, 3) is not None
    assert ranked_excerpt(PASSAGE, QUESTION, axis_embed, 4) is None


def test_top_sentences_refuses_zero():
    with pytest.raises(ValueError, match="n must be >= 1"):
        top_sentences([0.5], 0)


def test_focus_keeps_the_title_and_the_most_similar_sentence():
    focused = focus_document(PASSAGE, QUESTION, axis_embed, 1)
    assert focused == "Travel Policy v4\nTravel Policy v4 sets the hotel cap at 180 velds."


def test_short_passages_and_untitled_text_are_handled_without_surprises():
    short = "Travel Policy v4\nThe hotel cap is 180 velds. Receipts are kept."
    calls = []

    def counting_embed(texts):
        calls.append(texts)
        return axis_embed(texts)

    assert focus_document(short, QUESTION, counting_embed, 2) == short
    assert calls == []  # nothing to choose: no embedding computed
    untitled = "Receipts are kept. The hotel cap is 180 velds. Parking is free."
    assert focus_document(untitled, QUESTION, axis_embed, 1) == "The hotel cap is 180 velds."


SURCHARGE_Q = "How much is the surcharge per unit for expedited service at Dunmore?"
SURCHARGE_DOC = (
    "Dunmore Repair and Calibration Centre: Turnaround Times\n"
    "Expedited service cuts turnaround to 3 working days for a surcharge of 180 velds per unit. "
    "Expedited jobs must be booked before the unit ships, and Dunmore accepts at most 25 expedited units."
)


def entity_embed(texts):
    """What MiniLM did on the default domain: the sentence repeating the question's entities ranks first."""
    return [[1.0, 0.0] if i == 0 or "Dunmore accepts" in t else [0.6, 0.8] for i, t in enumerate(texts)]


@pytest.mark.parametrize(
    ("title", "sentences", "similarities", "weight", "expected"),
    [
        # wanted = question words the title lacks: {hotel, cap}; "travel", "policy", "v4" are in the title
        ("Travel Policy v4", ["hotel cap 180", "Travel Policy v4 hotel"], [0.2, 0.5], 1.0, [1.2, 1.0]),
        ("Travel Policy v4", ["hotel cap 180", "Travel Policy v4 hotel"], [0.2, 0.5], 0.5, [0.7, 0.75]),
        ("Travel Policy v4", ["hotel cap 180", "Travel Policy v4 hotel"], [0.2, 0.5], 0.0, [0.2, 0.5]),
        # the title holds every word: all of them are wanted again
        ("The hotel cap of Travel Policy v4", ["hotel cap", "nothing"], [0.1, 0.1], 1.0, [0.1 + 2 / 5, 0.1]),
        (
            "",
            ["HOTEL Cap!", "cap"],
            [0.0, 0.0],
            1.0,
            [0.4, 0.2],
        ),  # no title: 2 and 1 of all five words, case folded
        ("Travel Policy v4", [], [], 1.0, []),
    ],
)
def test_sentence_scores_add_the_share_of_the_questions_words_the_title_lacks(
    title, sentences, similarities, weight, expected
):
    scores = sentence_scores(QUESTION, title, sentences, similarities, weight)
    assert scores == pytest.approx(expected)


def test_sentence_scores_of_a_question_without_content_words_are_the_similarities():
    assert sentence_scores("What is it?", "Title", ["a b", "c"], [0.3, 0.1], 1.0) == [0.3, 0.1]


def test_the_questions_words_pick_the_sentence_holding_what_is_asked():
    by_terms = focus_document(SURCHARGE_DOC, SURCHARGE_Q, entity_embed, 1)  # the default weight
    assert by_terms.endswith("for a surcharge of 180 velds per unit.")
    by_similarity = focus_document(SURCHARGE_DOC, SURCHARGE_Q, entity_embed, 1, term_weight=0.0)
    assert by_similarity.endswith("at most 25 expedited units.")


CHAIR_Q = "Who chairs the Sarnland Water Authority?"
CHAIR_DOC = (
    "About the Sarnland Water Authority\n"
    "The chair of the Sarnland Water Authority is Corin Maddox, who took office in 2020. "
    "The Sarnland Water Authority has 15 board members. "
    "The chief executive of the Sarnland Water Authority is Hedvig Norrland."
)


def executive_embed(texts):
    """What MiniLM did on the default domain's val split: the chief executive's sentence ranked first."""
    return [[1.0, 0.0] if i == 0 or "chief executive" in t else [0.8, 0.6] for i, t in enumerate(texts)]


def test_the_questions_words_are_matched_by_their_stems():
    # "chairs" is the one word the title lacks; only its stem is in the answer sentence.
    by_stems = focus_document(CHAIR_DOC, CHAIR_Q, executive_embed, 1)  # the default
    assert by_stems.endswith("who took office in 2020.")
    exact = focus_document(CHAIR_DOC, CHAIR_Q, executive_embed, 1, term_stems=False)
    assert exact.endswith("is Hedvig Norrland.")
    sentences = ["The chair of it is Corin Maddox.", "The chief executive is Hedvig Norrland."]
    title = "About the Sarnland Water Authority"
    assert sentence_scores(CHAIR_Q, title, sentences, [0.8, 1.0], 1.0) == pytest.approx([1.8, 1.0])
    assert sentence_scores(CHAIR_Q, title, sentences, [0.8, 1.0], 1.0, term_stems=False) == [0.8, 1.0]


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_term_stems_must_be_true_or_false(value):
    with pytest.raises(ValueError, match="term_stems must be true or false"):
        check_term_stems(value)
    with pytest.raises(ValueError, match="term_stems must be true or false"):
        CRAG(ListRetriever([]), ListWebSearch(), grade_term_stems=value)


def test_term_stems_are_part_of_the_views_key_and_settings():
    embedder = type("E", (), {"name": "e"})()
    assert SentenceFocus(1, embedder, 1.0, True).key != SentenceFocus(1, embedder, 1.0, False).key
    assert Settings().grade_term_stems is True
    assert Settings(grade_term_stems=False).grade_term_stems is False


def test_term_stems_travel_with_the_program(tmp_path):
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=ScriptedLM(grading_script), grade_term_stems=False)
    assert crag.grader.view.term_stems is False
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"]["grade_term_stems"] is False
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc)
    assert loaded.grade_term_stems is False and loaded.grader.view.term_stems is False
    # A program compiled before stems were compared matched the question's words exactly.
    doc["config"]["grade_term_stems"] = True
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.view.term_stems is True
    del doc["config"]["grade_term_stems"]
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.view.term_stems is False
    doc["config"]["grade_term_stems"] = "yes"
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match="invalid grade_term_stems 'yes'"):
        apply_program(fresh, doc)
    assert fresh.grade_term_stems is True  # refused before anything changed
    # Whole passages keep the choice for when sentences are chosen again.
    fresh.grade_sentences = 0
    fresh.grade_term_stems = False
    fresh.grade_sentences = 1
    assert fresh.grader.view.term_stems is False


@pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf"), True, "1", None])
def test_term_weight_must_be_a_finite_number_at_least_zero(weight):
    with pytest.raises(ValueError, match="term_weight must be a finite number >= 0"):
        check_term_weight(weight)
    with pytest.raises(ValueError, match="term_weight must be a finite number >= 0"):
        CRAG(ListRetriever([]), ListWebSearch(), grade_term_weight=weight)


def test_the_term_weight_is_part_of_the_views_key_and_settings():
    embedder = type("E", (), {"name": "e"})()
    assert SentenceFocus(1, embedder, 0.0).key != SentenceFocus(1, embedder, 1.0).key
    assert Settings().grade_term_weight == DEFAULT_TERM_WEIGHT
    with pytest.raises(ValueError, match="grade_term_weight"):
        Settings(grade_term_weight=-1)


def test_sentence_focus_validates_its_size():
    with pytest.raises(ValueError, match="sentences must be >= 1"):
        SentenceFocus(0)


class CountingEmbedder:
    """``axis_embed`` per text (the question, which starts with "What", between the axes), counting
    every text it is asked to embed."""

    name = "counting"

    def __init__(self):
        self.embedded: list[str] = []

    def encode(self, texts):
        self.embedded.extend(texts)
        return [axis_embed(["?", text])[0 if text.startswith("What") else 1] for text in texts]


def test_the_focus_embeds_each_question_and_sentence_once_and_chooses_as_without_reuse():
    other = "Travel Policy v4\nParking is free for visitors. The hotel cap is 180 velds. Soup is on Fridays."
    embedder = CountingEmbedder()
    focus = SentenceFocus(1, embedder)
    for document in (PASSAGE, other, PASSAGE.replace("seven", "ten")):
        shown = focus({"question": QUESTION, "document": document})["document"]
        assert shown == focus_document(document, QUESTION, CountingEmbedder().encode, 1)
    # 3 passages, 4 + 3 + 4 sentences, 4 of them shared, and the question: 8 distinct texts.
    assert len(embedder.embedded) == len(set(embedder.embedded)) == 8


def test_the_focus_keeps_a_bounded_number_of_vectors(monkeypatch):
    monkeypatch.setattr(SentenceFocus, "VECTORS_KEPT", 3)
    embedder = CountingEmbedder()
    focus = SentenceFocus(1, embedder)
    first = focus({"question": QUESTION, "document": PASSAGE})  # the question and 4 sentences, 3 kept
    assert len(focus._vectors) == 3
    focus._focus.cache_clear()
    assert focus({"question": QUESTION, "document": PASSAGE}) == first
    assert len(embedder.embedded) == 5 + 2  # the two dropped (the question, the first sentence) again


def grading_script(system, user):
    if "You judge search results" in system:
        return 0.9 if "hotel cap" in field(user, "document") else 0.05
    if "Answer the question using only the context" in system:
        return {"answer": "180 velds"}
    raise AssertionError(system[:60])


def test_the_grader_reads_the_focus_and_the_trace_shows_it():
    lm = ScriptedLM(grading_script)
    crag = CRAG(ListRetriever([("kb-1", PASSAGE.split("\n", 1)[1])]), ListWebSearch(), lm=lm)
    assert crag.grade_sentences == 1  # the default
    pred = crag(question=QUESTION)
    graded = [field(user, "document") for system, user in lm.calls if "You judge search results" in system]
    (document,) = pred.trace.documents
    assert graded == [document.graded_text]
    assert "hotel cap" in document.graded_text and "canteen" not in document.graded_text
    assert pred.action == "CORRECT" and pred.answer == "180 velds"
    # Only grading reads the excerpt: the knowledge strip holds the whole passage.
    (strip,) = pred.trace.internal_strips
    assert strip.kept and "canteen" in strip.text


def test_whole_passages_with_zero_sentences():
    lm = ScriptedLM(grading_script)
    crag = CRAG(
        ListRetriever([("kb-1", PASSAGE.split("\n", 1)[1])]), ListWebSearch(), lm=lm, grade_sentences=0
    )
    pred = crag(question=QUESTION)
    assert crag.grader.view is None and pred.trace.documents[0].graded_text is None
    graded = [field(user, "document") for system, user in lm.calls if "You judge search results" in system]
    assert "canteen" in graded[0]
    with pytest.raises(ValueError, match="grade_sentences must be an integer >= 0"):
        crag.grade_sentences = -1


def test_a_failing_focus_grades_the_whole_passage_and_says_so():
    class BrokenEmbedder:
        name = "broken"

        def encode(self, texts):
            raise RuntimeError("embedding model went away")

    lm = ScriptedLM(grading_script)
    crag = CRAG(
        ListRetriever([("kb-1", PASSAGE.split("\n", 1)[1])]),
        ListWebSearch(),
        lm=lm,
        embedder=BrokenEmbedder(),
    )
    pred = crag(question=QUESTION)
    graded = [field(user, "document") for system, user in lm.calls if "You judge search results" in system]
    assert "canteen" in graded[0]  # the whole passage
    assert pred.trace.documents[0].score == pytest.approx(0.9, abs=1e-6)
    assert any(
        "sentence focus failed" in f and "embedding model went away" in f for f in pred.trace.fallbacks
    )


def test_the_focus_travels_with_the_program(tmp_path):
    crag = CRAG(ListRetriever([]), ListWebSearch(), grade_sentences=2)
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"]["grade_sentences"] == 2
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grade_sentences == 2
    del doc["config"]["grade_sentences"]  # a program compiled before the focus existed graded whole passages
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grade_sentences == 0
    doc["config"]["grade_sentences"] = "two"
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match="invalid grade_sentences 'two'"):
        apply_program(fresh, doc)
    assert fresh.grade_sentences == 1  # refused before anything changed


def test_the_term_weight_travels_with_the_program(tmp_path):
    crag = CRAG(ListRetriever([]), ListWebSearch(), lm=ScriptedLM(grading_script), grade_term_weight=0.25)
    assert crag.grader.view.term_weight == 0.25
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"]["grade_term_weight"] == 0.25
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc)
    assert loaded.grade_term_weight == 0.25 and loaded.grader.view.term_weight == 0.25
    # A program compiled before the question's words counted chose sentences by similarity alone.
    del doc["config"]["grade_term_weight"]
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.view.term_weight == 0.0
    doc["config"]["grade_term_weight"] = "high"
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    with pytest.raises(ProgramError, match="invalid grade_term_weight 'high'"):
        apply_program(fresh, doc)
    assert fresh.grade_term_weight == DEFAULT_TERM_WEIGHT  # refused before anything changed
    # Whole passages keep the weight for when sentences are chosen again.
    crag.grade_sentences = 0
    crag.grade_term_weight = 2.0
    assert crag.grader.view is None
    crag.grade_sentences = 1
    assert crag.grader.view.term_weight == 2.0
