"""SharedWork's memo and cost accounting, the shared backends and judgements, and CRAG's stage knobs."""

import time

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.protocols import WebResult, WebSearchError
from crag_dspy.routing import Action
from optimize.shared_work import CRAGPieces, SharedWebSearch, SharedWork

Q = "What is the range of the AquaProbe 220?"
GOOD = "The AquaProbe 220 has a range of 0 to 25 mg/L."
BAD = "The canteen opens at 08:00."
WEB = WebResult("Range", "https://x.example", "The AquaProbe 220 range is 0 to 25 mg/L. It is accurate.")


def script(system, user):
    if "You judge" in system:
        text = field(user, "document") or field(user, "strip")
        return 0.9 if "0 to 25" in text else 0.1
    if "web search query" in system:
        return {"query": "AquaProbe 220; range"}
    if "Answer the question using only the context" in system:
        return {"answer": "0 to 25 mg/L" if "0 to 25" in field(user, "context") else "I don't know"}
    raise AssertionError(system[:60])


def ask(lm, text):
    with dspy.context(lm=lm):
        return dspy.Predict("question -> answer")(question=text).answer


def test_a_piece_is_computed_once_and_owned_by_its_first_consumer():
    work, calls = SharedWork(), []

    def compute():
        calls.append(1)
        return "value"

    with work.consumer("a") as used_a:
        assert work.get("k", compute) == "value"
    with work.consumer("b") as used_b:
        assert work.get("k", compute) == "value"
    assert calls == [1] and used_a == used_b == {"k"} and "k" in work and len(work) == 1
    assert set(work.owned()) == {"a"}


def test_nested_pieces_are_charged_once_and_are_dependencies():
    lm = ScriptedLM(lambda s, u: {"answer": "x"})
    work = SharedWork()

    def inner():
        time.sleep(0.05)
        return ask(lm, "inner")

    def outer():
        work.get("inner", inner)
        return ask(lm, "outer")

    with work.consumer("first") as first:
        work.get("outer", outer)
    assert first == {"outer", "inner"}
    assert work.cost(["inner"]).usage.calls == work.cost(["outer"]).usage.calls == 1
    assert work.cost(["inner"]).requests == work.cost(["outer"]).requests == 1
    assert work.cost(["inner"]).seconds >= 0.05 > work.cost(["outer"]).seconds
    assert work.total().usage.calls == len(lm.calls) == 2
    with work.consumer("second") as second:  # reusing the outer piece uses what it was made of
        work.get("outer", outer)
    assert second == first and len(lm.calls) == 2
    assert work.cost(second).usage.calls == 2


def test_a_failed_piece_fails_again_without_recomputing():
    work, calls = SharedWork(), []

    def boom():
        calls.append(1)
        raise WebSearchError("quota")

    for _ in range(2):
        with pytest.raises(WebSearchError, match="quota"):
            work.get("k", boom)
    assert calls == [1]


def test_shared_web_search_gives_every_variant_the_same_results_or_error():
    work = SharedWork()
    inner = ListWebSearch([WEB])
    web = SharedWebSearch(inner, work)
    assert web.search("q", 3) == web.search("q", 3) == [WEB]
    assert inner.queries == ["q"]
    failing = SharedWebSearch(ListWebSearch(error=WebSearchError("down")), work)
    for _ in range(2):
        with pytest.raises(WebSearchError):
            failing.search("q2", 3)
    assert failing.inner.queries == ["q2"]


def make(lm, **config):
    return CRAG(
        ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2, **config), lm=lm
    )


def test_programs_with_the_same_predictors_share_pieces_and_the_crag_is_not_changed():
    lm = ScriptedLM(script)
    work = SharedWork()
    crag = make(lm)
    a, b = CRAGPieces(crag, work), CRAGPieces(make(lm, lower=0.0, upper=1.0), work)
    assert a.documents(Q) == b.documents(Q)
    assert a.route(Q, Action.AMBIGUOUS) == b.route(Q, Action.AMBIGUOUS) == "0 to 25 mg/L"
    assert len(lm.calls) == len(set(lm.calls))
    assert type(crag.retriever).__name__ == "ListRetriever" and type(crag.grader).__name__ == "BinaryJudge"

    compiled = make(lm)
    compiled.grader.predict.demos = [dspy.Example(question="q", document="d", relevant=True)]
    c = CRAGPieces(compiled, work)
    assert c.grader_key != a.grader_key
    before = len(lm.calls)
    c.documents(Q)
    assert len(lm.calls) == before + 2  # another grader grades again


