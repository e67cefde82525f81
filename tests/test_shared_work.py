"""SharedWork's memo and cost accounting; forwards over a shared stage cache (forced actions, ablations);
the stage cache's keys."""

import time

import dspy
import pytest
from fakes import ListRetriever, ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.config import CRAGConfig
from crag_dspy.protocols import WebResult, WebSearchError
from crag_dspy.routing import Ablation, Action
from crag_dspy.stages import Answer, Grade, Stage, config_value
from optimize.shared_work import SharedWork

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


def test_every_variant_gets_the_same_web_results_or_the_same_failure():
    work = SharedWork()
    web = ListWebSearch([WEB])
    crag = CRAG(
        ListRetriever([("kb-1", BAD)]), web, CRAGConfig(k=1, witness_results=0), lm=ScriptedLM(script)
    )
    for _ in range(2):
        assert crag(question=Q, action=Action.INCORRECT, cache=work).trace.web_results[0].url == WEB.url
    assert web.queries == ["AquaProbe 220; range"]
    failing, work = ListWebSearch(error=WebSearchError("down")), SharedWork()  # backends are keyed by name
    down = CRAG(ListRetriever([("kb-1", BAD)]), failing, CRAGConfig(k=1), lm=ScriptedLM(script))
    for _ in range(2):  # the failure and its fallback reach every run that reads the cached search
        trace = down(question=Q, action=Action.INCORRECT, cache=work).trace
        assert trace.web_results == [] and any("web search failed (down)" in f for f in trace.fallbacks)
    assert failing.queries == ["AquaProbe 220; range"]


def make(lm, **config):
    return CRAG(
        ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2, **config), lm=lm
    )


def test_programs_with_the_same_predictors_share_stages_and_the_crag_is_not_changed():
    lm = ScriptedLM(script)
    work = SharedWork()
    crag = make(lm)
    a = crag(question=Q, action=Action.AMBIGUOUS, cache=work)
    b = make(lm, lower=0.0, upper=1.0)(question=Q, action=Action.AMBIGUOUS, cache=work)
    assert a.trace.documents == b.trace.documents and a.answer == b.answer == "0 to 25 mg/L"
    assert len(lm.calls) == len(set(lm.calls))
    assert type(crag.retriever).__name__ == "ListRetriever" and type(crag.grader).__name__ == "BinaryJudge"

    compiled = make(lm)
    compiled.grader.predict.demos = [dspy.Example(question="q", document="d", relevant=True)]
    before = len(lm.calls)
    compiled(question=Q, action=Action.CORRECT, cache=work)
    assert len([u for s, u in lm.calls[before:] if "You judge search results" in s]) == 2  # graded again


def test_one_strip_is_judged_once_whatever_query_found_it():
    lm = ScriptedLM(script)
    crag, work = make(lm, witness_results=0), SharedWork()
    rewritten = crag(question=Q, action=Action.INCORRECT, cache=work)
    original = crag(question=Q, action=Action.INCORRECT, ablation=Ablation(rewrite=False), cache=work)
    assert rewritten.trace.web_query != original.trace.web_query == Q  # same web page for both queries
    assert rewritten.trace.external_strips == original.trace.external_strips
    strip_calls = [u for s, u in lm.calls if "You judge short knowledge strips" in s]
    assert len(strip_calls) == len(set(strip_calls)) == 1


def test_ablations_original_query_unselected_web_strips_and_raw_passages():
    lm = ScriptedLM(script)
    web = ListWebSearch([WEB, WebResult("Canteen", "https://c.example", BAD)])
    crag = CRAG(ListRetriever([("kb-1", BAD)]), web, CRAGConfig(k=1, witness_results=0), lm=lm)
    raw = Ablation(refine=False, rewrite=False, select=False)
    pred = crag(question=Q, action=Action.AMBIGUOUS, ablation=raw)
    assert web.queries == [Q]
    assert [s.doc_id for s in pred.trace.external_strips] == ["https://x.example", "https://c.example"]
    assert pred.trace.documents == []  # a forced action without refinement reads no grade
    assert [s for s, _ in lm.calls if "You judge" in s or "web search query" in s] == []
    assert {s.score_source for s in pred.trace.external_strips} == {"unfiltered"}
    assert all(s.kept for s in pred.trace.external_strips)
    assert pred.trace.context.startswith(f"[internal] (kb-1) {BAD}")  # the passage whole, unjudged
    rewritten = crag(question=Q, action=Action.INCORRECT)
    assert rewritten.trace.web_query == "AquaProbe 220; range" == web.queries[-1]


