"""Control flow of every CRAG action path, with a scripted LM (no quality claims here)."""

import json

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG, Action
from crag_dspy.config import CRAGConfig, LMCalls
from crag_dspy.protocols import WebResult, WebSearchError

GOOD = "The AquaProbe 220 has a range of 0 to 25 mg/L."
BAD = "The canteen opens at 08:00."
LONG = (
    "Travel Policy v4 sets the hotel cap at 180 velds. Hotels are booked in Ledgerly. Receipts are kept. "
    "The canteen serves soup on Fridays. Parking is free for visitors. Taxis need approval."
)
WEB = WebResult("WQ-17", "https://ihsc.example/wq17", "IHSC WQ-17 requires recalibration every 90 days.")


def make_script(doc_scores=None, strip_scores=None, answer="0 to 25 mg/L", query="AquaProbe 220; range"):
    doc_scores = doc_scores or {}
    strip_scores = strip_scores or {}

    def script(system, user):
        if "You judge search results" in system:
            document = field(user, "document")
            return next((p for key, p in doc_scores.items() if key in document), 0.05)
        if "You judge short knowledge strips" in system:
            strip = field(user, "strip")
            return next((p for key, p in strip_scores.items() if key in strip), 0.05)
        if "web search query" in system:
            return {"query": query}
        if "Answer the question using only the context" in system:
            return {"answer": answer}
        raise AssertionError(f"unexpected prompt: {system[:80]}")

    return script


def run(texts, script, web=None, retries=2, **config):
    lm = ScriptedLM(script)
    config = CRAGConfig(k=5, lm_calls=LMCalls(retries=retries), **config)
    crag = CRAG(ListRetriever(texts), web or ListWebSearch([WEB]), config, lm=lm)
    return crag(question="What is the range of the AquaProbe 220?"), lm


def answer_contexts(lm):
    return [field(user, "context") for system, user in lm.calls if "Answer the question" in system]


def test_correct_uses_internal_only_and_reuses_one_strip_grades():
    web = ListWebSearch([WEB])
    pred, lm = run([("kb-1", GOOD), ("kb-2", BAD)], make_script({"0 to 25": 0.9}), web=web)
    assert pred.action == Action.CORRECT.value
    # The route reads no web; the grounding check's witness search asks the question itself.
    assert web.queries == ["What is the range of the AquaProbe 220?"]
    assert pred.trace.web_results == [] and [r.url for r in pred.trace.witness_results] == [WEB.url]
    (context,) = answer_contexts(lm)
    assert "[internal]" in context and "0 to 25 mg/L" in context
    assert (
        "canteen" not in context and "[web]" not in context
    )  # raw/irrelevant docs never reach the generator
    # 2 grades + 1 answer: the one-strip passage reuses its grade instead of asking the strip filter again
    assert len(lm.calls) == 3
    kept = [s for s in pred.trace.internal_strips if s.kept]
    assert [s.score_source for s in kept] == ["document_grade"]
    assert [round(d.score, 2) for d in pred.trace.documents] == [0.9, 0.05]


@pytest.mark.parametrize("strip_score", [0.9, 0.05])
def test_the_best_graded_passage_reaches_the_strip_filter_even_below_its_threshold(strip_score):
    # Tuned thresholds can put `upper` below `strip_threshold`: the passage that made the route CORRECT
    # must not be dropped whole, or CRAG answers from nothing. The strip filter judges it itself.
    script = make_script({"0 to 25": 0.45, "canteen": 0.2}, {"0 to 25": strip_score})
    pred, lm = run(
        [("kb-1", BAD), ("kb-2", GOOD), ("kb-3", LONG)], script, lower=0.1, upper=0.4, reserve_strips=1
    )
    assert pred.action == Action.CORRECT.value
    strips = {s.doc_id: s for s in pred.trace.internal_strips}
    assert set(strips) == {"kb-2"}  # the other passages graded below the cut are still dropped whole
    assert strips["kb-2"].score_source == "strip_filter" and strips["kb-2"].kept
    filtered = [field(u, "strip") for s, u in lm.calls if "You judge short knowledge strips" in s]
    assert filtered == [GOOD]
    (context,) = answer_contexts(lm)
    assert "0 to 25 mg/L" in context and "canteen" not in context
    # When the strip filter disagrees with the grader, the best strip is the reserve the answer reads.
    reserve_used = [f for f in pred.trace.fallbacks if "best-scored internal strips below it (0.05)" in f]
    assert len(reserve_used) == (strip_score < 0.5)


