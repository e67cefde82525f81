"""One loaded program, many threads: every answer and trace belongs to its own question.

Real threads against a real embedded Chroma and the real embedder; the LM is a scripted fake (in
process, and a real dspy.LM over HTTP) that sleeps a little so that requests interleave. One slow
test runs concurrent questions on the real embedded llama.cpp engine.
"""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from fake_servers import FakeOpenAI
from fakes import ListWebSearch, ScriptedLM, field

from crag_dspy import CRAG
from crag_dspy.app import load_program
from crag_dspy.config import CRAGConfig
from crag_dspy.domain import CorpusDoc
from crag_dspy.program import save_program
from crag_dspy.settings import Settings
from crag_dspy.store import ChromaRetriever, ingest_documents, open_client

CODES = {
    "zeta": "Z100",
    "theta": "T200",
    "kappa": "K300",
    "sigma": "S400",
    "delta": "D500",
    "lambda": "L600",
    "omega": "W700",
    "gamma": "G800",
}
THREADS = 8


def key_of(text: str) -> str:
    return next(k for k in CODES if f"the {k} code" in text.lower())


def script(system, user):
    time.sleep(random.uniform(0.0, 0.01))  # interleave the threads' calls
    question = field(user, "question")
    if "You judge" in system:
        passage = field(user, "document") or field(user, "strip")
        return 0.9 if f"The {key_of(question)} code" in passage else 0.1
    if "web search query" in system:
        return {"query": f"{key_of(question)} code"}
    context = field(user, "context")
    found = [code for k, code in CODES.items() if f"The {k} code is {code}" in context]
    # Echo the question's own key too: an answer built from another question's context shows up.
    return {"answer": f"{key_of(question)}={','.join(found) or 'none'}"}


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, embedder):
    client = open_client(Settings(chroma_path=tmp_path_factory.mktemp("chroma")))
    docs = [
        CorpusDoc(id=f"doc-{k}", title=f"{k.title()} sheet", text=f"The {k} code is {code}.")
        for k, code in CODES.items()
    ]
    ingest_documents(client, "codes__kb", docs, embedder, chunk_words=120, progress=False)
    return ChromaRetriever(client, "codes__kb", embedder)


@pytest.fixture()
def program(tmp_path, retriever):
    original = CRAG(retriever, ListWebSearch(), CRAGConfig(k=3, lower=0.2, upper=0.8))
    return save_program(original, tmp_path / "program.json", {"domain": "codes"})


def ask_all(crag: CRAG, rounds: int = 2) -> list[tuple[str, dspy.Prediction]]:
    questions = [f"What is the {k} code?" for k in CODES] * rounds
    random.Random(0).shuffle(questions)
    start = threading.Barrier(THREADS)

    def ask(question):
        start.wait(timeout=30)  # each wave of THREADS questions starts at the same moment
        return question, crag(question=question)

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(ask, questions))


def check_each_result_belongs_to_its_question(results, calls_per_question: int | None) -> None:
    assert len(results) == 2 * len(CODES)
    for question, pred in results:
        key = key_of(question)
        trace = pred.trace
        assert trace.question == question
        assert pred.answer == trace.answer == f"{key}={CODES[key]}"
        assert trace.action == "CORRECT" and trace.errors == [] and trace.fallbacks == []
        assert trace.documents[0].doc_id == f"doc-{key}"  # retrieved for this question, not a neighbour's
        assert [s.doc_id for s in trace.internal_strips if s.kept] == [f"doc-{key}"]
        assert f"The {key} code is {CODES[key]}" in trace.context and trace.context.count("\n") == 0
        if calls_per_question is not None:
            assert trace.total_usage.calls == calls_per_question  # usage counted per request, not shared


def test_threads_share_one_loaded_program_with_an_in_process_lm(program, retriever):
    lm = ScriptedLM(script)
    crag = load_program(program, retriever=retriever, web_search=ListWebSearch(), lm=lm)
    results = ask_all(crag)
    check_each_result_belongs_to_its_question(results, calls_per_question=3 + 1)  # 3 grades + 1 answer
    assert len(lm.calls) == 16 * 4


def test_threads_share_one_loaded_program_with_a_real_lm_client_over_http(program, retriever):
    with FakeOpenAI(script) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="k", cache=False, num_retries=0)
        crag = load_program(program, retriever=retriever, web_search=ListWebSearch(), lm=lm)
        results = ask_all(crag)
    check_each_result_belongs_to_its_question(results, calls_per_question=4)
    assert len(server.requests) == 16 * 4


def test_threads_share_dspys_response_cache_safely(program, retriever, tmp_path, monkeypatch):
    from dspy.clients.cache import Cache

    # A private memory + disk cache, shared by all threads exactly as DSPy's default one is.
    monkeypatch.setattr(dspy, "cache", Cache(True, True, str(tmp_path / "dspy-cache")))
    with FakeOpenAI(script) as server:
        lm = dspy.LM("openai/fake", api_base=server.api_base, api_key="k", cache=True, num_retries=0)
        crag = load_program(program, retriever=retriever, web_search=ListWebSearch(), lm=lm)
        check_each_result_belongs_to_its_question(ask_all(crag), calls_per_question=None)
        cold = len(server.requests)
        check_each_result_belongs_to_its_question(ask_all(crag), calls_per_question=None)
    assert 8 * 4 <= cold <= 16 * 4  # each distinct prompt reached the server at least once
    assert len(server.requests) == cold  # the warm run was served from the shared cache alone


@pytest.mark.slow
def test_concurrent_questions_on_the_real_embedded_engine(tmp_path_factory):
    """Three questions at once on one CRAG and the embedded llama.cpp server (one slot: requests queue)."""
    from crag_dspy.app import build_crag
    from crag_dspy.domain import load_domain
    from crag_dspy.lm import build_lm
    from crag_dspy.settings import DEFAULT_DATA_DIR
    from optimize.metrics import answer_matches

    settings = Settings(chroma_path=tmp_path_factory.mktemp("chroma"), web_search="offline")
    crag = build_crag(settings, lm=build_lm(settings, cache=False), progress=False)
    qa = {q.id: q for q in load_domain(DEFAULT_DATA_DIR / "default").qa}
    chosen = [qa["qa-kb-058"], qa["qa-web-009"], qa["qa-kb-001"]]
    expected_docs = {
        q.id: [p.doc_id for p in crag.retriever.retrieve(q.question, crag.config.k)] for q in chosen
    }

    with ThreadPoolExecutor(len(chosen)) as pool:
        preds = list(pool.map(lambda q: crag(question=q.question), chosen))

    for q, pred in zip(chosen, preds):
        trace = pred.trace
        assert trace.question == q.question and trace.errors == [], trace.model_dump_json(indent=1)
        assert [d.doc_id for d in trace.documents] == expected_docs[q.id]
        assert pred.answer and trace.lm_usage["grade"].calls == len(trace.documents)
    # The two questions the sequential end-to-end tests answer correctly are still answered correctly.
    assert answer_matches(preds[0].answer, chosen[0].answers), preds[0].answer
    assert answer_matches(preds[1].answer, chosen[1].answers), preds[1].answer
