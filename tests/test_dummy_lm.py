"""DSPy's own test double, ``dspy.utils.DummyLM``, drives the whole module (issue 61): the judges and the
free-text stages read the formats it writes (ChatAdapter's ``[[ ## field ## ]]`` blocks by default, a
JSON object with ``JSONAdapter``). Control flow only: the scripted replies decide every judgement."""

import dspy
import pytest
from dspy.utils.dummies import DummyLM
from dspy.utils.exceptions import AdapterParseError
from fakes import ListRetriever, ListWebSearch

from crag_dspy import CRAG, WebResult
from crag_dspy.adapters import LabelAdapter, TextAdapter, wrapped_value
from crag_dspy.web import NoWebSearch
from signatures import AnswerFromContext, FilterStrip, GradeDocument

FERRY = "The night ferry to Velm Island leaves at 23:40 from pier four."
BAKERY = "The bakery on Quay Street opens at 06:00."
QUESTION = "When does the night ferry to Velm Island leave?"


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("Yes", True),
        ("yes.", True),
        ("**No**", False),
        ("[[ ## relevant ## ]]\nTrue", True),  # DummyLM with DSPy's default ChatAdapter
        ("[[ ## relevant ## ]]\nno\n\n[[ ## completed ## ]]", False),
        ('{\n  "relevant": true\n}', True),  # DummyLM with JSONAdapter
        ('{"relevant": "no"}', False),
        ('```json\n{"relevant": false}\n```', False),
        ("<relevant>\nTrue\n</relevant>", True),  # XMLAdapter
    ],
)
def test_the_label_format_reads_one_word_and_every_dspy_adapters_format(reply, label):
    assert LabelAdapter().parse(GradeDocument, reply) == {"relevant": label}


@pytest.mark.parametrize(
    "reply", ["maybe", "", '{"keep": true}', "[[ ## relevant ## ]]\nperhaps", "{not json"]
)
def test_a_reply_without_a_yes_or_no_for_the_field_is_still_refused(reply):
    with pytest.raises(AdapterParseError, match="'yes' or 'no'"):
        LabelAdapter().parse(GradeDocument, reply)


def test_the_text_format_reads_a_bare_value_and_every_dspy_adapters_format():
    parse = TextAdapter().parse
    for reply in ("23:40", "[[ ## answer ## ]]\n23:40\n\n[[ ## completed ## ]]", '{"answer": "23:40"}'):
        assert parse(AnswerFromContext, reply) == {"answer": "23:40"}
    assert wrapped_value("answer", "23:40") is None  # bare: nothing wrapped it
    assert wrapped_value("keep", '{"keep": false}') is False and wrapped_value("keep", FERRY) is None


def script() -> dict[str, dict]:
    """DummyLM's dict mode: the first key found in a call's last message picks its reply. The judges'
    inputs are fenced (``document:``/``strip:`` then ``<<<``), the answerer's context too; the
    query rewriter is asked the question alone. Replies in several spellings ("Yes", "no.", a bool)."""
    return {
        "document:\n<<<\nferry\n": {"relevant": "Yes"},
        "document:\n<<<\nbakery\n": {"relevant": "no."},
        "document:\n<<<\nlast-year\n": {"relevant": False},
        f"strip:\n<<<\n{FERRY}": {"keep": True},
        "strip:\n<<<\n": {"keep": "no"},
        "context:\n<<<": {"answer": "23:40 from pier four"},
        "question:": {"query": "Velm Island night ferry"},
    }


@pytest.mark.parametrize("adapter", [None, dspy.JSONAdapter()], ids=["chat", "json"])
def test_dummy_lm_drives_retrieve_grade_route_refine_answer(adapter):
    lm = DummyLM(script(), adapter=adapter)
    crag = CRAG(ListRetriever([("ferry", FERRY), ("bakery", BAKERY)]), NoWebSearch(), lm=lm)
    prediction = crag(question=QUESTION)
    trace = prediction.trace
    assert prediction.answer == "23:40 from pier four" and trace.action == "CORRECT"
    assert [(d.doc_id, d.score, d.score_source) for d in trace.documents] == [
        ("ferry", 1.0, "label"),  # DummyLM gives no logprobs: the parsed label is the score
        ("bakery", 0.0, "label"),
    ]
    assert [s.text for s in trace.internal_strips if s.kept] == [FERRY] and not trace.errors


def test_dummy_lm_drives_the_web_route_when_every_passage_is_rejected():
    web = ListWebSearch([WebResult("Timetable", "https://ferries.example/night", FERRY)])
    crag = CRAG(
        ListRetriever([("last-year", "The ferry company was founded in 1952.")]), web, lm=DummyLM(script())
    )
    trace = crag(question=QUESTION).trace
    assert trace.action == "INCORRECT" and trace.web_query == "Velm Island night ferry"
    assert web.queries[0] == "Velm Island night ferry"
    assert [s.text for s in trace.external_strips if s.kept] == [FERRY]
    assert trace.answer == "23:40 from pier four" and not trace.errors


def test_dummy_lm_in_list_mode_answers_the_calls_in_order():
    # The way DSPy's docs use it: one reply per call, in order (one passage: grade, filter, answer).
    lm = DummyLM([{"relevant": True}, {"keep": "yes"}, {"answer": "23:40 from pier four"}])
    with dspy.context(lm=lm):
        prediction = CRAG(ListRetriever([("ferry", FERRY)]), NoWebSearch())(question=QUESTION)
    assert (prediction.answer, prediction.trace.action) == ("23:40 from pier four", "CORRECT")
    assert prediction.trace.total_usage.calls == 3


def test_a_judge_reads_dummy_lm_through_its_own_predictor():
    from crag_dspy.judges import BinaryJudge

    judge = BinaryJudge(FilterStrip, retries=0)
    with dspy.context(lm=DummyLM([{"keep": "Yes"}, {"keep": "nonsense"}])):
        assert judge(question=QUESTION, strip=FERRY).keep is True
        failed = judge(question=QUESTION, strip=BAKERY)
    assert failed.keep is None and "Expected the answer 'yes' or 'no'" in failed.judgement.errors[0]
