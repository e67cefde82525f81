"""Prompt-evaluation and generation speed of two builds of the llama.cpp engine, one run, as a ratio.

Each build runs in its own subprocess (one process can load only one xllamacpp): the installed one,
and one installed into a separate folder, e.g. a build for this CPU:

    CMAKE_ARGS="-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF" \\
        pip wheel --no-deps --no-binary xllamacpp "xllamacpp==<installed version>" -w wheels/
    pip install --no-deps --target /tmp/native-engine wheels/xllamacpp-*.whl
    python benchmarks/engine_build.py --other /tmp/native-engine [--out benchmarks/results/engine_build.json]

Both builds get the same prompts (benchmarks/engine_settings.py: eight of ~110 new tokens, a grading
call's size, and one of ~700, a plain-RAG answer's) with the prompt cache off, and one 48-token
generation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure_here(model: str) -> dict:
    """This process's engine: its build and its speeds."""
    import httpx
    from engine_settings import measure, start_engine

    from crag_dspy.lm.engine import describe_engine
    from crag_dspy.lm.weights import EMBEDDED_MODELS, ensure_weights
    from crag_dspy.settings import DEFAULT_DATA_DIR, default_cache_dir

    path = ensure_weights(EMBEDDED_MODELS[model], default_cache_dir())
    text = (DEFAULT_DATA_DIR / "default" / "corpus.jsonl").read_text()[:6000]
    row = measure(path, text, {})

    # Its own server, with the prompt cache on: the timed call then evaluates no prompt, only generates.
    server, port = start_engine(path, {}, n_ctx=2048)  # noqa: RUF059 - kept alive while we measure
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=300) as client:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        client.post(url, json={**body, "max_tokens": 1})  # warm-up: the prompt is cached from here on
        started = time.perf_counter()
        generated = client.post(url, json=body).json()["usage"]["completion_tokens"]
    build = describe_engine()
    return {
        "features": list(build.features) if build else [],
        "short_prompt_tok_s": row["short_tok_s"],
        "long_prompt_tok_s": row["long_tok_s"],
        "generation_tok_s": generated / (time.perf_counter() - started),
    }


def measure_in_subprocess(model: str, site: Path | None) -> dict:
    env = dict(os.environ)
    if site is not None:  # ahead of site-packages: this folder's xllamacpp is the one imported
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(
        [sys.executable, __file__, "--model", model, "--measure-here"],
        env=env,
        cwd=HERE,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument(
        "--other", type=Path, help="folder holding the other xllamacpp build (pip install --target)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--measure-here", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_here:
        print(json.dumps(measure_here(args.model)))
        return
    if args.other is None or not (args.other / "xllamacpp").is_dir():
        parser.error(
            "--other must be a folder with an xllamacpp package in it (pip install --target FOLDER ...)"
        )
    rows = {
        "installed": measure_in_subprocess(args.model, None),
        "other": measure_in_subprocess(args.model, args.other),
    }
    for name, row in rows.items():
        print(
            f"{name:9} short prompts {row['short_prompt_tok_s']:5.1f} tok/s, long {row['long_prompt_tok_s']:5.1f} tok/s, "
            f"generation {row['generation_tok_s']:5.1f} tok/s  [{', '.join(row['features'])}]"
        )
    ratios = {
        key: rows["other"][key] / rows["installed"][key]
        for key in ("short_prompt_tok_s", "long_prompt_tok_s", "generation_tok_s")
    }
    print("other / installed: " + ", ".join(f"{key} {value:.2f}x" for key, value in ratios.items()))
    if args.out:
        args.out.write_text(json.dumps({"builds": rows, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
