"""The judges' sentence focus: pure selection, what the LM is shown, the trace, programs, failures."""

import json

import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig, JudgeView
from crag_dspy.judges.view import SentenceFocus, focus_document, ranked_excerpt, top_sentences
from crag_dspy.program import apply_program, read_program, save_program

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


def test_the_focus_is_the_most_similar_sentence():
    assert focus_document(PASSAGE, QUESTION, axis_embed, 1) == (
        "Travel Policy v4\nTravel Policy v4 sets the hotel cap at 180 velds."
    )


def test_the_views_key_names_its_size_and_embedder():
    embedder = type("E", (), {"name": "e"})()
    assert SentenceFocus(1, embedder).key == "focus:1:e" != SentenceFocus(2, embedder).key


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
    assert crag.config.grader_view.sentences == 1  # the default
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
        ListRetriever([("kb-1", PASSAGE.split("\n", 1)[1])]),
        ListWebSearch(),
        CRAGConfig(grader_view=JudgeView(sentences=0)),
        lm=lm,
    )
    pred = crag(question=QUESTION)
    assert crag.grader.view is None and pred.trace.documents[0].graded_text is None
    graded = [field(user, "document") for system, user in lm.calls if "You judge search results" in system]
    assert "canteen" in graded[0]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        JudgeView(sentences=-1)


class BrokenEmbedder:
    name = "broken"

    def encode(self, texts):
        raise RuntimeError("embedding model went away")


def test_a_failing_focus_grades_the_whole_passage_and_says_so():
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
    crag = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(grader_view=JudgeView(sentences=2)))
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"]["grader_view"] == {"sentences": 2}
    loaded = apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc)
    assert loaded.config.grader_view.sentences == 2 and loaded.grader.view.sentences == 2
    doc["config"]["grader_view"] = {"sentences": 0}
    assert apply_program(CRAG(ListRetriever([]), ListWebSearch()), doc).grader.view is None


# Six sentences: two strips of three, each with one sentence about the hotel cap.
LONG = (
    "Receipts are kept for seven years. The hotel cap is 180 velds. Soup is served on Fridays. "
    "Parking is free for visitors. Booking a hotel needs a manager's approval. The canteen opens at eight."
)


def strip_script(system, user):
    if "You judge search results" in system:
        return 0.9
    if "You judge short knowledge strips" in system:
        return 0.9 if "hotel" in field(user, "strip").lower() else 0.05
    if "Answer the question using only the context" in system:
        return {"answer": "180 velds"}
    raise AssertionError(system[:60])


def strips_judged(lm):
    return [field(user, "strip") for system, user in lm.calls if "You judge short knowledge strips" in system]


def test_the_strip_filter_reads_each_strips_best_sentence_and_the_answer_whole_strips():
    lm = ScriptedLM(strip_script)
    crag = CRAG(ListRetriever([("kb-1", LONG)]), ListWebSearch(), lm=lm, embedder=CountingEmbedder())
    assert crag.config.strip_view.sentences == 1  # the default
    pred = crag(question=QUESTION)
    judged = strips_judged(lm)
    assert judged == ["The hotel cap is 180 velds.", "Booking a hotel needs a manager's approval."]
    assert [s.judged_text for s in pred.trace.internal_strips] == judged
    assert all(s.kept for s in pred.trace.internal_strips)
    answered = next(field(u, "context") for s, u in lm.calls if "Answer the question using only" in s)
    assert "Soup is served on Fridays." in answered and "The canteen opens at eight." in answered


def test_the_strip_filter_embeds_nothing_the_graders_view_embedded():
    embedder = CountingEmbedder()
    crag = CRAG(
        ListRetriever([("kb-1", LONG)]), ListWebSearch(), lm=ScriptedLM(strip_script), embedder=embedder
    )
    crag(question=QUESTION)
    assert len(strips_judged(crag.lm)) == 2
    assert len(embedder.embedded) == len(set(embedder.embedded)) == 7  # the question and 6 sentences
    with pytest.raises(ValueError, match="same embedder"):
        SentenceFocus(1, CountingEmbedder(), vectors_of=crag.grader.view)


def test_whole_strips_with_zero_sentences():
    lm = ScriptedLM(strip_script)
    config = CRAGConfig(strip_view=JudgeView(sentences=0))
    crag = CRAG(ListRetriever([("kb-1", LONG)]), ListWebSearch(), config, lm=lm, embedder=CountingEmbedder())
    pred = crag(question=QUESTION)
    assert crag.strip_filter.view is None
    assert strips_judged(lm) == [s.text for s in pred.trace.internal_strips] and len(strips_judged(lm)) == 2
    assert all(s.judged_text is None for s in pred.trace.internal_strips)


def test_a_failing_strip_focus_judges_the_whole_strip_and_says_so():
    lm = ScriptedLM(strip_script)
    config = CRAGConfig(grader_view=JudgeView(sentences=0))
    crag = CRAG(ListRetriever([("kb-1", LONG)]), ListWebSearch(), config, lm=lm, embedder=BrokenEmbedder())
    pred = crag(question=QUESTION)
    assert strips_judged(lm) == [s.text for s in pred.trace.internal_strips]
    assert sum("strip filter's sentence focus failed" in f for f in pred.trace.fallbacks) == 2


def test_the_strip_focus_shows_the_strip_field_without_a_title():
    focus = SentenceFocus(1, CountingEmbedder(), field="strip")
    inputs = {
        "question": QUESTION,
        "strip": "Receipts are kept. The hotel cap is 180 velds. Parking is free.",
    }
    assert focus(inputs) == {"question": QUESTION, "strip": "The hotel cap is 180 velds."}
    assert "field='strip'" in repr(focus)


def test_a_program_saved_before_strip_views_reads_whole_strips(tmp_path):
    crag = CRAG(ListRetriever([]), ListWebSearch())
    path = save_program(crag, tmp_path / "p.json", {"domain": "default"})
    doc = json.loads(path.read_text())
    assert doc["config"]["strip_view"] == {"sentences": 1}
    del doc["config"]["strip_view"]  # as every program compiled before it was written
    path.write_text(json.dumps(doc))
    assert read_program(path)["config"]["strip_view"] == {"sentences": 0}
    assert CRAG(ListRetriever([]), ListWebSearch()).load(path).strip_filter.view is None
