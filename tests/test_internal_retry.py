"""Rewrite-and-retry of internal retrieval before the web: the pure routing rule, the rounds CRAG runs
(cap, early stop, trace, faults), the option in program JSON and on the command line, and the rounds as
shared pieces. Scripted LM and stores: control flow, not quality."""

import json

import pytest
from fakes import ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.cli import build_parser, format_trace, settings_from_args
from crag_dspy.config import CRAGConfig
from crag_dspy.program import ProgramError, apply_program, save_program
from crag_dspy.protocols import Passage, WebResult
from crag_dspy.retry import check_internal_retries, is_new_query
from crag_dspy.routing import Action, decide_action
from optimize.shared_work import SharedWork

C, A, I = Action.CORRECT, Action.AMBIGUOUS, Action.INCORRECT

Q = "What is the range of the AquaProbe 220?"
REWRITE = "AquaProbe 220; range"
BAD = "The canteen opens at 08:00."
MID = "The AquaProbe 220 sheet lists its sensors."
GOOD = "The AquaProbe 220 has a range of 0 to 25 mg/L."
WEB = WebResult("Range", "https://x.example", "The AquaProbe 220 measures 0 to 25 mg/L.")


@pytest.mark.parametrize("bad", [-1, 1.5, None, "two"])
def test_check_internal_retries(bad):
    assert check_internal_retries(3) == 3
    with pytest.raises(ValueError, match="internal_retries must be an integer >= 0"):
        check_internal_retries(bad)
    with pytest.raises(ValueError, match="internal_retries"):
        CRAGConfig(internal_retries=bad)


def test_a_query_is_new_unless_it_repeats_one_tried_ignoring_case_and_spacing():
    assert is_new_query("AquaProbe 220; range", [Q])
    assert not is_new_query("  aquaprobe 220;   RANGE ", [Q, "AquaProbe 220; range"])
    assert not is_new_query("   ", [Q])


# -- CRAG's rounds ----------------------------------------------------------------------------------
class QueryRetriever:
    """The passages listed for each query (a query not listed finds nothing); fails on ``fail`` queries."""

    name = "byquery"

    def __init__(self, table, fail=()):
        self.table, self.fail, self.queries = table, set(fail), []

    def retrieve(self, query, k):
        self.queries.append(query)
        if query in self.fail:
            raise ConnectionError("chroma at 10.0.0.5 refused the connection")
        rows = self.table(query) if callable(self.table) else self.table.get(query, [])
        return [
            Passage(id=pid, doc_id=pid, title=pid, text=text, rank=i, similarity=0.9 - i / 10)
            for i, (pid, text) in enumerate(rows[:k])
        ]


def revision(tried: str) -> str:
    """The scripted reviser's query: a new one for every list of queries tried."""
    return f"query v{len(tried.splitlines())}"


def make_script(rewrite=REWRITE, revise=revision):
    def script(system, user):
        if "You judge search results" in system or "You judge short knowledge strips" in system:
            text = field(user, "document") or field(user, "strip")
            return 0.9 if "0 to 25" in text else 0.5 if "sensors" in text else 0.05
        if "queries tried so far" in system:
            return {"query": revise(field(user, "tried_queries"))}
        if "web search query" in system:
            return {"query": rewrite}
        if "Answer the question using only the context" in system:
            return {"answer": "0 to 25 mg/L" if "0 to 25" in field(user, "context") else "I don't know"}
        raise AssertionError(f"unexpected prompt: {system[:80]}")

    return script


# The question finds a bad passage (INCORRECT); the rewritten query finds it again and a middling one
# (AMBIGUOUS); the revised query of round 2 finds the answer (CORRECT).
STORE = {Q: [("c0", BAD)], REWRITE: [("c0", BAD), ("c1", MID)], "query v2": [("c2", GOOD)]}


def run(table=STORE, *, retries=2, fail=(), script=None, lower=0.3, upper=0.7):
    lm = ScriptedLM(script or make_script())
    retriever, web = QueryRetriever(table, fail), ListWebSearch([WEB])
    # The route's own searches are under test: no witness search after the answer (test_witness_search.py).
    config = CRAGConfig(k=3, internal_retries=retries, lower=lower, upper=upper, witness_results=0)
    crag = CRAG(retriever, web, config, lm=lm)
    return crag(question=Q), lm, retriever, web


def calls_to(lm, marker):
    return [user for system, user in lm.calls if marker in system]


def first_grades(trace):
    found = {pid for r in trace.internal_rounds for pid in r.passage_ids}
    return [d.score for d in trace.documents if d.id not in found]


