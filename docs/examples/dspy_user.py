"""CRAG in a DSPy user's own code: their LM, their retriever, compiled from lists of Examples, saved,
then loaded in a fresh process that answers asynchronously.

    python docs/examples/dspy_user.py [program.json]

It runs offline in seconds: ``RuleLM`` stands in for your LM (``dspy.LM("openai/gpt-4o-mini")``) and
``WordRetriever`` for your store (any object with ``name`` and ``retrieve(query, k)``). Run as a test by
tests/test_dspy_user.py, which checks that the embedded model is never started.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import dspy

from crag_dspy import CRAG
from crag_dspy.protocols import Passage
from crag_dspy.web import OfflineWebSearch
from optimize import CRAGOptimizer

KB = {"zeta": "Z100", "theta": "T200", "kappa": "K300", "sigma": "S400", "delta": "D500", "lambda": "L600"}
WEB = {"omega": "W700", "gamma": "G800", "rho": "R900", "tau": "U010"}  # only "the web" knows these


class WordRetriever:
    """Your retriever: the texts sharing most words with the query (a crag_dspy.protocols.Retriever)."""

    name = "words"

    def __init__(self, texts: dict[str, str]):
        self.texts = texts

    def retrieve(self, query: str, k: int) -> list[Passage]:
        words = set(query.lower().split())
        ranked = sorted(self.texts.items(), key=lambda item: -len(words & set(item[1].lower().split())))
        return [
            Passage(id=doc_id, doc_id=doc_id, title=doc_id, text=text, rank=rank, similarity=1.0 - rank / 10)
            for rank, (doc_id, text) in enumerate(ranked[:k])
        ]


def sheets(codes: dict[str, str]) -> dict[str, str]:
    return {f"{key}-sheet": f"The {key} code is {code} since 2024." for key, code in codes.items()}


class RuleLM(dspy.BaseLM):
    """A deterministic stand-in for an LM: judges by the question's key word, rewrites to '<key> code',
    answers with the code its context states."""

    def __init__(self) -> None:
        super().__init__(model="rules/offline", cache=False)

    def forward(self, prompt=None, messages=None, **kwargs):
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        text = self.reply(system, messages[-1]["content"])
        logprobs = None
        if kwargs.get("logprobs") and text in ("yes", "no"):  # the judges read P(yes) when they can
            top = [{"token": "yes", "logprob": math.log(0.9 if text == "yes" else 0.1)}]
            top.append({"token": "no", "logprob": math.log(0.1 if text == "yes" else 0.9)})
            logprobs = {"content": [{"token": text, "logprob": math.log(0.9), "top_logprobs": top}]}
        message = SimpleNamespace(content=text, tool_calls=None)
        choice = SimpleNamespace(message=message, logprobs=logprobs, finish_reason="stop")
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        return SimpleNamespace(choices=[choice], usage=usage, model=self.model)

    @staticmethod
    def reply(system: str, user: str) -> str:
        key = re.search(r"the (\w+) code", user).group(1)
        if "You judge" in system:  # the grader and the strip filter: one word
            shown = user.split("<<<")[-1] if "<<<" in user else user.rsplit("ocument", 1)[-1]
            return "yes" if f"The {key} code" in shown else "no"
        if "web search query" in system:
            return f"[[ ## query ## ]]\n{key} code\n\n[[ ## completed ## ]]"
        found = re.search(rf"The {key} code is (\w+)", user)
        code = found.group(1) if found else "I don't know"
        return f"[[ ## answer ## ]]\n{code}\n\n[[ ## completed ## ]]"


def build() -> CRAG:
    return CRAG(WordRetriever(sheets(KB)), OfflineWebSearch(WordRetriever(sheets(WEB))))


def qa(split: int) -> list[dspy.Example]:
    """QA examples: question (the input), answers (gold aliases), id and kind."""
    return [
        dspy.Example(
            question=f"What is the {key} code?", answers=[code], id=key, kind="kb" if key in KB else "web"
        ).with_inputs("question")
        for i, (key, code) in enumerate([*KB.items(), *WEB.items()])
        if i % 3 == split
    ]


def relevance() -> list[dspy.Example]:
    """Labelled (question, document) pairs for the judges, each naming its split."""
    pairs = []
    for i, key in enumerate(KB):
        other = list(KB)[(i + 1) % len(KB)]
        for doc, relevant in ((key, True), (other, False)):
            pairs.append(
                dspy.Example(
                    question=f"What is the {key} code?",
                    document=f"{doc}-sheet\nThe {doc} code is {KB[doc]} since 2024.",
                    relevant=relevant,
                    split="train" if i < 4 else "val",
                ).with_inputs("question", "document")
            )
    return pairs


async def answer(path: Path, question: str) -> None:
    """In a fresh process: configure the LM, build CRAG over the same backends, load, answer async."""
    dspy.configure(lm=RuleLM())
    crag = build()
    crag.load(path)
    prediction = await crag.acall(question=question)
    print(json.dumps({"answer": prediction.answer, "action": prediction.action, "k": crag.config.k}))


def main(argv: list[str]) -> None:
    if argv[:1] == ["answer"]:
        return asyncio.run(answer(Path(argv[1]), argv[2]))
    path = Path(argv[0] if argv else "dspy_user_program.json")
    dspy.configure(lm=RuleLM())
    optimizer = CRAGOptimizer(stages=("grader", "strips"), grader="llm")
    compiled = optimizer.compile(build(), trainset=qa(0), valset=qa(1), relevance=relevance())
    print(
        f"thresholds: {optimizer.report['thresholds']['shipped']}, grader kept: "
        f"{optimizer.report['stages']['grader']['kept']}"
    )
    compiled.save(path)
    fresh = subprocess.run(
        [sys.executable, __file__, "answer", str(path), "What is the omega code?"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(fresh.stdout.strip())


if __name__ == "__main__":
    main(sys.argv[1:])