def test_incorrect_rewrites_searches_and_uses_web_only():
    web = ListWebSearch([WEB])
    script = make_script({}, {"90 days": 0.95}, answer="every 90 days")
    pred, lm = run([("kb-1", BAD)], script, web=web)
    assert pred.action == Action.INCORRECT.value
    assert web.queries == [
        "AquaProbe 220; range",
        "What is the range of the AquaProbe 220?",
    ]  # + the witnesses
    assert pred.trace.web_query == "AquaProbe 220; range"
    (context,) = answer_contexts(lm)
    assert context.startswith("[web]") and "[internal]" not in context
    assert pred.answer == "every 90 days"
    assert pred.trace.external_strips[0].kept and pred.trace.web_results[0].url == WEB.url


WEB_TWO = [
    WebResult("Fares", "https://fares.example", "A day ticket costs 9 velds."),
    WebResult("WQ-17", "https://ihsc.example/wq17", "IHSC WQ-17 requires recalibration every 90 days."),
]


def test_when_no_strip_reaches_the_threshold_incorrect_answers_from_the_best_web_strip():
    script = make_script({}, {"90 days": 0.41, "day ticket": 0.2}, answer="every 90 days")
    pred, lm = run([("kb-1", BAD)], script, web=ListWebSearch(WEB_TWO), reserve_strips=1)
    assert pred.action == Action.INCORRECT.value
    assert [(s.doc_id, s.kept, s.score) for s in pred.trace.external_strips] == [
        ("https://fares.example", False, 0.2),
        ("https://ihsc.example/wq17", True, 0.41),  # the trace says what the answer was built from
    ]
    (context,) = answer_contexts(lm)
    assert context == "[web] (WQ-17) IHSC WQ-17 requires recalibration every 90 days."
    assert pred.answer == "every 90 days"
    assert pred.trace.fallbacks == [
        "no knowledge reached the strip threshold 0.5; answered from the best-scored web strips below it (0.41)"
    ]


def test_the_trace_marks_only_the_reserve_strip_kept_when_results_share_a_url():
    page = "https://wiki.example/Kestrel"
    web = ListWebSearch(
        [WebResult("K", page, "The CEO is Iver Hask."), WebResult("K", page, "It was founded in 2009.")]
    )
    pred, lm = run(
        [("kb-1", BAD)],
        make_script({}, {"Iver": 0.41, "founded": 0.39}, answer="Iver Hask"),
        web=web,
        reserve_strips=1,
    )
    assert [(s.position, s.kept) for s in pred.trace.external_strips] == [(0, True), (0, False)]
    assert answer_contexts(lm) == ["[web] (K) The CEO is Iver Hask."]
    assert pred.trace.fallbacks[-1].endswith("below it (0.41)")


def test_ambiguous_uses_the_web_reserve_only_when_no_internal_knowledge_survived():
    script = make_script({"0 to 25": 0.5}, {"90 days": 0.41, "0 to 25": 0.9})
    pred, lm = run([("kb-1", GOOD)], script)
    assert pred.action == Action.AMBIGUOUS.value
    (context,) = answer_contexts(lm)
    assert context.startswith("[internal]") and "[web]" not in context  # internal knowledge, no reserve
    assert not pred.trace.fallbacks and not pred.trace.external_strips[0].kept

    # graded below the strip threshold, so the strip filter judges it (and drops it)
    script = make_script({"0 to 25": 0.45}, {"90 days": 0.41, "0 to 25": 0.1})
    pred, lm = run([("kb-1", GOOD)], script, reserve_strips=1)
    assert pred.action == Action.AMBIGUOUS.value
    (context,) = answer_contexts(lm)
    assert context.startswith("[web] (WQ-17)") and "[internal]" not in context
    assert any("best-scored web strips below it (0.41)" in f for f in pred.trace.fallbacks)

    # the internal strip scores higher than the web's best: the internal reserve is the context
    script = make_script({"0 to 25": 0.45}, {"90 days": 0.41, "0 to 25": 0.46})
    pred, lm = run([("kb-1", GOOD)], script, reserve_strips=1)
    assert pred.action == Action.AMBIGUOUS.value
    assert answer_contexts(lm) == [f"[internal] (kb-1) {GOOD}"]
    assert any("best-scored internal strips below it (0.46)" in f for f in pred.trace.fallbacks)
    assert pred.trace.internal_strips[0].kept and not any(s.kept for s in pred.trace.external_strips)


