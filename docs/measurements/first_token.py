"""Time to the first token from the embedded model's server, streamed, against the whole completion
unstreamed, on one answer-sized prompt (docs/performance.md, "Streaming").

    PYTHONPATH=. python docs/measurements/first_token.py [--rounds 2] [--max-tokens 48]

Starts the embedded model as the app does (``build_lm`` with the default settings), waits
for it to load, then asks the same question ``--rounds`` times each way, alternating: unstreamed (the
seconds until the whole completion is back) and streamed (the seconds until the first piece of text,
and until ``[DONE]``). Every request's system prompt begins with its own number, so that no request
reuses another's prompt in the engine's KV cache: each evaluates the whole prompt, as a new question's
answer does. Prints one JSON line per request and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

from crag_dspy.lm import build_lm
from crag_dspy.settings import Settings

CONTEXT = (
    "[internal] AquaProbe 220 Product Page: The AquaProbe 220 measures dissolved oxygen from 0 to 25 mg/L "
    "with a resolution of 0.01 mg/L. Its list price is 1,240 velds per sensor; volume discounts start at "
    "ten sensors. The sensor body is titanium and is rated IP68 to a depth of 60 metres.\n"
    "[internal] Calibration Policy: Field sensors are recalibrated every 90 days under IHSC WQ-17. A "
    "recalibration takes about 40 minutes and needs the CalKit 3 solution set.\n"
    "[web] Harbour Monitoring Network: Most harbour stations replace their membranes every six months."
)
QUESTION = "How deep can the AquaProbe 220 be submerged, and what does one sensor cost?"


def messages(number: int) -> list[dict[str, str]]:
    system = (
        f"Request {number}. Answer the question using only the context. Give the answer in one short "
        "sentence with its units."
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"context:\n{CONTEXT}\n\nquestion: {QUESTION}"},
    ]


def post(base: str, key: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(
        f"{base}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )


def whole(base: str, key: str, body: dict) -> dict:
    started = time.perf_counter()
    with urllib.request.urlopen(post(base, key, body), timeout=600) as response:
        answer = json.loads(response.read())
    return {
        "mode": "whole",
        "seconds": round(time.perf_counter() - started, 3),
        "completion_tokens": answer["usage"]["completion_tokens"],
        "text": answer["choices"][0]["message"]["content"],
    }


def streamed(base: str, key: str, body: dict) -> dict:
    started = time.perf_counter()
    first, pieces = None, []
    with urllib.request.urlopen(post(base, key, {**body, "stream": True}), timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            text = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if text:
                first = first if first is not None else time.perf_counter() - started
                pieces.append(text)
    return {
        "mode": "streamed",
        "first_token_s": round(first, 3) if first is not None else None,
        "seconds": round(time.perf_counter() - started, 3),
        "pieces": len(pieces),
        "text": "".join(pieces),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="requests each way (default 2)")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per answer (default 48)")
    args = parser.parse_args()
    lm = build_lm(Settings(lm="embedded"), cache=False, num_retries=0)  # starts the embedded server
    base, key, model = lm.kwargs["api_base"], lm.kwargs["api_key"], lm.model.removeprefix("openai/")
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": 0}
    whole(base, key, {**body, "messages": messages(0), "max_tokens": 1})  # waits for the model to load
    rows = []
    for number in range(1, 2 * args.rounds + 1):
        ask = streamed if number % 2 else whole
        row = {"model": model, **ask(base, key, {**body, "messages": messages(number)})}
        print(json.dumps(row, ensure_ascii=False), flush=True)
        rows.append(row)
    median = {
        "model": model,
        "first_token_s": round(
            statistics.median(r["first_token_s"] for r in rows if r["mode"] == "streamed"), 3
        ),
        "streamed_s": round(statistics.median(r["seconds"] for r in rows if r["mode"] == "streamed"), 3),
        "whole_s": round(statistics.median(r["seconds"] for r in rows if r["mode"] == "whole"), 3),
    }
    print(json.dumps({"median": median}))


if __name__ == "__main__":
    main()
