"""The first call's cost with your own retriever and LM: what a process spends on its first question
when nothing of crag-dspy's own stack (store, embedded LM) is used (docs/performance.md, "First call").

    PYTHONPATH=. python docs/measurements/first_call.py   # one fresh process per case, seconds printed

Each case runs in a fresh interpreter: import, build ``CRAG`` over an in-memory retriever and a scripted
LM that answers at once, then time the first and the second question. The LM costs nothing, so what is
left is crag-dspy's own first-call work (imports, models loaded); ``short-hosted``'s LM takes 1 s a
call, as a hosted one does (4 calls: 3 grades, in parallel, a strip, the answer), which a model load
can overlap. ``short`` passages are one sentence
each (the judges' sentence view has nothing to choose, so no embedding is needed for it); ``long``
passages are several sentences (the view embeds them with the bundled MiniLM, a load that answer needs).
It prints whether sentence-transformers was imported by the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

CASES = ("short", "short-hosted", "long")
HOSTED_LATENCY_S = 1.0
"""The ``-hosted`` case's LM takes this long per call, as a hosted LM or a local server does."""


def run_case(case: str) -> dict:
    """One case in this process: the seconds of import, build, first and second question."""
    started = time.perf_counter()
    from types import SimpleNamespace

    import dspy

    from crag_dspy import CRAG, Passage
    from crag_dspy.web import NoWebSearch

    imported = time.perf_counter()
    text = "The night ferry to Velm Island leaves at 23:40 from pier four."
    latency = HOSTED_LATENCY_S if case.endswith("-hosted") else 0.0
    if case == "long":
        text += " Tickets cost 310 velds. The pier opens at 07:00. Lost property is kept for ninety days."

    class Retriever:
        name = "memory"

        def retrieve(self, query: str, k: int) -> list[Passage]:
            return [Passage(f"p{i}", f"d{i}", f"Ferries {i}", text, i, 0.9) for i in range(min(k, 3))]

    class InstantLM(dspy.BaseLM):
        """Judges say yes, the answerer answers from the context: an LM that costs nothing."""

        def __init__(self) -> None:
            super().__init__(model="scripted/instant", cache=False)

        def forward(self, prompt=None, messages=None, **kwargs):
            time.sleep(latency)
            system = next((m["content"] for m in messages if m["role"] == "system"), "")
            reply = "yes" if "yes or no" in system else "23:40 from pier four"
            choice = SimpleNamespace(
                message=SimpleNamespace(content=reply, tool_calls=None), logprobs=None, finish_reason="stop"
            )
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            return SimpleNamespace(choices=[choice], usage=usage, model=self.model)

    crag = CRAG(Retriever(), NoWebSearch(), lm=InstantLM())
    built = time.perf_counter()
    events: list[float] = []  # when each stage event arrived (issue 61's "first stage event" target)
    first = crag(
        question="When does the night ferry to Velm Island leave?",
        on_event=lambda event: events.append(time.perf_counter()),
    )
    answered = time.perf_counter()
    crag(question="When does the night ferry to Velm Island leave on Sundays?")
    second = time.perf_counter()
    return {
        "case": case,
        "answer": first.answer,
        "import_s": round(imported - started, 2),
        "build_s": round(built - imported, 2),
        "first_event_s": round(events[0] - built, 3) if events else None,
        "first_call_s": round(answered - built, 2),
        "second_call_s": round(second - answered, 2),
        "sentence_transformers_imported": "sentence_transformers" in sys.modules,
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["case"]:
        print(json.dumps(run_case(argv[1])))
        return 0
    for case in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "case", case], capture_output=True, text=True, check=True
        )
        print(out.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
