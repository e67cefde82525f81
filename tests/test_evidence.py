"""Lexical evidence: pure functions of a question and a text."""

import pytest

from crag_dspy.judges.evidence import (
    EVIDENCE_FEATURES,
    FITTED_FEATURES,
    content_terms,
    digit_term_coverage,
    evidence_features,
    number_coverage,
    sentence_coverage,
    term_coverage,
    terms_beyond_title,
)


def test_content_terms_drop_question_and_function_words_and_ignore_case_and_punctuation():
    assert content_terms("What is the list price of one AquaProbe 220 sensor?") == {
        "list",
        "price",
        "aquaprobe",
        "220",
        "sensor",
    }
    assert content_terms("How many, and which?") == set()
    assert content_terms("") == set()
    assert content_terms("Wie hoch ist die Gebühr für µS/cm-Sonden?") >= {
        "gebühr",
        "für",
        "µs",
        "cm",
        "sonden",
    }
    assert content_terms("snake_case WQ-17") == {"snake", "case", "wq", "17"}


@pytest.mark.parametrize(
    ("question", "text", "expected"),
    [
        ("list price AquaProbe 220", "The AquaProbe 220 list price is 1,240 velds.", 1.0),
        ("list price AquaProbe 220", "The AquaProbe 200 list price is 990 velds.", 0.75),
        ("list price AquaProbe 220", "Opening hours of the Sarnholm hall.", 0.0),
        ("Who chairs the board?", "", 0.0),
        ("What is it?", "anything at all", 1.0),  # nothing asked for, nothing missed
    ],
)
def test_term_coverage(question, text, expected):
    assert term_coverage(question, text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("question", "text", "expected"),
    [
        ("Price of the AquaProbe 220 in 2024?", "AquaProbe 220 price list 2024", 1.0),
        ("Price of the AquaProbe 220 in 2024?", "AquaProbe 200 price list 2024", 0.5),
        (
            "Price of the AquaProbe 220 in 2024?",
            "AquaProbe 2200 price list 2023",
            0.0,
        ),  # tokens, not substrings
        ("Who founded Tarnell Sensors?", "Tarnell Sensors, founded in 1998", 1.0),  # no numbers asked
    ],
)
def test_number_coverage(question, text, expected):
    assert number_coverage(question, text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("question", "text", "expected"),
    [
        # A model code is a term with a digit: the neighbouring model's passage misses it.
        ("Current firmware of the TideLog 5X?", "TideLog 5 firmware 3.6.0 is current.", 0.0),
        ("Current firmware of the TideLog 5X?", "The TideLog 5X runs firmware 4.1.", 1.0),
        ("Is the TideLog 5 rated IP66?", "The TideLog 5 enclosure is rated IP67.", 0.5),
        ("Price of the AquaProbe 220 in 2024?", "AquaProbe 200 price list 2024", 0.5),  # numbers as before
        # Nothing with a digit asked, nothing missed.
        ("Who founded Tarnell Sensors?", "Tarnell Sensors, founded in 1998", 1.0),
    ],
)
def test_digit_term_coverage(question, text, expected):
    assert digit_term_coverage(question, text) == pytest.approx(expected)


def test_number_coverage_ignores_codes_which_digit_term_coverage_counts():
    question, text = "Current firmware of the TideLog 5X?", "TideLog 5 firmware 3.6.0 is current."
    assert number_coverage(question, text) == 1.0 and digit_term_coverage(question, text) == 0.0


def test_evidence_features_default_to_the_fitted_ones_in_range():
    features = evidence_features("Price of the AquaProbe 220?", "The AquaProbe 200 price")
    assert set(features) == set(FITTED_FEATURES) and set(FITTED_FEATURES) <= set(EVIDENCE_FEATURES)
    assert features == {
        "term_coverage": pytest.approx(2 / 3),
        "digit_term_coverage": 0.0,
        "sentence_coverage": pytest.approx(2 / 3),
    }
    assert all(0.0 <= v <= 1.0 for v in features.values())


def test_evidence_features_compute_named_features_only():
    # An older program's calibration names number_coverage: it still gets it, and nothing else.
    features = evidence_features("TideLog 5X firmware?", "TideLog 5 firmware", ["number_coverage"])
    assert features == {"number_coverage": 1.0}
    with pytest.raises(KeyError):
        evidence_features("q", "t", ["length"])


def test_terms_beyond_title():
    question = "How much is the surcharge for expedited service at Dunmore?"
    assert terms_beyond_title(question, "Dunmore Repair Centre: Turnaround") == {
        "surcharge",
        "expedited",
        "service",
    }
    # A title holding every term leaves them all to the sentences.
    assert terms_beyond_title("Dunmore surcharge?", "Dunmore surcharge table") == {"dunmore", "surcharge"}
    assert terms_beyond_title("How much?", "Anything") == set()


SURCHARGE = "How much is the surcharge per unit for expedited service at Dunmore?"
TURNAROUND = "Dunmore Repair Centre: Turnaround Times\n"


@pytest.mark.parametrize(
    ("question", "text", "expected"),
    [
        # The answer sentence holds every term the title lacks (surcharge, per, unit, expedited, service).
        (
            SURCHARGE,
            TURNAROUND
            + "Standard repairs take 10 days. Expedited service costs a surcharge of 180 velds per unit.",
            1.0,
        ),
        # The same words spread over two sentences: whole-text coverage is full, no one sentence is.
        (
            SURCHARGE,
            TURNAROUND + "Expedited service must be booked early. A surcharge applies per unit shipped.",
            3 / 5,
        ),
        # A strip has no title line: every question term must come from one sentence.
        ("Dunmore surcharge?", "The surcharge is 180 velds. Dunmore is in Velland.", 1 / 2),
        (SURCHARGE, TURNAROUND, 0.0),  # a title and no sentence
        ("What is it?", "Title\nAnything at all.", 1.0),  # nothing asked for, nothing missed
    ],
)
def test_sentence_coverage(question, text, expected):
    assert sentence_coverage(question, text) == pytest.approx(expected)
    assert 0.0 <= sentence_coverage(question, text) <= term_coverage(question, text) or not text.strip()
