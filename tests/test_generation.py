"""The generation module's pure functions: clean-up of the rewriter's, reviser's and answerer's replies,
and attach_unit (a bare-number answer gets the unit its context states). No model."""

import dspy
import pytest

from crag_dspy.generation import attach_unit, before_marker, clean_answer, clean_query, is_bare_number


@pytest.mark.parametrize(
    ("answer", "bare"),
    [
        ("260", True),
        ("1,240", True),
        ("1 240", True),
        ("0.2", True),
        ("12.5.", True),  # a trailing full stop is punctuation
        (" 16 ", True),
        ("2014", False),  # a year
        ("1899", True),
        ("2100", True),
        ("260 velds", False),
        ("21%", False),
        ("V260", False),
        ("1,24", False),  # not a thousands separator
        ("", False),
        ("I don't know", False),
    ],
)
def test_is_bare_number(answer, bare):
    assert is_bare_number(answer) is bare


@pytest.mark.parametrize(
    ("answer", "context", "expected"),
    [
        # the unit, not the rest of the phrase
        ("260", "The hotel cap is 260 velds per night.", "260 velds"),
        ("16", "the birth parent received 16 weeks of fully paid leave", "16 weeks"),
        ("3", "Payslips appear 3 working days before payday.", "3 working days"),
        ("25", "Dunmore accepts at most 25 expedited units per week.", "25 expedited units"),
        ("2", "a maximum drift of 2 mg/L between calibrations", "2 mg/L"),
        ("60", "from minus 20 to 60 °C.", "60 °C"),
        ("1,250", "a standard permit costs 1,250 velds, a minor one 400 velds", "1,250 velds"),
        ("620", "the logger weighs 620 g. It is grey.", "620 g"),
        ("180", "PDF copies for 180 velds each", "180 velds"),
        # every place the number stands alone must agree
        ("16", "16 weeks for birth parents; adoptive parents got the same 16 weeks.", "16 weeks"),
        ("16", "16 weeks of leave; the logger has 16 channels.", "16"),
        ("5", "The TideLog 5 has 5 channels.", "5"),  # "5 has" has no unit, "5 channels" has one
        # nothing to attach
        ("10", "Extension 10, or the 10:00 bus.", "10"),
        ("250", "The allowance is 250 in total.", "250"),
        ("250", "The allowance is V250.", "250"),
        ("7", "No such number here.", "7"),
        ("9", "It was 9 Maren Oduya said.", "9"),  # a capitalised word is not a unit
        # not bare numbers: unchanged
        ("2014", "In 2014 the company moved.", "2014"),
        ("260 velds", "260 velds per night", "260 velds"),
        ("I don't know", "260 velds", "I don't know"),
        # the number must stand alone: not inside another number or word
        ("50", "up to 5,000 velds and 150 units", "50"),
        ("40", "AP-40 costs 40 velds", "40 velds"),
        ("2", "2.5 mm, 2 mm", "2 mm"),
        ("8", "an 8-hour shift of 8 hours", "8 hours"),
        # a symbol or an abbreviation is a whole unit; two words at most
        ("6", "it lies 6 km north of town", "6 km"),
        ("4", "after 4 long rainy weeks", "4 long rainy"),
    ],
)
def test_attach_unit(answer, context, expected):
    assert attach_unit(answer, context) == expected


def test_before_marker_cuts_a_run_in_completion_marker():
    assert before_marker("6 months [[ ## completed ## ]]") == "6 months "
    assert before_marker("no marker") == "no marker"
    assert before_marker(42) == "42"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('  "WQ-17 sensor\n recalibration interval";  ', "WQ-17 sensor recalibration interval"),
        ("hotel cap per night [[ ## completed ## ]]", "hotel cap per night"),
        ("x" * 400, "x" * 300),  # at most 300 characters
        ("", ""),
        (None, ""),
    ],
)
def test_clean_query(query, expected):
    assert clean_query(dspy.Prediction(query=query)) == expected


def test_clean_query_and_answer_of_no_prediction_are_empty():
    assert clean_query(None) == "" and clean_answer(None) == ""


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(" 260 velds [[ ## completed", "260 velds"), ("  Lisbrook\n", "Lisbrook"), ("", ""), (None, "")],
)
def test_clean_answer(answer, expected):
    assert clean_answer(dspy.Prediction(answer=answer)) == expected