def test_a_text_judged_in_one_stage_is_not_judged_again_in_another():
    # The web result repeats a strip of the passage: internal refinement judges it, the web's reuses it.
    web = WebResult("Range", "https://x.example", GOOD)
    passage = f"{GOOD} {BAD} The canteen closes at 16:00."
    config = CRAGConfig(k=1, sentences_per_strip=1, witness_results=0)
    crag = CRAG(ListRetriever([("kb-1", passage)]), ListWebSearch([web]), config)
    crag.lm = lm = ScriptedLM(script)
    work = SharedWork()
    internal = crag(question=Q, action=Action.CORRECT, cache=work).trace.internal_strips
    judged = [u for s, u in lm.calls if "You judge" in s]
    external = crag(question=Q, action=Action.INCORRECT, ablation=Ablation(rewrite=False), cache=work)
    assert [u for s, u in lm.calls if "You judge" in s] == judged  # no strip judged twice
    assert [s.text for s in internal if s.kept] == [s.text for s in external.trace.external_strips if s.kept]
    assert len(judged) == 4  # the passage, then its three strips
    crag(question=Q, action=Action.INCORRECT, ablation=Ablation(rewrite=False), cache=SharedWork())
    assert len([u for s, u in lm.calls if "You judge" in s]) == len(judged) + 2  # another cache: all again


def test_passages_shown_alike_share_one_answer_of_the_lm_each_calibrated_with_its_own_evidence():
    from crag_dspy.judges.calibration import Calibration

    crag = CRAG(ListRetriever([("kb-1", GOOD), ("kb-2", BAD)]), ListWebSearch([WEB]), CRAGConfig(k=2))
    crag.lm = lm = ScriptedLM(script)
    crag.grader.view = lambda inputs: {**inputs, "document": GOOD}  # both passages cut to one excerpt
    crag.grader.calibration = Calibration(1.0, -1.0, {"term_coverage": 2.0})
    scores = [d.score for d in crag(question=Q, action=Action.CORRECT, cache=SharedWork()).trace.documents]
    assert len([u for s, u in lm.calls if "You judge search results" in s]) == 1
    assert scores[0] > scores[1]  # GOOD holds the question's terms, BAD none


def test_a_forced_route_answers_from_the_web_reserve_exactly_as_forward_does():
    # The web's only strip scores 0.1: below the strip threshold, so it is the reserve.
    web = WebResult("Fares", "https://f.example", "A day ticket costs 9 velds.")
    config = CRAGConfig(k=1, reserve_strips=1)
    crag = CRAG(ListRetriever([("kb-1", BAD)]), ListWebSearch([web]), config, lm=ScriptedLM(script))
    pred = crag(question=Q)
    assert pred.action == Action.INCORRECT.value
    assert pred.trace.context == "[web] (Fares) A day ticket costs 9 velds."

    lm = ScriptedLM(script)
    crag.lm = lm
    assert crag(question=Q, action=Action.INCORRECT, cache=SharedWork()).answer == pred.answer
    contexts = [field(user, "context") for system, user in lm.calls if "Answer the question" in system]
    assert contexts == [pred.trace.context]


# -- the stage cache's keys -------------------------------------------------------------------------
def every_stage():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    return [stage for stage in subclasses(Stage) if stage.name]


def test_every_stage_reads_real_config_fields_and_uses_real_parts_of_the_program():
    crag = make(ScriptedLM(script))
    assert {stage.name for stage in every_stage()} >= {
        "retrieve",
        "grade",
        "rewrite",
        "web_search",
        "refine_internal",
        "refine_external",
        "answer",
        "witness_search",
        "internal_retry",
    }
    for stage in every_stage():
        for path in stage.reads:
            config_value(crag.config, path)  # raises AttributeError for a field that does not exist
        for part in stage.uses:
            assert getattr(crag, part) is not None, (stage.__name__, part)


