"""Citations and section paths: pure functions, no LM."""

import pytest

from crag_dspy.citations import MAX_CITATIONS, Citation, cite
from crag_dspy.sections import TooManyPartsError, markdown_blocks, markdown_parts, sectioned
from crag_dspy.trace import StripRecord


def strip(text, doc_id="handbook.pdf", page=None, section=None, kept=True, source="internal", url=None):
    return StripRecord(
        source=source,
        doc_id=doc_id,
        title="Fleet Handbook",
        position=0,
        text=text,
        score=0.9,
        score_source="strip_filter",
        kept=kept,
        page=page,
        section=section,
        url=url,
    )


def context_of(*strips):
    return "\n".join(f"[internal] (Fleet Handbook) {s.text}" for s in strips)


CAPACITY = strip("The MV Corvina is the largest vessel. It may carry 412 passengers and 40 cars.", page=2)
CREW = strip("A crew of six is needed on ferries with more than 100 passengers.", doc_id="crew.docx")


def test_a_number_with_its_unit_is_cited_to_the_page_and_sentence_that_state_it():
    (citation,) = cite(
        "412 passengers",
        "How many passengers may the MV Corvina carry?",
        [CAPACITY, CREW],
        context_of(CAPACITY, CREW),
    )
    assert citation == Citation(
        doc_id="handbook.pdf",
        title="Fleet Handbook",
        source="internal",
        page=2,
        quote="It may carry 412 passengers and 40 cars.",
    )
    assert citation.label == "handbook.pdf, p. 2"


def test_what_the_question_states_is_not_what_a_source_must_support():
    # "MV Corvina" is in the question; only "100 passengers" must be stated, and the crew rule does.
    (citation,) = cite(
        "100 passengers",
        "How many passengers may the MV Corvina carry?",
        [CAPACITY, CREW],
        context_of(CAPACITY, CREW),
    )
    assert citation.doc_id == "crew.docx" and citation.page is None and citation.label == "crew.docx"


def test_an_abstention_an_empty_answer_and_an_ungrounded_answer_cite_nothing():
    strips, context = [CAPACITY, CREW], context_of(CAPACITY, CREW)
    question = "How many passengers may the MV Corvina carry?"
    assert cite("I don't know", question, strips, context) == []
    assert cite("I do not know.", question, strips, context) == []
    assert cite("", question, strips, context) == []
    assert cite(None, question, strips, context) == []
    assert cite("250 passengers", question, strips, context) == []  # no source says so


def test_only_kept_strips_of_the_context_are_cited():
    dropped = strip("It may carry 412 passengers.", doc_id="old.pdf", page=9, kept=False)
    elsewhere = strip("It may carry 412 passengers.", doc_id="other.pdf", page=3)
    cited = cite("412 passengers", "How many?", [dropped, elsewhere, CAPACITY], context_of(CAPACITY))
    assert [c.doc_id for c in cited] == ["handbook.pdf"]


def test_an_answer_without_numbers_or_names_is_cited_by_its_words():
    verbose = strip("The verbose mode prints every request it sends.", doc_id="guide.html", section="Options")
    other = strip("The quiet mode prints nothing at all.", doc_id="guide.html", section="Other")
    cited = cite(
        "verbose mode", "Which mode prints every request?", [other, verbose], context_of(other, verbose)
    )
    assert [(c.section, c.label) for c in cited] == [("Options", "guide.html, Options")]
    assert cite("silent operation", "Which mode?", [other], context_of(other)) == []  # shares no word


def test_one_citation_per_location_strongest_first_and_at_most_three():
    both = strip("Pier four: 23:40 departures, 412 passengers.", doc_id="a.pdf", page=1)
    one = strip("The night crossing leaves at 23:40.", doc_id="b.pdf", page=4)
    same_page = strip("Boarding ends at 23:40 sharp.", doc_id="b.pdf", page=4)
    many = [strip(f"At 23:40 ferry {i} leaves.", doc_id=f"c{i}.md") for i in range(5)]
    strips = [one, same_page, both, *many]
    cited = cite("23:40, 412 passengers", "When and how many?", strips, context_of(*strips))
    assert len(cited) == MAX_CITATIONS
    assert [c.label for c in cited] == ["a.pdf, p. 1", "b.pdf, p. 4", "c0.md"]  # both items, then order


def test_a_web_strip_is_cited_by_its_url():
    page = strip(
        "IHSC WQ-17 requires recalibration every 90 days.",
        doc_id="https://ihsc.example/wq17",
        source="web",
        url="https://ihsc.example/wq17",
    )
    (citation,) = cite("every 90 days", "How often?", [page], context_of(page))
    assert citation.label == "https://ihsc.example/wq17" and citation.source == "web"


def test_markdown_blocks_split_headings_outside_code_fences():
    text = "# Guide\n\nIntro.\n\n## Install\n\n```\n# a comment\n```\n\nText ## not a heading\n"
    assert list(markdown_blocks(text)) == [
        (1, "# Guide"),
        (None, "Intro."),
        (2, "## Install"),
        (None, "```\n# a comment\n```\n\nText ## not a heading"),
    ]


def test_sectioned_heading_paths():
    assert sectioned([(None, "no headings at all")]) is None
    blocks = [
        (1, "# Manual"),
        (None, "Intro."),
        (2, "## Options"),
        (3, "### Limits"),  # a heading straight under another: both go with the next body
        (None, "At most 5."),
        (2, "## Files"),
        (None, "In /etc."),
        (3, "### Empty"),  # a trailing heading with no body joins the last part
    ]
    parts = sectioned(blocks, title="Manual")
    assert [(p.section, p.text) for p in parts] == [
        (None, "# Manual\n\nIntro."),
        ("Options > Limits", "## Options\n\n### Limits\n\nAt most 5."),
        ("Files", "## Files\n\nIn /etc.\n\n### Empty"),
    ]
    assert sectioned(blocks)[0].section == "Manual"  # without a title, the top heading is a step
    assert [p.section for p in markdown_parts("## Only `code` **here**\n\nBody.")] == ["Only code here"]
    assert markdown_parts("## Lonely heading")[0].text == "## Lonely heading"


def test_sectioned_stops_at_the_part_past_its_bound_without_reading_further_blocks():
    # Probe 6, D5: the loader bounds a document's sections; the blocks of a file of a million one-line
    # sections are read lazily and no further than the part past the bound.
    read = []

    def blocks():
        for i in range(1_000_000):
            read.append(i)
            yield 1, f"# h{i}"
            yield None, "x"

    with pytest.raises(TooManyPartsError):
        sectioned(blocks(), most=3)
    assert len(read) == 4
    assert len(sectioned(markdown_blocks("# a\nx\n# b\ny\n# c\nz"), most=3)) == 3