def agrees_with_the_pure_rule(trace):
    """The rule, written out: a round runs while the action on every grade so far uses the web, no round
    ended with an error and fewer than ``internal_retries`` ran; the action is decided on them all."""
    scores, used = first_grades(trace), 0
    for number, found in enumerate(trace.internal_rounds, 1):
        if not decide_action(scores, trace.lower, trace.upper).uses_web or number > trace.internal_retries:
            return False  # a round that should not have run
        scores += found.scores
        used = number
        if found.error:
            break
    action = decide_action(scores, trace.lower, trace.upper)
    stopped = action is C or used == trace.internal_retries or (used and trace.internal_rounds[-1].error)
    return action.value == trace.action and used == len(trace.internal_rounds) and bool(stopped or not used)


def test_off_is_todays_behaviour():
    pred, lm, retriever, web = run(retries=0)
    _default, default_lm, _, _ = run(retries=0)
    assert CRAG(None, None).config.internal_retries == 0  # off by default
    assert pred.action == "INCORRECT" and retriever.queries == [Q] and web.queries == [REWRITE]
    assert pred.trace.internal_rounds == [] and pred.trace.first_action is None
    assert "internal_retry" not in pred.trace.timings
    assert calls_to(lm, "queries tried so far") == []
    assert lm.calls == default_lm.calls  # the same LM requests as any CRAG with the option off
    assert "internal retries" not in format_trace(pred.trace)


def test_rounds_stop_as_soon_as_the_action_is_correct_and_every_round_is_traced():
    pred, lm, retriever, web = run(retries=3)
    trace = pred.trace
    assert retriever.queries == [Q, REWRITE, "query v2"]  # round 3 never runs: round 2 was CORRECT
    assert web.queries == []  # CORRECT: the web is never searched
    assert (trace.first_action, trace.action, trace.internal_retries) == ("INCORRECT", "CORRECT", 3)
    rounds = [r.model_dump() for r in trace.internal_rounds]
    assert rounds == [
        {
            "round": 1,
            "query": REWRITE,
            "passage_ids": ["c1"],
            "scores": [pytest.approx(0.5)],
            "repeated": 1,  # c0 was graded already: not graded twice
            "action": "AMBIGUOUS",
            "error": None,
        },
        {
            "round": 2,
            "query": "query v2",
            "passage_ids": ["c2"],
            "scores": [pytest.approx(0.9)],
            "repeated": 0,
            "action": "CORRECT",
            "error": None,
        },
    ]
    # New passages are listed after those graded before them, and graded once each.
    assert [(d.id, d.rank) for d in trace.documents] == [("c0", 0), ("c1", 1), ("c2", 2)]
    assert len(calls_to(lm, "You judge search results")) == 3
    # Round 2's query was written knowing the queries tried; the rewrite was asked once.
    (revise,) = calls_to(lm, "queries tried so far")
    assert field(revise, "tried_queries") == f"{Q}\n{REWRITE}"
    assert len(calls_to(lm, "web search query")) == 1
    assert len(set(lm.calls)) == len(lm.calls)  # no LM request repeated
    # Internal knowledge is refined from every graded passage, and the answer comes from it.
    assert pred.answer == "0 to 25 mg/L" and "0 to 25 mg/L" in pred.context and "[web]" not in pred.context
    assert {s.doc_id for s in trace.internal_strips} == {"c1", "c2"}  # c0 graded below the strip cut
    assert trace.fallbacks == [] and trace.errors == []
    assert (
        "internal_retry" in trace.timings and trace.lm_usage["internal_retry"].calls == 3
    )  # 2 grades, 1 revision
    assert agrees_with_the_pure_rule(trace)
    text = format_trace(trace)
    assert "first INCORRECT, 2 internal retry round(s)" in text
    assert "#2  0.90  c2  [c2]  (retry round 2)" in text
    assert "round 1: query='AquaProbe 220; range' graded [0.50], 1 found again -> AMBIGUOUS" in text
    assert "round 2: query='query v2' graded [0.90] -> CORRECT" in text


def endless(query):
    """A store that finds one new, irrelevant passage for every query."""
    return [(f"p-{query}", f"The canteen serves soup ({query}).")]


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_the_cap_holds_and_the_web_is_searched_with_the_one_rewritten_query(cap):
    pred, lm, retriever, web = run(endless, retries=cap)
    trace = pred.trace
    assert [r.round for r in trace.internal_rounds] == list(range(1, cap + 1))
    assert retriever.queries == [Q, REWRITE, "query v2", "query v3"][: cap + 1]
    assert [r.query for r in trace.internal_rounds] == retriever.queries[1:]
    assert all(r.action == "INCORRECT" and len(r.passage_ids) == 1 for r in trace.internal_rounds)
    assert pred.action == "INCORRECT" and web.queries == [REWRITE] and trace.web_query == REWRITE
    assert len(calls_to(lm, "web search query")) == 1  # the web reused the rounds' rewrite
    assert len(calls_to(lm, "queries tried so far")) == cap - 1
    assert len(set(lm.calls)) == len(lm.calls)
    assert pred.answer == "0 to 25 mg/L" and pred.context.startswith("[web]")
    assert agrees_with_the_pure_rule(trace)


