"""What every benchmark script shares: its flags, its settings and LM, its programs, and its one result file.

A script builds its parser with :func:`parser` (the CLI's domain, storage and LM flags, ``--no-cache``,
``--program`` and ``--out``) and parses with :func:`parse` (the CLIs' logging), gets its settings with :func:`settings_for` (a program's own domain
unless ``--domain``/``--domain-dir`` name one) and writes its numbers with :func:`write_result`: one
JSON file ``{"benchmark", "metadata", "results"}`` whose metadata say on what machine, when, by which
command line, at which commit and with which LM they were measured. Scripts import only public names
of ``crag_dspy`` and ``optimize``, and no script imports another one but this.

    python benchmarks/<script>.py --help
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy

from crag_dspy import CRAG, Domain, Settings, load_domain
from crag_dspy.app import assemble, program_settings, resolve_program
from crag_dspy.cli import add_lm_arguments, add_storage_arguments, settings_from_args
from crag_dspy.config import CRAGConfig
from crag_dspy.embeddings import Embedder
from crag_dspy.lm import Completion, TokenLogprob, build_lm
from crag_dspy.program import ProgramError, apply_program, check_domain, read_program
from crag_dspy.redaction import configure_logging
from optimize.metrics import wilson_interval
from optimize.report import OutputPathError, check_writable

BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"
ROOT = BENCHMARKS.parent


def parser(
    doc: str,
    *,
    lm: bool = True,
    cache_flag: bool = True,
    program: bool = False,
    store: bool = True,
    subparsers: Any = None,
    name: str = "",
) -> argparse.ArgumentParser:
    """An argument parser whose description is ``doc`` (the script's docstring), with the CLI's domain
    flags and, with ``store``, its Chroma flags; the CLI's LM flags (``lm``) and ``--no-cache``
    (``cache_flag``); ``--program`` (``program``) and ``--out``. With ``subparsers`` (what
    ``add_subparsers`` returned) it is the subcommand ``name`` of a script with several."""
    kwargs = {"description": doc, "formatter_class": argparse.RawDescriptionHelpFormatter}
    p = subparsers.add_parser(name, **kwargs) if subparsers is not None else argparse.ArgumentParser(**kwargs)
    if store:
        add_storage_arguments(p)
        p.add_argument(
            "--web-search",
            choices=["auto", "tavily", "offline", "none"],
            help="web backend (auto: Tavily when TAVILY_API_KEY is set, else the domain's offline web)",
        )
    else:
        g = p.add_argument_group("domain")
        g.add_argument("--domain", help="bundled domain name under data/ (default: default)")
        g.add_argument("--domain-dir", type=Path, help="any directory in the domain format")
        p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    if lm:
        add_lm_arguments(p)
    if lm and cache_flag:
        p.add_argument(
            "--no-cache",
            action="store_true",
            help="DSPy's cache off: every LM call is made (and timed) for real",
        )
    if program:
        p.add_argument(
            "--program",
            type=Path,
            help="a compiled program JSON, or a bundled domain's name for the program it ships "
            "(default: the uncompiled default program)",
        )
    p.add_argument(
        "--out", type=Path, help="the result file (default: benchmarks/results/<script>[_<domain>].json)"
    )
    return p


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``p``'s arguments, with the CLIs' logging (INFO under ``--verbose``, API keys redacted).

    ``--program`` takes a bundled domain's name as the CLI does (``--program default``: the program
    that domain ships); a program file that cannot be used, or an ``--out`` where no result file can
    be written, is refused here as a usage error naming the file, before any model or store starts."""
    args = p.parse_args(argv)
    configure_logging(getattr(args, "verbose", False))
    if isinstance(getattr(args, "program", None), Path):
        try:
            args.program = resolve_program(args.program)
            read_program(args.program)
        except ProgramError as exc:
            p.error(f"--program: {exc}")
    if getattr(args, "out", None) is not None:
        try:
            check_writable(args.out, "the results")  # before a run of many minutes, not after it
        except OutputPathError as exc:
            p.error(f"--out: {exc}")
    return args


def read_document(path: Path | None) -> dict[str, Any] | None:
    """The program JSON at ``path`` as :func:`~crag_dspy.program.read_program` validates it; None without one."""
    return None if path is None else read_program(path)


def settings_for(args: argparse.Namespace, document: dict[str, Any] | None = None, **extra: Any) -> Settings:
    """Settings from the environment and the flags given; without ``--domain``/``--domain-dir``, the
    bundled domain a program was compiled for (a domain elsewhere is named with --domain-dir, never
    taken from the program file)."""
    settings = settings_from_args(args, **extra)
    if document is None or getattr(args, "domain", None) or getattr(args, "domain_dir", None):
        return settings
    return program_settings(document, settings, getattr(args, "program", None) or "program")


def domain_of(settings: Settings) -> Domain:
    return load_domain(settings.resolved_domain_dir)


def lm_for(
    settings: Settings,
    args: argparse.Namespace,
    lm: dspy.BaseLM | None = None,
    *,
    cache: bool | None = None,
    **overrides: Any,
) -> dspy.BaseLM:
    """``lm`` when a caller (a test) passes one, else the settings' LM with DSPy's cache ``cache`` (by
    default on, off under ``--no-cache``)."""
    if lm is not None:
        return lm
    if cache is None:
        cache = not getattr(args, "no_cache", False)
    return build_lm(settings, cache=cache, **overrides)


def open_crag(
    settings: Settings, lm: dspy.BaseLM, document: dict[str, Any] | None, program: Path | None
) -> tuple[CRAG, Domain]:
    """The program (or, without ``document``, the uncompiled default) on the settings' domain with real
    backends: Chroma (the domain ingested on first use), the bundled embeddings, the web search."""
    crag, backends = assemble(settings, lm, progress=False)
    if document is not None:
        check_domain(document, backends.domain.name, program)
        apply_program(crag, document, program.parent if program else None)
    return crag, backends.domain


class NoBackend:
    """A retriever and web search for measuring judges alone: any call is a bug in the benchmark."""

    def retrieve(self, query: str, k: int):
        raise RuntimeError("this benchmark measures judges alone: it does not retrieve")

    def search(self, query: str, max_results: int):
        raise RuntimeError("this benchmark measures judges alone: it does not search the web")


def judges_only(
    lm: dspy.BaseLM,
    config: CRAGConfig | None = None,
    document: dict[str, Any] | None = None,
    program_dir: Path | None = None,
    embedder: Embedder | None = None,
) -> CRAG:
    """A CRAG without backends (for measuring its judges) with ``config`` and, with a program
    ``document``, that program's config and state; ``embedder`` serves the judges' views."""
    crag = CRAG(NoBackend(), NoBackend(), config, lm=lm, embedder=embedder)
    return crag if document is None else apply_program(crag, document, program_dir)


def rate(successes: int, n: int) -> dict[str, Any]:
    """A proportion with its Wilson 95% interval."""
    low, high = wilson_interval(successes, n)
    return {"k": successes, "n": n, "rate": successes / n if n else None, "interval": [low, high]}


def fmt_rate(r: dict[str, Any]) -> str:
    """``58.3% [38.8, 75.5]`` (k of n)."""
    if r["rate"] is None:
        return "-"
    low, high = r["interval"]
    return f"{r['rate']:.1%} [{low:.1%}, {high:.1%}] ({r['k']} of {r['n']})"


def _git() -> dict[str, Any] | None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def metadata(script: str, argv: Sequence[str], lm: dspy.BaseLM | str | None = None) -> dict[str, Any]:
    """Where, when and how a result was measured: machine, date, command line, commit, and the LM as DSPy
    addresses it (for the embedded model: its name and engine) with whether DSPy's cache was on."""
    model = lm.model if isinstance(lm, dspy.BaseLM) else lm
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", f"benchmarks/{script}.py", *argv]),
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        },
        "git": _git(),
        "lm": model,
        "dspy_cache": bool(lm.cache) if isinstance(lm, dspy.BaseLM) else None,
    }