def test_one_strip_is_judged_once_whatever_knowledge_it_came_from():
    lm = ScriptedLM(script)
    pieces = CRAGPieces(make(lm), SharedWork())
    rewritten = pieces.external(Q)
    original = pieces.external(Q, rewrite=False)  # same web page for both queries here
    assert rewritten == original
    strip_calls = [u for s, u in lm.calls if "knowledge strips" in s]
    assert len(strip_calls) == len(set(strip_calls)) == 1


def test_stage_knobs_original_query_and_unselected_web_strips():
    lm = ScriptedLM(script)
    web = ListWebSearch([WEB, WebResult("Canteen", "https://c.example", BAD)])
    crag = CRAG(ListRetriever([("kb-1", BAD)]), web, CRAGConfig(k=1), lm=lm)
    run = crag.new_run(Q)
    with crag.lm_scope(run.trace):
        strips = crag.external_knowledge(Q, run, query=Q, select=False).strips
    assert web.queries == [Q]
    assert [s.doc_id for s in strips] == ["https://x.example", "https://c.example"]  # nothing dropped
    assert lm.calls == []  # no rewrite, no strip judged
    assert {s.score_source for s in run.trace.external_strips} == {"unfiltered"}
    assert all(s.kept for s in run.trace.external_strips)
    run = crag.new_run(Q)
    with crag.lm_scope(run.trace):
        assert crag.rewrite_query(Q, run) == "AquaProbe 220; range" == run.trace.web_query


def test_a_text_judged_in_one_piece_is_not_judged_again_in_another():
    # The web result repeats a strip of the passage: the internal piece judges it, the web piece reuses it.
    web = WebResult("Range", "https://x.example", GOOD)
    passage = f"{GOOD} {BAD} The canteen closes at 16:00."
    crag = CRAG(
        ListRetriever([("kb-1", passage)]), ListWebSearch([web]), CRAGConfig(k=1, sentences_per_strip=1)
    )
    crag.lm = lm = ScriptedLM(script)
    pieces = CRAGPieces(crag, SharedWork())
    internal = pieces.internal(Q)
    judged = [u for s, u in lm.calls if "You judge" in s]
    external = pieces.external(Q, rewrite=False)
    assert [u for s, u in lm.calls if "You judge" in s] == judged  # no strip judged twice
    assert [s.text for s in internal.strips] == [s.text for s in external.strips] == [GOOD]
    assert len(judged) == 4  # the passage, then its three strips
    other = CRAGPieces(crag, SharedWork())  # another memo: nothing shared
    other.external(Q, rewrite=False)
    assert len([u for s, u in lm.calls if "You judge" in s]) == len(judged) + 1


def test_passages_shown_alike_share_one_answer_of_the_lm_each_calibrated_with_its_own_evidence():
    from crag_dspy.judges.calibration import Calibration

    crag = CRAG(ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2))
    crag.lm = lm = ScriptedLM(script)
    crag.grader.view = lambda inputs: {**inputs, "document": GOOD}  # both passages cut to one excerpt
    crag.grader.calibration = Calibration(1.0, -1.0, {"term_coverage": 2.0})
    _, scores = CRAGPieces(crag, SharedWork()).documents(Q)
    assert len([u for s, u in lm.calls if "You judge" in s]) == 1
    assert scores[0] > scores[1]  # GOOD holds the question's terms, BAD none


def test_a_route_answers_from_the_web_reserve_exactly_as_forward_does():
    # The web's only strip scores 0.1: below the strip threshold, so it is the reserve.
    web = WebResult("Fares", "https://f.example", "A day ticket costs 9 velds.")
    crag = CRAG(ListRetriever([("kb-1", BAD)]), ListWebSearch([web]), CRAGConfig(k=1), lm=ScriptedLM(script))
    pred = crag(question=Q)
    assert pred.action == Action.INCORRECT.value
    assert pred.trace.context == "[web] (Fares) A day ticket costs 9 velds."

    lm = ScriptedLM(script)
    crag.lm = lm
    assert CRAGPieces(crag, SharedWork()).route(Q, Action.INCORRECT) == pred.answer
    contexts = [field(user, "context") for system, user in lm.calls if "Answer the question" in system]
    assert contexts == [pred.trace.context]
