"""Prompt-evaluation speed of the embedded llama.cpp engine under different settings, one run.

Starts the embedded model once per setting (prompt cache off) and feeds it the same prompts: eight of
~110 tokens (a grading call's new tokens) and one of ~700 (a plain-RAG answer's); prints prompt tokens
per second for each. Used to check whether engine settings could cut CRAG's grading time.

    python benchmarks/engine_settings.py [--model qwen2.5-coder-1.5b-instruct]
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import httpx

from crag_dspy.lm.weights import EMBEDDED_MODELS, ensure_weights
from crag_dspy.settings import DEFAULT_DATA_DIR, default_cache_dir

SETTINGS: list[dict] = [
    {},
    {"flash_attn_type": 0},
    {"flash_attn_type": 1},
    {"cpuparams.poll": 0},
    {"n_ubatch": 256},
    {"cpuparams.n_threads": 1},  # generation threads only; prompt evaluation keeps 2
]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_engine(model_path: Path, setting: dict, *, n_ctx: int = 8192) -> tuple[object, int]:
    """A 2-thread llama.cpp server for ``model_path`` with ``setting`` applied (dotted CommonParams
    names); returns the server (keep it referenced while measuring) and its loopback port."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_ctx = n_ctx
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 2
    params.verbosity = -1
    params.port = _port()
    for dotted, value in setting.items():
        target = params
        *path, name = dotted.split(".")
        for part in path:
            target = getattr(target, part)
        setattr(target, name, value)
    return xllamacpp.Server(params), params.port


def measure(model_path: Path, text: str, setting: dict) -> dict:
    server, port = start_engine(model_path, {"cache_prompt": False, **setting})  # noqa: RUF059 - kept alive
    client = httpx.Client(timeout=300)

    def call(start: int, chars: int) -> int:
        body = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "You judge search results."},
                {"role": "user", "content": f"{start} {text[start * 50 : start * 50 + chars]}"},
            ],
            "max_tokens": 1,
            "temperature": 0,
            "cache_prompt": False,
        }
        return client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body).json()["usage"][
            "prompt_tokens"
        ]

    call(99, 400)  # warm-up
    started, tokens = time.perf_counter(), 0
    for i in range(8):
        tokens += call(i, 450)
    short = tokens / (time.perf_counter() - started)
    started = time.perf_counter()
    long_tokens = call(50, 2600)
    return {
        "setting": setting,
        "short_tok_s": short,
        "long_tok_s": long_tokens / (time.perf_counter() - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", choices=sorted(EMBEDDED_MODELS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    path = ensure_weights(EMBEDDED_MODELS[args.model], default_cache_dir())
    text = (DEFAULT_DATA_DIR / "default" / "corpus.jsonl").read_text()[:6000]
    rows = []
    for setting in SETTINGS:
        row = measure(path, text, setting)
        rows.append(row)
        print(
            f"{json.dumps(setting):32} short prompts {row['short_tok_s']:5.1f} tok/s, long {row['long_tok_s']:5.1f} tok/s"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