def test_no_reserve_strips_answers_i_dont_know_unread_when_nothing_reached_the_threshold():
    script = make_script({"0 to 25": 0.45}, {"90 days": 0.41, "0 to 25": 0.46})
    pred, lm = run([("kb-1", GOOD)], script, reserve_strips=0)
    assert pred.action == Action.AMBIGUOUS.value and pred.answer == "I don't know"
    assert answer_contexts(lm) == []  # no LM call for the answer
    assert not any(s.kept for s in [*pred.trace.internal_strips, *pred.trace.external_strips])
    assert any("no knowledge survived refinement" in f for f in pred.trace.fallbacks)


def test_the_web_reserve_never_holds_an_unjudged_strip():
    def script(system, user):
        if "You judge short knowledge strips" in system and "day ticket" in field(user, "strip"):
            return "perhaps"  # never a yes/no: unknown
        if "You judge short knowledge strips" in system:
            return 0.3
        return make_script({}, {}, answer="every 90 days")(system, user)

    pred, lm = run([("kb-1", BAD)], script, web=ListWebSearch(WEB_TWO), retries=0, reserve_strips=1)
    assert [s.kept for s in pred.trace.external_strips] == [False, True]
    (context,) = answer_contexts(lm)
    assert "day ticket" not in context and "90 days" in context
    assert any("strip filter failed" in e for e in pred.trace.errors)


def test_a_route_with_no_strip_judged_stops_the_question():
    from crag_dspy.faults import LMUnavailableError

    # Nothing to trust, not even in reserve; and no "I don't know" either, which would pass an LM that can
    # judge nothing (probe 8: a reasoning model's "<think>") off as an answered question.
    def script(system, user):
        if "You judge short knowledge strips" in system:
            return "perhaps"
        return make_script({}, {}, answer="every 90 days")(system, user)

    with pytest.raises(LMUnavailableError, match=r"no usable judgement of any of the 2 strips") as info:
        run([("kb-1", BAD)], script, web=ListWebSearch(WEB_TWO), retries=0)
    assert info.value.trace.action == Action.INCORRECT.value and info.value.stage == "strip_filter"


def test_trace_shows_the_evidence_a_compiled_grader_and_strip_filter_weighed():
    from crag_dspy.judges.calibration import Calibration

    script = make_script({}, {"90 days": 0.95}, answer="every 90 days")
    crag = CRAG(ListRetriever([("kb-1", BAD)]), ListWebSearch([WEB]), lm=ScriptedLM(script))
    crag.grader.calibration = Calibration(1.0, 0.0, {"term_coverage": 1.0})
    crag.strip_filter.calibration = Calibration(1.0, 0.0, {"number_coverage": 1.0})
    pred = crag(question="How often must WQ-17 sensors be recalibrated, in days?")
    (document,) = pred.trace.documents
    # Each judge records the evidence its calibration weighs.
    assert document.evidence == {"term_coverage": 0.0}  # the canteen passage
    (strip,) = pred.trace.external_strips
    assert strip.score_source == "strip_filter"
    assert strip.evidence == {"number_coverage": 1.0}
    uncompiled = CRAG(ListRetriever([("kb-1", BAD)]), ListWebSearch([WEB]), lm=ScriptedLM(script))
    trace = uncompiled(question="How often must WQ-17 sensors be recalibrated, in days?").trace
    assert trace.documents[0].evidence is None and trace.external_strips[0].evidence is None


def test_ambiguous_combines_both_sources_internal_first():
    script = make_script({"0 to 25": 0.5}, {"90 days": 0.9})
    pred, lm = run([("kb-1", GOOD)], script)
    assert pred.action == Action.AMBIGUOUS.value
    (context,) = answer_contexts(lm)
    lines = context.splitlines()
    assert lines[0].startswith("[internal]") and lines[-1].startswith("[web]")


