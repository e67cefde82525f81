"""Evaluation on several threads: the same table as on one, and SharedWork that stays exact under threads.

The LM is a scripted fake that sleeps a little at random so that the threads' requests interleave; the
evaluation checks that they really ran at the same time, so a sequential implementation fails here.
"""

import random
import re
import threading
import time

import dspy
import pytest
from fakes import ScriptedLM, field
from test_compile import KB, WEB, lines, write_code_sheets

from crag_dspy.settings import Settings
from optimize.evaluate import evaluate_domain, main
from optimize.parallel import map_questions
from optimize.shared_work import SharedWork

KEYS = re.compile(r"\b(" + "|".join([*KB, *WEB]) + r")\b")


def make_wide_domain(root):
    """Twelve test questions: six answered by the KB, four only on the web, and two rephrasings of
    web questions whose rewritten query is another question's (so questions share a web search)."""
    write_code_sheets(root)
    qa = [
        {"id": f"q{i}", "question": f"What is the {key} code?", "answers": [code], "split": "test"}
        for i, (key, code) in enumerate([*KB.items(), *WEB.items()])
    ]
    qa += [
        {
            "id": f"r{i}",
            "question": f"Which code was issued for {key}?",
            "answers": [WEB[key]],
            "split": "test",
        }
        for i, key in enumerate(["omega", "rho"])
    ]
    (root / "qa.jsonl").write_text(lines(qa))
    (root / "domain.toml").write_text('name = "wide"\nk = 2\n')
    return root


def key_of(text: str) -> str:
    return KEYS.search(text).group(1)


def wide_script(system: str, user: str):
    question = field(user, "question")
    if "from what you know" in system:
        return {"answer": "I don't know"}
    if "You judge" in system:
        passage = field(user, "document") or field(user, "strip")
        if key_of(question) == "sigma" and "sigma" not in passage.lower():
            return RuntimeError("injected: the grader's request failed")  # a note on some rows
        return 0.9 if f"The {key_of(question)} code" in passage else 0.1
    if "web search query" in system:
        return {"query": f"{key_of(question)} code"}
    if "Answer the question using only the context" in system:
        match = re.search(rf"The {key_of(question)} code is (\w+)", field(user, "context"))
        return {"answer": match.group(1) if match else "I don't know"}
    raise AssertionError(system[:60])


class Interleaving:
    """Wraps a script: sleeps 1-10 ms per request and records how many requests were in flight at most."""

    def __init__(self, script):
        self.script, self.lock, self.in_flight, self.peak = script, threading.Lock(), 0, 0

    def __call__(self, system, user):
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            time.sleep(random.uniform(0.001, 0.01))
            return self.script(system, user)
        finally:
            with self.lock:
                self.in_flight -= 1


def without_seconds(value):
    """A report part with every wall time left out (they are the one thing threads may change)."""
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if "seconds" not in k and k != "num_threads"}
    if isinstance(value, list):
        return [without_seconds(v) for v in value]
    return value


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parallel")
    settings = Settings(
        domain_dir=make_wide_domain(tmp / "wide"), chroma_path=tmp / "chroma", web_search="offline"
    )
    results = {}
    for threads in (1, 4):
        script = Interleaving(wide_script)
        lm = ScriptedLM(script)
        report = evaluate_domain(
            settings, lm=lm, out=tmp / f"out-{threads}" / "wide-test", progress=False, num_threads=threads
        )
        results[threads] = report, lm, script
    return results


def test_four_threads_ran_questions_at_the_same_time(runs):
    assert runs[1][2].peak == 1
    assert runs[4][2].peak > 1  # else this file tests nothing
    assert runs[4][0]["cost"]["num_threads"] == 4


def test_parallel_table_is_the_sequential_table(runs):
    (one, lm_one, _), (four, lm_four, _) = runs[1], runs[4]
    assert one["questions"] == four["questions"] == 12
    # Every cell but wall times: accuracy, actions, correction, errors, standalone and marginal
    # requests, calls and tokens of every variant, and the grader's quality.
    assert without_seconds(four["variants"]) == without_seconds(one["variants"])
    assert without_seconds(four["grader"]) == without_seconds(one["grader"])
    assert without_seconds(four["cost"]) == without_seconds(one["cost"])
    # Row by row, in question order: answers, actions, correctness, costs and the errors noted.
    assert [(r["id"], r["variant"]) for r in four["rows"]] == [(r["id"], r["variant"]) for r in one["rows"]]
    assert without_seconds(four["rows"]) == without_seconds(one["rows"])
    # The same LM requests (a failed judgement's retries included), no piece computed twice.
    assert sorted(lm_four.calls) == sorted(lm_one.calls)
    assert four["cost"]["pieces"] == one["cost"]["pieces"]


