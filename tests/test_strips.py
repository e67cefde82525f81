import pytest

from crag_dspy.chunking import chunk_document, chunk_text
from crag_dspy.strips import Strip, decompose, format_context, recompose, select_strips, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two. Three.", ["One.", "Two.", "Three."]),
        ("Costs rose 3.5 percent. Then fell.", ["Costs rose 3.5 percent.", "Then fell."]),
        ("See e.g. Annex B for details. Next.", ["See e.g. Annex B for details.", "Next."]),
        ("Dr. Quist signed it. J. Smith agreed.", ["Dr. Quist signed it.", "J. Smith agreed."]),
        ("Is it? Yes! Done.", ["Is it?", "Yes!", "Done."]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
        ("lowercase. after period stays", ["lowercase. after period stays"]),
        ("  spaced \n\n text.  ", ["spaced text."]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_short_passage_is_one_strip():
    assert decompose("Only one sentence.") == ["Only one sentence."]
    assert decompose("First sentence. Second sentence.") == ["First sentence. Second sentence."]
    assert decompose("") == []


def test_long_passage_windows_and_no_orphan_sentence():
    text = " ".join(f"Sentence {i}." for i in range(1, 8))  # 7 sentences
    assert decompose(text, 3) == [
        "Sentence 1. Sentence 2. Sentence 3.",
        "Sentence 4. Sentence 5. Sentence 6. Sentence 7.",
    ]
    assert decompose(text, 2)[-1] == "Sentence 5. Sentence 6. Sentence 7."
    assert decompose(text, 1) == [f"Sentence {i}." for i in range(1, 8)]
    with pytest.raises(ValueError):
        decompose(text, 0)


def test_decompose_keeps_every_sentence_once():
    text = " ".join(f"Fact number {i} is here." for i in range(1, 12))
    for n in range(1, 6):
        assert " ".join(decompose(text, n)) == text


def _strip(text, source="internal", rank=0, position=0):
    return Strip(text, source, f"d{rank}", f"T{rank}", rank, position)


def test_select_strips_threshold_topk_and_unknown():
    a, b, c, d = _strip("a", rank=0), _strip("b", rank=1), _strip("c", rank=2), _strip("d", rank=3)
    scored = [(a, 0.9), (b, 0.49), (c, None), (d, 0.5)]
    assert select_strips(scored, 0.5, 5) == [a, d]
    assert select_strips(scored, 0.5, 1) == [a]
    assert select_strips(scored, 0.0, 5) == [a, d, b]  # unknown is never kept
    tie = [(_strip("x", rank=2), 0.8), (_strip("y", rank=1), 0.8)]
    assert [s.text for s in select_strips(tie, 0.5, 1)] == ["y"]


def test_select_strips_makes_up_at_least_the_best_below_the_threshold():
    a, b, c, d = (_strip(t, rank=i) for i, t in enumerate("abcd"))
    scored = [(a, 0.9), (b, 0.49), (c, None), (d, 0.5)]
    assert select_strips(scored, 0.5, 5, at_least=1) == [a, d]  # enough pass: nothing added
    assert select_strips(scored, 0.95, 5, at_least=0) == []
    assert select_strips(scored, 0.95, 5, at_least=1) == [a]
    assert select_strips(scored, 0.95, 5, at_least=2) == [a, d]
    assert select_strips(scored, 0.95, 5, at_least=4) == [a, d, b]  # unknown is never kept
    assert select_strips(scored, 0.95, 1, at_least=2) == [a]  # max_strips still caps
    assert select_strips([(a, None), (b, None)], 0.5, 5, at_least=1) == []
    tie = [(_strip("x", rank=2), 0.1), (_strip("y", rank=1), 0.1)]
    assert [s.text for s in select_strips(tie, 0.5, 5, at_least=1)] == ["y"]


def test_recompose_restores_original_order():
    strips = [
        _strip("r1p1", rank=1, position=1),
        _strip("r0p2", rank=0, position=2),
        _strip("r1p0", rank=1, position=0),
        _strip("r0p0", rank=0, position=0),
    ]
    assert [s.text for s in recompose(strips)] == ["r0p0", "r0p2", "r1p0", "r1p1"]


def test_format_context_tags_sources_internal_first():
    internal = [_strip("kb fact", rank=1), _strip("kb first", rank=0)]
    web = [_strip("web fact", source="web", rank=0)]
    assert format_context(internal, web).splitlines() == [
        "[internal] (T0) kb first",
        "[internal] (T1) kb fact",
        "[web] (T0) web fact",
    ]
    assert format_context([], []) == ""


def test_chunk_text_respects_paragraphs_and_limits():
    para = " ".join(["word"] * 50) + "."
    text = f"{para}\n\n{para}\n\nShort one."
    chunks = chunk_text(text, 60)
    assert len(chunks) == 2 and chunks[1].endswith("Short one.")  # the short tail merges into its neighbour
    long_para = " ".join(f"Sentence {i} has five words." for i in range(40))
    assert all(len(c.split()) <= 60 for c in chunk_text(long_para, 60))


def test_chunk_ids_are_content_hashes():
    a = chunk_document("doc", "Title", "Alpha beta.\n\nGamma delta.", 3)
    b = chunk_document("doc", "Title", "Alpha beta.\n\nGamma delta changed.", 3)
    assert a[0].id == b[0].id and a[1].id != b[1].id
    dup = chunk_document("doc", "T", "Same text here.\n\nSame text here.", 3)
    assert len({c.id for c in dup}) == 2


def test_a_run_of_words_without_sentence_breaks_is_cut_at_the_chunk_budget():
    # 30,000 words without a sentence break were one chunk: far past the embedder's 256 tokens.
    run = " ".join(f"word{i}" for i in range(30_000))
    chunks = chunk_text(f"Intro sentence here.\n\n{run}", 120)
    assert max(len(c.split()) for c in chunks) <= 240
    assert " ".join(" ".join(chunks).split()) == f"Intro sentence here. {run}"  # nothing lost or reordered
    # One "word" of 100,000 characters (a data blob) is cut by characters, nothing lost either.
    blob = "x" * 100_000
    chunks = chunk_text(f"Before the blob.\n\n{blob}\n\nAfter the blob.", 120)
    assert max(len(c) for c in chunks) <= 24 * 120
    assert sum(c.count("x") for c in chunks) == len(blob)
    assert not any(" x" in c or "x " in c for c in chunks)  # no space put inside the blob
    assert chunks[0] == "Before the blob." and chunks[-1].endswith("After the blob.")


def test_chunk_ids_of_ordinary_text_do_not_change_with_the_bound():
    # A paragraph of sentences, a sentence somewhat over the budget (a bulleted list joined into one
    # paragraph): chunked as before, so re-ingesting a corpus re-embeds nothing.
    sentences = " ".join(
        f"Sentence {i} says the pump number {i} moves {i} litres a minute." for i in range(40)
    )
    listing = " ".join(f"- item {i} of the list" for i in range(30))  # 150 words, no sentence end
    text = f"Pumps\n\n{sentences}\n\n{listing}\n\nShort tail."
    chunks = chunk_document("doc", "Pumps", text, 120)
    # The ids before the bound was added:
    assert [(c.id[:12], len(c.text.split())) for c in chunks] == [
        ("6b269e18de8f", 1),
        ("f5d3e09fae1d", 120),
        ("5492fe52a249", 120),
        ("fd4298cc8e42", 120),
        ("e02d7d3bd9ed", 120),
        ("656709995d00", 180),
        ("1b388ff57792", 2),
    ]