def test_long_documents_are_decomposed_and_filtered():
    script = make_script({"hotel cap": 0.9}, {"hotel cap": 0.9, "canteen": 0.1})
    pred, lm = run([("kb-1", LONG)], script)
    assert pred.action == Action.CORRECT.value
    strips = pred.trace.internal_strips
    assert len(strips) == 2 and [s.kept for s in strips] == [True, False]
    (context,) = answer_contexts(lm)
    assert "180 velds" in context and "canteen" not in context


def test_web_failure_degrades_to_internal_knowledge_and_says_so():
    web = ListWebSearch(error=WebSearchError("Tavily search failed: TimeoutError"))
    pred, _ = run([("kb-1", BAD)], make_script({}, {}, answer="I don't know"), web=web)
    assert pred.action == Action.INCORRECT.value
    assert any("web search failed" in f for f in pred.trace.fallbacks)
    assert any("answered from internal knowledge" in f for f in pred.trace.fallbacks)


def test_empty_web_results_are_a_fallback_not_silence():
    pred, _ = run([("kb-1", GOOD)], make_script({"0 to 25": 0.5}), web=ListWebSearch([]))
    assert pred.action == Action.AMBIGUOUS.value
    assert any("no results" in f for f in pred.trace.fallbacks)


def test_unparseable_grades_are_retried_then_reported_as_unknown():
    def script(system, user):
        if "You judge search results" in system:
            return "perhaps"  # never a yes/no
        return make_script()(system, user)

    pred, lm = run([("kb-1", GOOD)], script, retries=2)
    doc = pred.trace.documents[0]
    assert doc.score is None and doc.score_source == "error" and doc.attempts == 3
    assert "yes" in doc.error and any("grader failed" in e for e in pred.trace.errors)
    assert pred.action == Action.AMBIGUOUS.value  # unknown never counts as a confident grade
    assert sum("You judge search results" in s for s, _ in lm.calls) == 3


def test_no_context_answers_unknown_without_calling_the_lm():
    pred, lm = run([("kb-1", BAD)], make_script({}, {}), web=ListWebSearch([]))
    assert pred.answer == "I don't know"
    assert answer_contexts(lm) == []
    assert any("without calling the LM" in f for f in pred.trace.fallbacks)


def test_no_identical_lm_call_twice_in_a_query():
    script = make_script({"hotel cap": 0.5}, {"hotel cap": 0.9, "90 days": 0.9})
    _, lm = run([("kb-1", LONG), ("kb-2", GOOD)], script)
    assert len(lm.calls) == len(set(lm.calls))


def test_trace_counts_calls_and_is_json():
    pred, lm = run([("kb-1", GOOD)], make_script({"0 to 25": 0.9}))
    usage = pred.trace.total_usage
    assert usage.calls == len(lm.calls) and usage.prompt_tokens > 0
    assert set(pred.trace.timings) >= {"retrieve", "grade", "answer"}
    json.loads(pred.trace.model_dump_json())


def test_missing_lm_is_a_clear_error():
    crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch())
    with dspy.context(lm=None), pytest.raises(ValueError, match="no LM"):
        crag(question="q")


def test_thresholds_are_saved_state(tmp_path):
    crag = CRAG(ListRetriever([]), ListWebSearch(), CRAGConfig(lower=0.2, upper=0.9))
    crag.save(str(tmp_path / "p.json"))
    state = json.loads((tmp_path / "p.json").read_text())
    assert state["thresholds"] == {"lower": 0.2, "upper": 0.9}
    fresh = CRAG(ListRetriever([]), ListWebSearch())
    fresh.load(str(tmp_path / "p.json"))
    assert (fresh.thresholds.lower, fresh.thresholds.upper) == (0.2, 0.9)
    assert {"grader.predict", "strip_filter.predict", "rewriter", "answerer"} <= set(state)