def test_the_compared_table_is_not_trivial(runs):
    report = runs[1][0]
    rows = {row["name"]: row for row in report["variants"]}
    crag = rows["CRAG (default thresholds)"]
    assert crag["correct"] >= 10 and {a: s["taken"] for a, s in crag["actions"].items()}["INCORRECT"] == 6
    assert rows["no retrieval"]["correct"] == 0 and rows["plain RAG"]["correct"] == 6
    assert any(row["errors"] for row in report["rows"])  # the injected failure is noted on its rows
    marginal = sum(row["marginal"]["requests"] for row in report["variants"])
    assert marginal + report["cost"]["frontier_lm_requests"] == report["cost"]["lm_requests"]


def test_num_threads_below_one_is_a_clear_error(tmp_path, capsys):
    settings = Settings(domain_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="--num-threads must be a whole number of at least 1"):
        evaluate_domain(settings, lm=ScriptedLM(wide_script), num_threads=0)
    assert main(["--num-threads", "0", "--domain-dir", str(tmp_path / "missing")]) == 2
    assert "--num-threads must be a whole number of at least 1, got 0" in capsys.readouterr().err


# --- SharedWork under threads ------------------------------------------------------------------------


def run_threads(n, target):
    """Run ``target(i)`` on n threads that start together; return their results (or exceptions)."""
    barrier, results = threading.Barrier(n), [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = target(i)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def ask(lm, text):
    with dspy.context(lm=lm):
        return dspy.Predict("question -> answer")(question=text).answer


def test_a_piece_wanted_by_many_threads_at_once_is_computed_once_and_charged_once():
    lm = ScriptedLM(lambda s, u: (time.sleep(0.05), {"answer": "x"})[1])
    work, computed = SharedWork(), []

    def compute():
        computed.append(threading.get_ident())
        time.sleep(0.1)  # the other threads arrive while it is being computed
        return ask(lm, "shared")

    def use(i):
        with work.consumer(f"c{i}") as used:
            value = work.get("k", compute)
        return value, used, work.cost(used)

    results = run_threads(8, use)
    assert len(computed) == 1 and len(lm.calls) == 1
    assert all(value == "x" and used == {"k"} for value, used, _ in results)
    assert all(cost.requests == cost.usage.calls == 1 for _, _, cost in results)
    assert work.total().requests == work.total().usage.calls == 1 and len(work) == 1
    assert len(work.owned()) == 1  # one owner, whichever thread got there first


def test_requests_and_usage_are_charged_to_the_piece_of_the_calling_thread():
    # Two pieces computed at the same time, one making 3 LM requests and one making 1, interleaved.
    lm = ScriptedLM(lambda s, u: (time.sleep(random.uniform(0.005, 0.02)), {"answer": "x"})[1])
    work = SharedWork()

    def piece(i):
        calls = 3 if i == 0 else 1
        return work.get(f"p{i}", lambda: [ask(lm, f"p{i} q{j}") for j in range(calls)])

    run_threads(2, piece)
    assert [work.cost([k]).requests for k in ("p0", "p1")] == [3, 1]
    assert [work.cost([k]).usage.calls for k in ("p0", "p1")] == [3, 1]
    assert work.total().requests == work.total().usage.calls == len(lm.calls) == 4


def test_a_piece_another_thread_is_computing_is_waited_for_and_stays_a_dependency():
    lm = ScriptedLM(lambda s, u: {"answer": "x"})
    work, started, inner_calls = SharedWork(), threading.Event(), []

    def inner():
        inner_calls.append(1)
        started.set()
        time.sleep(0.1)
        return ask(lm, "inner")

    def outer():
        started.wait(5)  # the inner piece is being computed by the other thread now
        return work.get("inner", inner) + ask(lm, "outer")

    def use(i):
        with work.consumer(f"c{i}") as used:
            value = work.get("inner", inner) if i == 0 else work.get("outer", outer)
        return value, used

    (v0, used0), (v1, used1) = run_threads(2, use)
    assert inner_calls == [1] and v0 == "x" and v1 == "xx"
    assert used0 == {"inner"} and used1 == {"outer", "inner"}
    # The outer piece's own cost is its one request; the inner one is charged once, to the inner piece.
    assert work.cost(["outer"]).requests == work.cost(["inner"]).requests == 1
    assert work.cost(["outer"]).usage.calls == 1 and work.total().usage.calls == 2
    assert set(work.owned()) == {"c0", "c1"}


def test_a_failed_piece_fails_every_thread_without_recomputing():
    work, computed = SharedWork(), []

    def boom():
        computed.append(1)
        time.sleep(0.05)
        raise RuntimeError("down")

    results = run_threads(6, lambda i: work.get("k", boom))
    assert computed == [1] and all(isinstance(r, RuntimeError) and str(r) == "down" for r in results)


def test_an_interrupted_computation_lets_a_waiting_thread_compute_the_piece():
    class Interrupted(BaseException):
        pass

    work, attempts = SharedWork(), []

    def compute():
        attempts.append(threading.get_ident())
        time.sleep(0.05)
        if len(attempts) == 1:
            raise Interrupted  # not memoized: nothing was computed
        return "value"

    results = run_threads(2, lambda i: work.get("k", compute))
    assert len(attempts) == 2 and sorted(map(type, results), key=str) == sorted([Interrupted, str], key=str)
    assert work.get("k", compute) == "value" and len(attempts) == 2


def test_a_piece_that_needs_itself_fails_instead_of_waiting_forever():
    work = SharedWork()
    with pytest.raises(RuntimeError, match="needs itself"):
        work.get("k", lambda: work.get("k", lambda: 1))


# --- map_questions --------------------------------------------------------------------------------------


def test_map_questions_keeps_input_order_and_runs_on_several_threads():
    threads = set()

    def slow(i):
        threads.add(threading.get_ident())
        time.sleep(random.uniform(0.0, 0.02))
        return i * i

    assert map_questions(slow, range(20), num_threads=4, progress=False) == [i * i for i in range(20)]
    assert len(threads) > 1
    threads.clear()
    assert map_questions(slow, range(5), num_threads=1, progress=False) == [0, 1, 4, 9, 16]
    assert threads == {threading.get_ident()}  # one thread: the caller's own


def test_map_questions_keeps_dspy_context_and_tracked_usage_in_worker_threads():
    lm = ScriptedLM(lambda s, u: {"answer": "x"})
    with dspy.context(lm=lm), dspy.track_usage() as tracker:
        seen = map_questions(
            lambda i: (dspy.settings.lm, dspy.Predict("question -> answer")(question=f"q{i}").answer),
            range(6),
            num_threads=3,
            progress=False,
        )
    assert seen == [(lm, "x")] * 6
    assert len(tracker.usage_data["scripted/fake"]) == 6  # every worker's usage reached the caller


def test_map_questions_raises_the_first_failure_in_input_order():
    def fail(i):
        time.sleep(0.05 if i == 2 else 0.0)
        if i in (2, 5):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 2"):
        map_questions(fail, range(8), num_threads=8, progress=False)
    with pytest.raises(ValueError, match="num_threads must be a whole number of at least 1"):
        map_questions(fail, [1], num_threads=0, progress=False)


def test_routes_precomputed_on_threads_are_the_sequential_routes(tmp_path):
    from crag_dspy.app import assemble
    from crag_dspy.domain import load_domain
    from crag_dspy.store import ingest_domain
    from optimize.thresholds import precompute_routes

    settings = Settings(
        domain_dir=make_wide_domain(tmp_path / "wide"), chroma_path=tmp_path / "chroma", web_search="offline"
    )
    domain = load_domain(settings.domain_dir)
    routes = {}
    for threads in (1, 4):
        script = Interleaving(wide_script)
        crag, backends = assemble(settings, ScriptedLM(script), False)
        ingest_domain(backends.client, domain, backends.embedder, progress=False)
        found, usage = precompute_routes(crag, domain.qa, progress=False, num_threads=threads)
        routes[threads] = ([vars(r) for r in found], usage.calls, script.peak)
    assert routes[4][2] > 1 and routes[1][2] == 1  # the threads really overlapped
    assert routes[4][:2] == routes[1][:2]  # the same grades, answers, correctness, costs and LM calls


def test_row_sets_leave_out_the_costly_rows():
    from optimize.variants import table_variants

    main_rows = [v.name for v in table_variants(True, "main")]
    assert main_rows == [
        "no retrieval",
        "plain RAG",
        "RAG + web always",
        "CRAG (default thresholds)",
        "CRAG (program)",
    ]
    assert [v.name for v in table_variants(True, "main+retry")] == [*main_rows, "CRAG + internal retry"]
    assert len(table_variants(True)) == len(main_rows) + 1 + 6  # the retry row and six ablations
    with pytest.raises(ValueError, match="unknown row set"):
        table_variants(True, "some")
    with pytest.raises(SystemExit):
        main(["--rows", "some"])