def test_a_correct_first_retrieval_never_retries():
    pred, lm, retriever, web = run({Q: [("c2", GOOD)]}, retries=2)
    assert pred.action == "CORRECT" and retriever.queries == [Q] and web.queries == []
    assert pred.trace.internal_rounds == [] and pred.trace.first_action is None
    assert calls_to(lm, "web search query") == [] and calls_to(lm, "queries tried so far") == []


def test_a_failed_re_retrieval_degrades_to_the_web_with_the_error_traced():
    pred, lm, _retriever, web = run(retries=2, fail={REWRITE})
    trace = pred.trace
    (round_1,) = trace.internal_rounds  # the failure ends the rounds
    assert round_1.passage_ids == [] and round_1.action == "INCORRECT"
    assert "failed in an internal retry" in round_1.error and "ConnectionError" in round_1.error
    assert round_1.error in trace.errors
    assert trace.fallbacks == ["an internal retry round failed; went on with the passages graded before it"]
    assert pred.action == "INCORRECT" and web.queries == [REWRITE]  # no second rewrite for the web
    assert len(calls_to(lm, "web search query")) == 1 and calls_to(lm, "queries tried so far") == []
    assert pred.answer == "0 to 25 mg/L" and pred.context.startswith("[web]")
    assert "(ended: retriever byquery failed in an internal retry" in format_trace(trace)
    assert agrees_with_the_pure_rule(trace)


def test_a_failure_in_a_later_round_keeps_what_earlier_rounds_graded():
    pred, _lm, _retriever, web = run(retries=2, fail={"query v2"})
    trace = pred.trace
    assert [(r.round, r.passage_ids, r.action) for r in trace.internal_rounds] == [
        (1, ["c1"], "AMBIGUOUS"),
        (2, [], "AMBIGUOUS"),
    ]
    assert trace.internal_rounds[1].error is not None
    # AMBIGUOUS: internal knowledge of every passage graded (round 1's included) and the web.
    assert pred.action == "AMBIGUOUS" and web.queries == [REWRITE]
    assert "c1" in {s.doc_id for s in trace.internal_strips}
    assert agrees_with_the_pure_rule(trace)


def test_a_failed_rewrite_ends_the_rounds_without_searching_the_question_again():
    pred, _lm, retriever, web = run(retries=2, script=make_script(rewrite=""))
    (round_1,) = pred.trace.internal_rounds
    assert round_1.query == Q and "repeats one already searched" in round_1.error
    assert retriever.queries == [Q]  # the same query would find the same passages
    assert web.queries == [Q]  # as without retries: the web is searched with the question itself
    assert "query rewrite failed; searched with the question itself" in pred.trace.fallbacks


def test_a_failed_query_revision_ends_the_rounds_and_says_so():
    pred, _lm, retriever, web = run(endless, retries=2, script=make_script(revise=lambda tried: ""))
    assert [r.error for r in pred.trace.internal_rounds] == [None, "no query: the query revision failed"]
    assert "query revision failed; the internal retries ended" in pred.trace.fallbacks
    assert retriever.queries == [Q, REWRITE] and web.queries == [REWRITE]


def test_a_revised_query_that_repeats_one_tried_is_not_searched():
    pred, _lm, retriever, _web = run(
        endless, retries=3, script=make_script(revise=lambda tried: REWRITE.upper())
    )
    assert [r.error is None for r in pred.trace.internal_rounds] == [True, False]
    assert retriever.queries == [Q, REWRITE]


# -- program JSON and command line ----------------------------------------------------------------
def test_the_option_travels_with_the_program(tmp_path):
    crag = CRAG(None, None, CRAGConfig(internal_retries=2))
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert doc["config"]["internal_retries"] == 2 and "reviser" in doc
    assert apply_program(CRAG(None, None), doc).config.internal_retries == 2
    doc["config"]["internal_retries"] = 0
    assert apply_program(CRAG(None, None, CRAGConfig(internal_retries=3)), doc).config.internal_retries == 0
    for bad in (-1, 1.5, "two"):
        doc["config"]["internal_retries"] = bad
        fresh = CRAG(None, None, CRAGConfig(internal_retries=1))
        with pytest.raises(ProgramError, match="internal_retries"):
            apply_program(fresh, doc)
        assert fresh.config.internal_retries == 1  # refused before anything changed