def test_deepcopy_shares_infrastructure_but_not_state():
    crag = CRAG(ListRetriever([("kb-1", GOOD)]), ListWebSearch(), lm=ScriptedLM(make_script()))
    clone = crag.deepcopy()
    assert clone.retriever is crag.retriever and clone.lm is crag.lm and clone.web_search is crag.web_search
    clone.thresholds.load_state({"lower": 0.1, "upper": 0.2})
    clone.grader.predict.demos.append("x")
    assert (crag.thresholds.lower, crag.grader.predict.demos) == (0.3, [])


def test_knowledge_for_each_action():
    from crag_dspy.stages import Knowledge, knowledge_for

    kb, web, reserve = ["kb"], ["web"], ["weak web"]
    internal = Knowledge(kb)
    for external in (Knowledge(web), Knowledge(web, reserve, 0.4)):
        assert knowledge_for(Action.CORRECT, internal, external) == (kb, [])
        assert knowledge_for(Action.INCORRECT, internal, external) == ([], web)
        assert knowledge_for(Action.AMBIGUOUS, internal, external) == (kb, web)
        assert knowledge_for(Action.AMBIGUOUS, Knowledge([]), external) == ([], web)
    assert knowledge_for(Action.INCORRECT, internal, None) == (kb, [])  # web gave nothing
    assert knowledge_for(Action.AMBIGUOUS, internal, None) == (kb, [])
    # Nothing reached the strip threshold: the reserve, but never next to surviving knowledge.
    weak = Knowledge([], reserve, 0.4)
    assert knowledge_for(Action.INCORRECT, internal, weak) == ([], reserve)
    assert knowledge_for(Action.AMBIGUOUS, Knowledge([]), weak) == ([], reserve)
    assert knowledge_for(Action.AMBIGUOUS, internal, weak) == (kb, [])
    assert knowledge_for(Action.CORRECT, Knowledge([]), weak) == ([], [])  # CORRECT never reads the web
    assert knowledge_for(Action.INCORRECT, internal, Knowledge([])) == ([], [])


def test_knowledge_for_takes_the_best_scored_reserve_of_the_sources_the_action_reads():
    from crag_dspy.stages import Knowledge, knowledge_for

    low_kb, high_kb = Knowledge([], ["weak kb"], 0.3), Knowledge([], ["weak kb"], 0.45)
    weak_web = Knowledge([], ["weak web"], 0.4)
    assert knowledge_for(Action.AMBIGUOUS, high_kb, weak_web) == (["weak kb"], [])
    assert knowledge_for(Action.AMBIGUOUS, low_kb, weak_web) == ([], ["weak web"])
    tie = Knowledge([], ["weak kb"], 0.4)
    assert knowledge_for(Action.AMBIGUOUS, tie, weak_web) == (["weak kb"], [])  # internal first
    assert knowledge_for(Action.CORRECT, low_kb, weak_web) == (["weak kb"], [])
    assert knowledge_for(Action.INCORRECT, high_kb, weak_web) == ([], ["weak web"])  # never internal
    assert knowledge_for(Action.INCORRECT, high_kb, None) == ([], [])  # web gave nothing: no reserve
    assert knowledge_for(Action.AMBIGUOUS, high_kb, None) == (["weak kb"], [])
    assert knowledge_for(Action.AMBIGUOUS, high_kb, Knowledge([])) == (["weak kb"], [])
    assert knowledge_for(Action.AMBIGUOUS, Knowledge([]), Knowledge([])) == ([], [])
    # Surviving knowledge of either source keeps both reserves out.
    assert knowledge_for(Action.AMBIGUOUS, high_kb, Knowledge(["web"], [], None)) == ([], ["web"])
    assert knowledge_for(Action.AMBIGUOUS, Knowledge(["kb"]), weak_web) == (["kb"], [])


def test_completion_marker_run_into_the_answer_is_cut_off():
    pred, _ = run(
        [("kb-1", GOOD)], make_script({"0 to 25": 0.9}, answer="0 to 25 mg/L [[ ## completed ## ]]")
    )
    assert pred.answer == "0 to 25 mg/L"


def test_answer_that_is_only_a_marker_counts_as_failed_generation():
    from crag_dspy.faults import LMUnavailableError

    with pytest.raises(LMUnavailableError) as failure:
        run([("kb-1", GOOD)], make_script({"0 to 25": 0.9}, answer="[[ ## completed ## ]]"))
    assert failure.value.stage == "answer"