@pytest.mark.parametrize("stage", every_stage(), ids=lambda stage: stage.__name__)
def test_a_stage_key_changes_with_every_config_field_it_reads_and_only_with_those(stage):
    crag = make(ScriptedLM(script))
    key = stage(crag, crag.new_run(Q)).key({"question": Q})
    for path in stage.reads:
        head, *rest = path.split(".")
        value = config_value(crag.config, path)
        changed = (
            (not value) if isinstance(value, bool) else value + 1 if isinstance(value, int) else value / 2
        )
        other = crag.deepcopy()
        if rest:  # a nested group: lm_calls.retries
            other.config = other.config.replace(
                **{head: {**config_value(crag.config, head), rest[0]: changed}}
            )
        else:
            other.config = other.config.replace(**{head: changed})
        assert stage(other, other.new_run(Q)).key({"question": Q}) != key, path
    unread = next(f for f in ("k", "web_results", "max_strips") if f not in stage.reads)
    other = crag.deepcopy()
    other.config = other.config.replace(**{unread: config_value(crag.config, unread) + 1})
    assert stage(other, other.new_run(Q)).key({"question": Q}) == key


def test_a_new_config_field_a_stage_reads_changes_its_key():
    class Config(CRAGConfig):
        patience: int = 1

    class Patient(Stage):
        name = "patient"
        reads = ("patience",)

    crag = make(ScriptedLM(script))
    keys = set()
    for patience in (1, 2):
        crag.config = Config(k=2, patience=patience)
        keys.add(Patient(crag, crag.new_run(Q)).key({"question": Q}))
    assert len(keys) == 2


def test_a_stage_key_changes_with_the_state_of_what_it_uses():
    crag = make(ScriptedLM(script))
    key = Answer(crag, crag.new_run(Q)).key({"question": Q, "context": "c"})
    crag.answerer.demos = [dspy.Example(question="q", context="c", answer="a")]
    assert Answer(crag, crag.new_run(Q)).key({"question": Q, "context": "c"}) != key
    grade = Grade(crag, crag.new_run(Q)).key({"question": Q, "passages": []})
    crag.grader.calibration = crag.grader.calibration.__class__(1.0, -1.0, {})
    assert Grade(crag, crag.new_run(Q)).key({"question": Q, "passages": []}) != grade


def test_tokens_are_counted_from_each_requests_text_and_the_same_when_the_cache_answers(monkeypatch):
    """DSPy clears a cached response's usage; the tokens a piece costs must not depend on the cache."""
    from dspy.clients.cache import Cache
    from fake_servers import FakeOpenAI

    from optimize.tokens import completion_tokens, prompt_tokens

    # A memory-only cache of this test's own: the second identical request is a cache hit.
    monkeypatch.setattr(
        dspy, "cache", Cache(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None)
    )
    with FakeOpenAI(lambda system, user: {"answer": "Paris is the capital of France"}) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="x", cache=True, num_retries=0)
        counted = []
        for key in ("cold", "warm"):
            work = SharedWork()
            with work.consumer(key) as used:
                work.get(key, lambda: ask(lm, "What is the capital of France?"))
            counted.append(work.cost(used))
    cold, warm = counted
    assert lm.history[0]["usage"] and lm.history[-1]["usage"] == {}  # DSPy's cache answered the second
    assert cold.usage.calls == 1 and warm.usage.calls == 0  # the served usage: none for the cache hit
    assert cold.requests == warm.requests == 1
    assert cold.tokens == warm.tokens > 0
    # Exactly the request's messages and output, counted by LiteLLM's counter.
    entry = lm.history[-1]
    expected = prompt_tokens(lm.model, {"messages": entry["messages"]}) + completion_tokens(
        lm.model, entry["outputs"]
    )
    assert cold.tokens == expected


def test_tokens_are_charged_to_the_innermost_piece_like_requests():
    lm = ScriptedLM(lambda s, u: {"answer": "x"})
    work = SharedWork()

    def outer():
        work.get("inner", lambda: ask(lm, "a much longer inner question " * 20))
        return ask(lm, "outer")

    with work.consumer("c") as used:
        work.get("outer", outer)
    inner, outer_cost = work.cost(["inner"]), work.cost(["outer"])
    assert inner.tokens > outer_cost.tokens > 0
    assert work.cost(used).tokens == inner.tokens + outer_cost.tokens == work.total().tokens