def test_the_reviser_demos_round_trip(tmp_path):
    import dspy

    crag = CRAG(None, None, CRAGConfig(internal_retries=2))
    crag.reviser.demos = [dspy.Example(question="q", tried_queries="q", query="other")]
    doc = json.loads(save_program(crag, tmp_path / "p.json", {"domain": "default"}).read_text())
    assert apply_program(CRAG(None, None), doc).reviser.demos[0]["query"] == "other"


def test_the_flag_and_environment_reach_the_settings(monkeypatch):
    parse = build_parser().parse_args
    assert settings_from_args(parse(["ask", "q"])).config.internal_retries == 0
    assert settings_from_args(parse(["ask", "q", "--internal-retries", "2"])).config.internal_retries == 2
    monkeypatch.setenv("CRAG_CONFIG__INTERNAL_RETRIES", "1")
    assert settings_from_args(parse(["ask", "q"])).config.internal_retries == 1
    assert settings_from_args(parse(["ask", "q", "--k", "3"])).config.internal_retries == 1  # kept
    with pytest.raises(ValueError, match="internal_retries"):
        settings_from_args(parse(["ask", "q", "--internal-retries", "-1"]))


def test_the_flag_overrides_a_compiled_programs_value(monkeypatch, tmp_path):
    from crag_dspy import app
    from crag_dspy.cli import program_from_args

    def fake_open(path, settings, **kwargs):
        crag = CRAG(None, None, CRAGConfig(internal_retries=2))  # what the program recorded
        crag.thresholds.load_state({"lower": 0.1, "upper": 0.9})
        return app.LoadedProgram(crag, "default", tmp_path / "p.json", {"metadata": {}})

    monkeypatch.setattr(app, "open_program", fake_open)
    parse = build_parser().parse_args
    assert program_from_args(parse(["ask", "q", "--program", "p.json"])).crag.config.internal_retries == 2
    flagged = parse(["ask", "q", "--program", "p.json", "--internal-retries", "0"])
    crag = program_from_args(flagged).crag
    assert crag.config.internal_retries == 0
    assert (crag.thresholds.lower, crag.thresholds.upper) == (0.1, 0.9)  # the program's stay


# -- a shared stage cache ------------------------------------------------------------------------------
def test_forwards_over_a_shared_cache_reuse_the_rounds_and_re_route_without_searching_again():
    pred, _, _, _ = run(retries=2)
    lm = ScriptedLM(make_script())
    retriever = QueryRetriever(STORE)
    config = CRAGConfig(k=3, internal_retries=2, witness_results=0)
    crag = CRAG(retriever, ListWebSearch([WEB]), config, lm=lm)
    work = SharedWork()
    shared = crag(question=Q, cache=work)
    assert (shared.answer, shared.action) == (pred.answer, pred.action)
    assert [r.query for r in shared.trace.internal_rounds] == [REWRITE, "query v2"]
    assert len(set(lm.calls)) == len(lm.calls) == len(pred.trace.documents) + 3  # + rewrite, revise, answer
    calls = len(lm.calls)
    again = crag(question=Q, cache=work)
    assert len(lm.calls) == calls  # every stage came from the cache ...
    assert again.trace.documents == shared.trace.documents  # ... with the trace entries it wrote
    assert again.trace.internal_rounds == shared.trace.internal_rounds and again.answer == pred.answer
    # Other thresholds re-route from the rounds already computed: round 1 now makes it CORRECT.
    early = crag.deepcopy()
    early.thresholds.load_state({"lower": 0.0, "upper": 0.4})
    rerouted = early(question=Q, cache=work).trace
    assert rerouted.action == "CORRECT" and [r.query for r in rerouted.internal_rounds] == [REWRITE]
    assert crag(question=Q, action=I, cache=work).trace.internal_rounds == []  # a forced action: no rounds
    assert retriever.queries == [Q, REWRITE, "query v2"]


def test_no_round_follows_one_that_ended_the_retries():
    crag = CRAG(
        QueryRetriever(STORE, fail={REWRITE}),
        ListWebSearch([WEB]),
        CRAGConfig(k=3, internal_retries=3, witness_results=0),
        lm=ScriptedLM(make_script()),
    )
    trace = crag(question=Q, cache=SharedWork()).trace
    assert trace.action == "INCORRECT" and len(trace.internal_rounds) == 1 and trace.internal_rounds[0].error