def result_path(args: argparse.Namespace, script: str, domain: str | None = None) -> Path:
    """``--out``, else ``benchmarks/results/<script>[_<domain>].json``."""
    if args.out is not None:
        return args.out
    return RESULTS / (f"{script}_{domain}.json" if domain else f"{script}.json")


def write_result(
    path: Path,
    script: str,
    argv: Sequence[str] | None,
    results: dict[str, Any],
    *,
    lm: dspy.BaseLM | str | None = None,
) -> Path:
    """Write the one result file of a run: ``{"benchmark", "metadata", "results"}``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    payload = {"benchmark": script, "metadata": metadata(script, argv, lm), "results": results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


# --- a simulated hosted LM (crag_vs_rag.py and service.py, --hosted-latency) ------------------------------

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
STOP = {"a", "an", "and", "did", "does", "for", "in", "is", "of", "on", "the", "to", "was", "what", "who"}


def _words(text: str) -> list[str]:
    return [w for w in (m.group(0).lower() for m in WORD.finditer(text)) if w not in STOP]


def fake_reply(system: str, user: str, want_logprobs: bool) -> tuple[str, tuple[TokenLogprob, ...] | None]:
    """A deterministic reply to one of CRAG's prompts: a yes/no judgement (P(yes) grows with the share of
    the question's words the judged text holds), a bare query, or a bare answer taken from the context line
    sharing most of the question's words. Spreads questions over all three actions."""
    question = (re.search(r"^question: (.*)$", user, re.MULTILINE) or re.search(r"(.*)", user)).group(1)
    fenced = "\n".join(re.findall(r"<<<\n(.*?)\n>>>", user, re.DOTALL))
    asked = set(_words(question))
    if "yes or no" in system:  # the grader and the strip filter
        shared = len(asked & set(_words(fenced))) / max(1, len(asked))
        p_yes = min(max(0.05 + 0.9 * shared, 0.02), 0.98)
        top = (("yes", math.log(p_yes)), ("no", math.log(1 - p_yes)))
        first = top[0] if p_yes >= 0.5 else top[1]
        return first[0], ((TokenLogprob(*first, top),) if want_logprobs else None)
    if "Reply with the query only" in system:  # the query rewriter
        return " ".join(_words(question)[:6]) or question, None
    if "Reply with the answer only" in system:  # the answerers
        lines = [re.sub(r"^\[\w+\]\s*(\([^)]*\)\s*)?", "", line) for line in fenced.splitlines()]
        best = max(lines, key=lambda line: len(asked & set(_words(line))), default="")
        if not best or not asked & set(_words(best)):
            return "I don't know", None
        return " ".join(best.split()[:6]), None
    return "I don't know", None


class FakeHostedEngine:
    """A :class:`~crag_dspy.lm.ChatEngine` that waits ``latency`` seconds per request, then
    answers with :func:`fake_reply`; the project's server serves concurrent requests on threads."""

    def __init__(self, latency: float):
        self.latency, self.requests, self._lock = latency, 0, threading.Lock()

    def chat(
        self, messages: list[dict], *, max_tokens: int, top_logprobs: int | None = None, **_: Any
    ) -> Completion:
        with self._lock:
            self.requests += 1
        time.sleep(self.latency)
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        user = messages[-1]["content"]
        text, logprobs = fake_reply(system, user, top_logprobs is not None)
        return Completion(
            text, "stop", len(system.split()) + len(user.split()), 0, len(text.split()), logprobs
        )