def _requests(lm, marker):
    return [request for (system, _), request in zip(lm.calls, lm.requests) if marker in system]


def test_free_text_calls_ask_for_the_bare_value_and_parse_it():
    def script(system, user):
        if "web search query" in system:
            return "AquaProbe 220; range\nsecond line is ignored"
        if "Answer the question" in system:
            return "every 90 days"
        return make_script({}, {"90 days": 0.9})(system, user)

    pred, lm = run([("kb-1", BAD)], script)
    assert pred.action == Action.INCORRECT.value and pred.answer == "every 90 days"
    assert pred.trace.web_query == "AquaProbe 220; range"
    texts = [(s, u) for s, u in lm.calls if "web search query" in s or "Answer the question" in s]
    assert len(texts) == 2
    for system, user in texts:
        assert "only, on one line" in system and "[[ ##" not in system + user
    assert "context:\n<<<\n[web] (WQ-17)" in texts[1][1]  # untrusted context stays fenced


def test_an_adapter_chosen_with_dspy_context_formats_the_free_text_replies():
    # DSPy's own idiom chooses the format of the rewriter and answerer; the judges keep one word.
    with dspy.context(adapter=dspy.ChatAdapter()):
        pred, lm = run(
            [("kb-1", BAD)],
            make_script({}, {"90 days": 0.9}, answer="every 90 days"),
            web=ListWebSearch([WEB]),
        )
    assert pred.answer == "every 90 days"
    answers = [system for system, _ in lm.calls if "Answer the question" in system]
    assert answers and all("[[ ## answer ## ]]" in system for system in answers)
    assert not any("[[ ##" in system for system, _ in lm.calls if "You judge" in system)


def test_judges_generate_one_token_first_and_more_only_on_a_retry():
    answers = iter(["**", 0.9])  # markup first: unparseable in one token, so the retry may write more

    def script(system, user):
        if "You judge search results" in system:
            return next(answers)
        return make_script()(system, user)

    pred, lm = run([("kb-1", GOOD)], script)
    first, retry = _requests(lm, "You judge search results")
    assert first["max_tokens"] == 1 and "rollout_id" not in first
    assert retry["max_tokens"] == 3 and retry["rollout_id"] == 1
    assert pred.trace.documents[0].attempts == 2 and pred.trace.documents[0].score == pytest.approx(0.9)


def test_baselines_use_the_same_answer_format_as_crag():
    from crag_dspy.baselines import NoRetrieval, PlainRAG

    lm = ScriptedLM(lambda system, user: "0 to 25 mg/L")
    assert PlainRAG(ListRetriever([("kb-1", GOOD)]), lm=lm)(question="Range?").answer == "0 to 25 mg/L"
    assert NoRetrieval(lm=lm)(question="Range?").answer == "0 to 25 mg/L"
    assert all("only, on one line" in system for system, _ in lm.calls) and len(lm.calls) == 2


PRICE = "Travel Policy v4 sets the hotel cap at 260 velds per night in high-cost cities."


@pytest.mark.parametrize("answer_units", [True, False])
def test_a_bare_number_answer_gets_its_unit_from_the_context(answer_units):
    pred, _ = run(
        [("kb-1", PRICE)], make_script({"260": 0.9}, {"260": 0.9}, answer="260"), answer_units=answer_units
    )
    assert pred.action == Action.CORRECT.value
    assert pred.answer == ("260 velds" if answer_units else "260")
    assert pred.trace.lm_answer == ("260" if answer_units else None)  # the LM's own reply is kept
    from crag_dspy.cli import format_trace

    assert ("the LM replied '260'" in format_trace(pred.trace)) is answer_units


def test_plain_rag_reads_a_bare_number_answer_as_crag_does():
    from crag_dspy.baselines import PlainRAG

    lm = ScriptedLM(lambda system, user: "260")
    assert PlainRAG(ListRetriever([("kb-1", PRICE)]), lm=lm)(question="Cap?").answer == "260 velds"
    assert (
        PlainRAG(ListRetriever([("kb-1", PRICE)]), lm=lm, answer_units=False)(question="Cap?").answer == "260"
    )


