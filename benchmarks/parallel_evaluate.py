"""``python -m optimize.evaluate --num-threads N`` against a hosted LM: wall time with 1 thread and with N,
and a check that both give the same table.

    python benchmarks/parallel_evaluate.py [--latency 0.2] [--limit 100] [--threads 8] [--split test]
        [--domain-dir DIR] [--chroma-path DIR] [--grade-sentences N]

The "hosted LM" is the project's own OpenAI-compatible server (``crag_dspy.lm.openai_server``, on
127.0.0.1, a free port, concurrent requests on threads) over a fake engine that sleeps ``--latency``
seconds per request, as a hosted API's round trip does. The evaluation runs the project's real
code path: ``Settings(lm="openai/...", lm_api_base=<server>)``, ``build_lm(settings, cache=False)`` (what
``--no-cache`` does: every request reaches the server), LiteLLM over HTTP. Its replies are deterministic
functions of the prompt, shaped as the project's adapters parse them (a yes/no judgement with OpenAI
logprobs, a bare query, a bare answer) and chosen to spread questions over all three actions; they
measure the harness's concurrency, never quality.

A warm-up evaluation of one question without latency first loads the embedding model and indexes the
domain, so the two timed runs differ only in their number of threads.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from crag_dspy.lm import build_lm
from crag_dspy.lm.ik_engine import Completion, TokenLogprob
from crag_dspy.lm.openai_server import OpenAIServer
from crag_dspy.settings import Settings
from optimize.evaluate import evaluate_domain

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
STOP = {"a", "an", "and", "did", "does", "for", "in", "is", "of", "on", "the", "to", "was", "what", "who"}


def _words(text: str) -> list[str]:
    return [w for w in (m.group(0).lower() for m in WORD.finditer(text)) if w not in STOP]


def _logprobs(p_yes: float) -> tuple[TokenLogprob, ...]:
    """A first token yes or no, with P(yes) = ``p_yes`` among its top tokens."""
    top = (("yes", math.log(p_yes)), ("no", math.log(1 - p_yes)))
    token, logprob = top[0] if p_yes >= 0.5 else top[1]
    return (TokenLogprob(token, logprob, top),)


def fake_reply(system: str, user: str, want_logprobs: bool) -> tuple[str, tuple[TokenLogprob, ...] | None]:
    """A deterministic reply to one of CRAG's prompts (see crag_dspy/adapters.py for their shape)."""
    question = (re.search(r"^question: (.*)$", user, re.MULTILINE) or re.search(r"(.*)", user)).group(1)
    fenced = "\n".join(re.findall(r"<<<\n(.*?)\n>>>", user, re.DOTALL))
    asked = set(_words(question))
    if "yes or no" in system:  # LabelAdapter: the grader and the strip filter
        shared = len(asked & set(_words(fenced))) / max(1, len(asked))
        p_yes = min(max(0.05 + 0.9 * shared, 0.02), 0.98)
        return ("yes" if p_yes >= 0.5 else "no"), (_logprobs(p_yes) if want_logprobs else None)
    if "Reply with the query only" in system:  # TextAdapter: the query rewriter
        return " ".join(_words(question)[:6]) or question, None
    if "Reply with the answer only" in system:  # TextAdapter: the answerers
        lines = [re.sub(r"^\[\w+\]\s*(\([^)]*\)\s*)?", "", line) for line in fenced.splitlines()]
        best = max(lines, key=lambda line: len(asked & set(_words(line))), default="")
        if not best or not asked & set(_words(best)):
            return "I don't know", None
        return " ".join(best.split()[:6]), None
    return "I don't know", None


class FakeHostedEngine:
    """A :class:`~crag_dspy.lm.openai_server.ChatEngine` that sleeps ``latency`` seconds per request, as a
    hosted API's round trip does, then answers with :func:`fake_reply`. Served by the project's own
    OpenAI-compatible server, which serves concurrent requests on threads."""

    def __init__(self, latency: float):
        self.latency = latency
        self.requests = 0
        self._lock = threading.Lock()

    def chat(
        self, messages: list[dict], *, max_tokens: int, top_logprobs: int | None = None, **_
    ) -> Completion:
        with self._lock:
            self.requests += 1
        time.sleep(self.latency)
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = messages[-1]["content"]
        text, logprobs = fake_reply(system, user, top_logprobs is not None)
        prompt_tokens = len(system.split()) + len(user.split())
        return Completion(text, "stop", prompt_tokens, 0, len(text.split()), logprobs)


def _without_seconds(value):
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items() if "seconds" not in k and k != "num_threads"}
    if isinstance(value, list):
        return [_without_seconds(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per LM request (default 0.2)")
    parser.add_argument(
        "--limit", type=int, default=100, help="questions (default 100, or all the split has)"
    )
    parser.add_argument("--threads", type=int, default=8, help="threads of the parallel run (default 8)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--domain-dir", type=Path, help="domain folder (default: the bundled default domain)")
    parser.add_argument("--chroma-path", type=Path, help="Chroma folder (default: a temporary one)")
    parser.add_argument(
        "--grade-sentences",
        type=int,
        help="sentences the grader reads per passage (default: the project's; 0 = whole passages, which "
        "skips embedding each passage's sentences, the evaluation's main CPU cost)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")

    engine = FakeHostedEngine(latency=0.0)
    server = OpenAIServer(engine, "fake-hosted")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            lm="openai/fake-hosted",
            lm_api_base=f"http://127.0.0.1:{server.port}/v1",
            domain_dir=args.domain_dir,
            chroma_path=args.chroma_path or Path(tmp) / "chroma",
            web_search="offline",
            **({} if args.grade_sentences is None else {"grade_sentences": args.grade_sentences}),
        )
        out = Path(tmp) / "eval"
        # Warm-up: loads the embedder and indexes the domain (no latency); not timed.
        evaluate_domain(
            settings,
            lm=build_lm(settings, cache=False),
            split=args.split,
            limit=1,
            out=out / "warm",
            progress=False,
        )
        engine.latency = args.latency
        reports, seconds, requests = {}, {}, {}
        for threads in (1, args.threads):
            before = engine.requests
            started = time.perf_counter()
            reports[threads] = evaluate_domain(
                settings,
                lm=build_lm(settings, cache=False),
                split=args.split,
                limit=args.limit,
                out=out / f"t{threads}",
                num_threads=threads,
            )
            seconds[threads] = time.perf_counter() - started
            requests[threads] = engine.requests - before
            print(
                f"{threads} thread(s): {seconds[threads]:.1f} s, {requests[threads]} LM requests "
                f"({reports[threads]['questions']} questions, {args.latency:.3f} s latency)",
                flush=True,
            )
    server.close()
    one, many = reports[1], reports[args.threads]
    same = all(
        _without_seconds(one[part]) == _without_seconds(many[part])
        for part in ("variants", "grader", "cost", "rows")
    )
    accuracy = {v["name"]: f"{v['accuracy']:.2f}" for v in one["variants"]}
    print(f"table identical (wall times aside): {same}")
    print(f"speed-up with {args.threads} threads: {seconds[1] / seconds[args.threads]:.2f}x")
    print(f"accuracies (fake LM, not a quality claim): {accuracy}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