def test_passages_shown_alike_are_one_grader_request():
    # Two chunks of one document that the grader is shown alike: one LM request, the same grade.
    same = "The AquaProbe 220 measures 0 to 25 mg/L."
    pred, lm = run([("kb-1", same), ("kb-1", same)], make_script({"0 to 25": 0.9}))
    assert len(pred.trace.documents) == 2
    assert [d.score for d in pred.trace.documents] == [pytest.approx(0.9, abs=1e-6)] * 2
    assert sum("You judge search results" in system for system, _ in lm.calls) == 1
    assert len(lm.calls) == len(set(lm.calls))


def test_a_strip_repeated_by_two_web_results_is_one_strip_filter_request():
    copy = WebResult("WQ-17 mirror", "https://mirror.example/wq17", WEB.content)
    pred, lm = run([("kb-1", BAD)], make_script({}, {"90 days": 0.9}), web=ListWebSearch([WEB, copy]))
    assert pred.action == Action.INCORRECT.value
    assert [s.score for s in pred.trace.external_strips] == [pytest.approx(0.9, abs=1e-6)] * 2
    assert sum("You judge short knowledge strips" in system for system, _ in lm.calls) == 1
    assert len(lm.calls) == len(set(lm.calls))


@pytest.mark.parametrize("doc_score", [0.05, 0.5])  # INCORRECT and AMBIGUOUS: the routes that read the web
def test_with_web_search_off_no_query_is_rewritten_and_nothing_is_reported_as_failed(doc_score):
    from crag_dspy.web import NoWebSearch

    script = make_script({"0 to 25": doc_score}, {"0 to 25": 0.9})
    pred, lm = run([("kb-1", GOOD), ("kb-2", BAD)], script, web=NoWebSearch())
    prompts = [system for system, _ in lm.calls]
    assert not any("web search query" in system for system in prompts)  # no LM call for a search never made
    assert pred.trace.web_query is None and pred.trace.web_results == []
    assert not any("fail" in note for note in [*pred.trace.fallbacks, *pred.trace.errors])
    if doc_score > 0.1:  # AMBIGUOUS: the internal half of the route, as the paper has it
        assert pred.action == Action.AMBIGUOUS.value and pred.trace.fallbacks == []
        assert pred.answer == "0 to 25 mg/L" and "[internal]" in answer_contexts(lm)[0]
        return
    # INCORRECT with no web to correct it: "I don't know", without reading the rejected passages.
    assert pred.action == Action.INCORRECT.value and pred.answer == "I don't know"
    assert [s for s in prompts if "You judge search results" not in s] == []  # only the 2 gradings
    assert pred.trace.internal_strips == [] and pred.citations == [] and pred.trace.context == ""
    reason = "web search is disabled (web_search='none')"
    assert pred.trace.fallbacks == [
        f'{reason}; every passage was graded below lower (0.3): answered "I don\'t know" without reading them'
    ]


@pytest.mark.parametrize("abstain", [False, True])
def test_an_answer_no_kept_strip_states_is_flagged_or_turned_into_i_dont_know(abstain):
    from crag_dspy.cli import format_trace

    script = make_script({"0 to 25": 0.9}, answer="0 to 40 mg/L")  # the context says 0 to 25
    pred, lm = run([("kb-1", GOOD), ("kb-2", BAD)], script, abstain_ungrounded=abstain)
    if not abstain:
        assert pred.answer == "0 to 40 mg/L" and pred.trace.grounding.ungrounded == ["40 mg/l"]
        # The source that states part of it ("0 mg/L") is still cited; the warning names the rest.
        assert [c.doc_id for c in pred.citations] == ["kb-1"] and pred.trace.fallbacks == []
        return
    assert pred.answer == "I don't know" and pred.trace.lm_answer == "0 to 40 mg/L"
    assert pred.citations == [] and not pred.trace.grounding.flagged  # nothing left to flag
    (note,) = pred.trace.fallbacks
    assert note.startswith("the LM answered '0 to 40 mg/L', but no kept strip states 40 mg/l")
    assert len(lm.calls) == 3  # no extra LM call: the abstention is a check of strings
    assert "(the LM replied '0 to 40 mg/L'; no kept strip states it)" in format_trace(pred.trace)
