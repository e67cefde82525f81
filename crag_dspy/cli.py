"""``crag-dspy ingest | ask | engine``, and the flags every command shares (domain, store, LM, program).

The ``crag-dspy`` command itself is :mod:`crag_dspy.console`, which also runs compile, evaluate and serve.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .bundled_paths import show_bundled_paths
from .config import describe_validation_error
from .faults import CRAGRunError
from .flag_policy import OnFlag, judge_flag, without_answer
from .grounding import warning_line
from .lm import EMBEDDED_MODELS, ENGINE_CHOICES, WeightsError
from .redaction import configure_logging, redact
from .terminal import json_for_terminal, one_line, terminal_safe

__all__ = [
    "AskProgress",
    "add_lm_arguments",
    "add_program_arguments",
    "add_storage_arguments",
    "build_parser",
    "command_prog",
    "error_line",
    "final_answer_line",
    "format_trace",
    "interruptible",
    "main",
    "program_from_args",
    "settings_from_args",
    "user_error_types",
    "via_console",
]

_VIA_CONSOLE = contextvars.ContextVar("crag_dspy_via_console", default=False)


def command_prog(command: str, module: str) -> str:
    """The program name a command's usage and error lines show: ``crag-dspy <command>`` when it runs
    through the ``crag-dspy`` command (:func:`via_console`), ``python -m <module>`` when run as the
    module: either way the line shows what the user typed."""
    return f"crag-dspy {command}" if _VIA_CONSOLE.get() else f"python -m {module}"


@contextlib.contextmanager
def via_console() -> Iterator[None]:
    """Within it, :func:`command_prog` names the ``crag-dspy`` command (:mod:`crag_dspy.console` runs
    the commands it hands over in it)."""
    token = _VIA_CONSOLE.set(True)
    try:
        yield
    finally:
        _VIA_CONSOLE.reset(token)


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """Domain and Chroma flags, shared by every command that opens a domain."""
    g = parser.add_argument_group("domain and storage (defaults from CRAG_* environment variables)")
    g.add_argument(
        "--domain", help="name of a bundled domain under data/ (default: default); folders: --domain-dir"
    )
    g.add_argument("--domain-dir", type=Path, help="any directory in the domain format")
    g.add_argument(
        "--chroma-path", type=Path, help="embedded Chroma folder (default: ~/.cache/crag-dspy/chroma)"
    )
    g.add_argument("--chroma-host", help="Chroma server host: use a server instead of the embedded store")
    g.add_argument("--chroma-port", type=int, help="Chroma server port (default: 8000)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """LM flags, shared by every command that calls a model."""
    g = parser.add_argument_group("language model")
    g.add_argument("--lm", help="'embedded' (default) or a LiteLLM model string, e.g. openai/gpt-4o-mini")
    g.add_argument(
        "--lm-api-base", help="base URL of an OpenAI-compatible server (vLLM, llama.cpp, LM Studio)"
    )
    g.add_argument(
        "--embedded-model",
        choices=sorted(EMBEDDED_MODELS),
        help="which embedded model to run (the 0.5B is faster and weaker)",
    )
    g.add_argument(
        "--embedded-engine",
        choices=ENGINE_CHOICES,
        help="llama.cpp engine of the embedded model (auto: ik_llama when installed, ~1.5x faster on CPUs)",
    )


def add_web_search_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--web-search``, shared by every command that may search the web (ask, serve, compile, evaluate,
    synthesize): the same choices and default everywhere."""
    parser.add_argument(
        "--web-search",
        choices=["auto", "tavily", "offline", "none"],
        help="web backend (auto: Tavily when TAVILY_API_KEY is set, else the offline stand-in; none: off)",
    )


def add_flag_policy_argument(parser: argparse.ArgumentParser) -> None:
    """``--on-flag warn|withhold``: what a flagged answer becomes (:mod:`crag_dspy.flag_policy`)."""
    parser.add_argument(
        "--on-flag",
        choices=("warn", "withhold"),
        help="an answer flagged because its sources disagree or instruct the model: 'warn' (default) shows "
        "it with a warning; 'withhold' answers 'The sources disagree or instruct; not answered' and cites "
        "both sides (CRAG_ON_FLAG)",
    )


def add_program_arguments(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """Which program to run and its run-time knobs, shared by ``ask`` and ``crag_dspy.serve``; with
    ``several`` (serve), ``--program`` may be repeated or name a folder, and ``args.program`` is a list."""
    g = parser.add_argument_group("program")
    what = (
        "compiled program JSON (crag-dspy compile, or crag.save), or a bundled domain's name for the program "
        "it ships (--program default)"
    )
    if several:
        g.add_argument(
            "--program",
            type=Path,
            action="append",
            help=f"{what}, or a folder of program JSONs; repeat it to serve several domains, one program "
            "each (a request chooses one by its 'domain', the first given is the default); without it, "
            "the uncompiled default program",
        )
    else:
        g.add_argument("--program", type=Path, help=f"{what}; without it, the uncompiled default program")
    add_web_search_argument(g)
    g.add_argument(
        "--force",
        action="store_true",
        help="use a program compiled on other data than the domain holds now (its dataset hashes differ)",
    )
    g.add_argument("--k", type=int, help="documents retrieved per question")
    g.add_argument("--lower", type=float, help="lower threshold (overrides the program's)")
    g.add_argument("--upper", type=float, help="upper threshold (overrides the program's)")
    g.add_argument(
        "--internal-retries",
        type=int,
        metavar="N",
        help="on AMBIGUOUS or INCORRECT, rewrite the query and search the internal store again, at most N "
        "rounds, before the web (default 0: off; overrides the program's)",
    )


def build_parser(delegated: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``ingest``, ``ask`` and ``engine``; ``delegated`` (name -> one-line help) lists the
    subcommands :mod:`crag_dspy.console` hands to other modules' parsers, for the overview only."""
    parser = argparse.ArgumentParser(prog="crag-dspy", description="Corrective RAG as a DSPy program.")
    sub = parser.add_subparsers(dest="command", required=True)

    ingest = sub.add_parser(
        "ingest",
        help="chunk, embed and upsert a domain into Chroma (idempotent)",
        description="Chunk, embed and upsert a domain's corpus (corpus.jsonl, or a corpus/ folder of PDF, "
        "HTML, DOCX, Markdown and text files) and web.jsonl into Chroma. Reruns add only new chunks and "
        "remove stale ones; an unreadable document is skipped and named at the end.",
    )
    ingest.add_argument(
        "domain_path",
        type=Path,
        nargs="?",
        metavar="DOMAIN_DIR",
        help="domain directory (corpus.jsonl or corpus/, web.jsonl, domain.toml), the same as --domain-dir, "
        "which every command takes; default: the domain --domain or --domain-dir names (the bundled "
        "default domain)",
    )
    add_storage_arguments(ingest)

    ask = sub.add_parser(
        "ask",
        help="answer a question with CRAG and show what it did",
        description="Answer a question with CRAG; prints the answer and a compact trace.",
    )
    ask.add_argument("question", help="the question to answer")
    add_storage_arguments(ask)
    add_lm_arguments(ask)
    add_program_arguments(ask)
    add_flag_policy_argument(ask)
    ask.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help='the conversation so far, to ask a follow-up: a JSON list of {"question": ..., "answer": ...} '
        "turns, oldest first, or one turn a line (JSON Lines); at most CRAG_CONFIG__MAX_HISTORY_TURNS "
        "(default 8). The follow-up is rewritten into a standalone question first",
    )
    ask.add_argument("--json", action="store_true", help="print the full trace as JSON")
    ask.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not print the stages on stderr as they happen, nor (when stderr is a terminal) the answer's "
        "draft as the LM writes it; stdout holds the answer either way",
    )

    engine = sub.add_parser(
        "engine",
        help="show the CPU features the embedded llama.cpp engine was built for",
        description="Show the embedded llama.cpp engine's version and CPU features, and the command that "
        "rebuilds it for this CPU when that would evaluate prompts faster (docs/performance.md).",
    )
    engine.add_argument("--embedded-engine", choices=ENGINE_CHOICES, help="which engine to describe")
    engine.add_argument("-v", "--verbose", action="store_true", help="log progress details")

    for name, summary in (delegated or {}).items():
        # Listed for the overview; crag_dspy.console hands their arguments over before this parser runs.
        sub.add_parser(name, help=summary, add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    return parser


_SETTING_FLAGS = (
    "domain",
    "domain_dir",
    "chroma_path",
    "chroma_host",
    "chroma_port",
    "lm",
    "lm_api_base",
    "embedded_model",
    "embedded_engine",
    "web_search",
    "on_flag",
)
# Flags that set a CRAGConfig field (Settings.config).
_CONFIG_FLAGS = ("k", "lower", "upper", "internal_retries")


def settings_from_args(args: argparse.Namespace, **extra: Any):
    """Settings from the environment, overridden by the flags the user actually gave."""
    from .domain import check_domain_name
    from .settings import Settings

    if getattr(args, "domain", None) is not None:
        check_domain_name(args.domain)  # one line naming the flag, before Settings' own check
    overrides = {
        name: getattr(args, name) for name in _SETTING_FLAGS if getattr(args, name, None) is not None
    }
    overrides.update(extra)
    settings = Settings(**overrides)
    config = {name: getattr(args, name) for name in _CONFIG_FLAGS if getattr(args, name, None) is not None}
    # replace() validates the changed config; the rest of the settings were validated above.
    return settings.model_copy(update={"config": settings.config.replace(**config)}) if config else settings


_SOURCE_NAMES = {
    "logprobs": "the LLM judge",
    "label": "the LLM judge (labels)",
    "evaluator": "the trained evaluator",
    "fused": "LLM judge + evaluator, fused",
}


def _grade_sources(documents) -> str:
    names = dict.fromkeys(_SOURCE_NAMES.get(d.score_source, d.score_source) for d in documents)
    return ", ".join(names) or "nothing: no documents"


def _why_changed(trace) -> str:
    if trace.lm_answer and trace.lm_answer.strip() and trace.answer == "I don't know":
        return "no kept strip states it"
    return "unit from the context"


def _quoted(text: str, most: int = 100) -> str:
    text = _words(text)  # one line: a line break in a document must not start a line of its own here
    return f'"{text[:most]}{"..." if len(text) > most else ""}"'


def _answer_lines(trace, on_flag: OnFlag) -> list[str]:
    """The answer as ``ask`` shows it under the flag policy, its warning, and the sources of both sides."""
    verdict = judge_flag(trace, on_flag)
    warning = warning_line(trace.grounding)
    if verdict.status == "withheld":
        first = f"answer: {verdict.answer}  (withheld: --on-flag withhold)"
    else:
        first = f"answer: {trace.answer}" + (
            f"  (the LM replied {trace.lm_answer!r}; {_why_changed(trace)})" if trace.lm_answer else ""
        )
    lines = [first, *([warning] if warning else [])]  # right under the answer: it is about the answer
    # A label is a file name or URL: one line, or a name with "\nanswer: ..." in it forges an answer.
    lines += [f"  [{n}] {one_line(c.label)}: {_quoted(c.quote)}" for n, c in enumerate(verdict.citations, 1)]
    if verdict.other_side:
        lines.append("sources that disagree or instruct:")
        start = len(verdict.citations) + 1
        lines += [
            f"  [{n}] {one_line(c.label)}: {_quoted(c.quote)}"
            for n, c in enumerate(verdict.other_side, start)
        ]
    return lines


def format_trace(trace, on_flag: OnFlag = "warn") -> str:
    """A compact, human-readable account of one CRAG run; a flagged answer as ``on_flag`` says."""
    rounds = trace.internal_rounds
    retried = f"; first {trace.first_action}, {len(rounds)} internal retry round(s)" if rounds else ""
    lines = [
        *_answer_lines(trace, on_flag),
        f"action: {trace.action}  (lower={trace.lower:.2f}, upper={trace.upper:.2f}"
        + (f" for {trace.question_type} questions" if trace.question_type else "")
        + f"{retried})",
        f"documents (graded by {_grade_sources(trace.documents)}):",
    ]
    found_in = {pid: r.round for r in rounds for pid in r.passage_ids}
    for d in trace.documents:
        score = "error" if d.score is None else f"{d.score:.2f}"
        where = f"  (retry round {found_in[d.id]})" if d.id in found_in else ""
        lines.append(f"  #{d.rank} {score:>5}  {_words(d.title)[:70]}  [{one_line(d.doc_id)}]{where}")
    if rounds:
        lines.append(f"internal retries (at most {trace.internal_retries} rounds):")
    for r in rounds:
        scores = ", ".join("error" if x is None else f"{x:.2f}" for x in r.scores) or "nothing new"
        again = f", {r.repeated} found again" if r.repeated else ""
        ended = f"  (ended: {r.error})" if r.error else ""
        lines.append(f"  round {r.round}: query={r.query!r} graded [{scores}]{again} -> {r.action}{ended}")
    kept = [s for s in [*trace.internal_strips, *trace.external_strips] if s.kept]
    dropped = len(trace.internal_strips) + len(trace.external_strips) - len(kept)
    if trace.web_query is not None:
        lines.append(f"web: {trace.web_backend} query={trace.web_query!r} results={len(trace.web_results)}")
    if trace.witness_results:
        lines.append(
            f"witnesses: {len(trace.witness_results)} {trace.web_backend} results for the question, checked"
        )
    lines.append(f"strips: {len(kept)} kept, {dropped} dropped")
    for s in kept:
        text = _words(s.text)
        lines.append(f"  [{one_line(s.source)}] {text[:100]}{'...' if len(text) > 100 else ''}")
    for f in trace.fallbacks:
        lines.append(f"fallback: {one_line(f)}")
    for e in trace.errors:
        lines.append(f"error: {one_line(e)}")  # errors name files
    usage = trace.total_usage
    total_time = sum(trace.timings.values())
    lines.append(
        f"cost: {usage.calls} LM calls, {usage.prompt_tokens} prompt tokens "
        f"({usage.cached_prompt_tokens} cached), {usage.completion_tokens} completion tokens, "
        f"{total_time:.1f} s  [{trace.lm_model}]"
    )
    return "\n".join(lines)


def program_from_args(args: argparse.Namespace, *, lm=None, progress: bool = True):
    """The program ``ask`` and ``serve`` run: the compiled ``--program`` on its own (bundled) domain
    unless --domain/--domain-dir name one, or the uncompiled default; threshold and --internal-retries
    flags beat the program's, and --force accepts a program whose dataset hashes differ."""
    from .app import open_program

    settings = settings_from_args(args)
    explicit_domain = args.domain is not None or args.domain_dir is not None
    loaded = open_program(
        args.program,
        settings,
        domain_from_program=not explicit_domain,
        lm=lm,
        progress=progress,
        force=getattr(args, "force", False),
    )
    if loaded.compiled and (args.lower is not None or args.upper is not None):
        thresholds = loaded.crag.thresholds
        thresholds.load_state(
            {
                "lower": settings.config.lower if args.lower is not None else thresholds.lower,
                "upper": settings.config.upper if args.upper is not None else thresholds.upper,
            }
        )
    if loaded.compiled and getattr(args, "internal_retries", None) is not None:
        crag = loaded.crag
        crag.config = crag.config.replace(internal_retries=settings.config.internal_retries)
    return loaded


def _ingest(args: argparse.Namespace) -> int:
    from .domain import load_domain
    from .embeddings import Embedder
    from .store import ingest_domain, open_client

    same = args.domain_dir is not None and args.domain_dir.resolve() == (args.domain_path or Path()).resolve()
    if args.domain_path is not None and (args.domain_dir is not None or args.domain is not None) and not same:
        raise ValueError(
            f"ingest got the folder {args.domain_path} and also --domain or --domain-dir naming "
            "another: give the domain once (--domain-dir DIR, as every command takes it)"
        )
    settings = settings_from_args(args)
    domain = load_domain(
        args.domain_path or settings.resolved_domain_dir, max_document_bytes=settings.max_document_bytes
    )
    reports = ingest_domain(open_client(settings), domain, Embedder(settings.embedding_model))
    for r in reports:
        print(
            terminal_safe(
                f"{r.collection}: {r.documents} documents, {r.chunks} chunks "
                f"({r.added} added, {r.unchanged} unchanged, {r.removed} removed)"
            )
        )
    if domain.skipped:  # last, where it is seen: the ingest went on without these files
        print(f"skipped {len(domain.skipped)} unreadable file(s):")
        for message in domain.skipped:
            print(f"  {one_line(message)}")  # file names are untrusted
    return 0


def _ask(args: argparse.Namespace) -> int:
    from .conversation import HistoryError, as_history, read_history
    from .validation import normalize_question

    settings = settings_from_args(args)
    # Checked before any model or store is opened: a bad question or history costs nothing. The app's
    # history limit is the one a loaded program runs with (the app keeps its own).
    normalize_question(args.question, max_chars=settings.max_question_chars)
    history = None
    if args.history is not None:
        turns = read_history(args.history)
        try:
            history = as_history(turns, max_turns=settings.config.max_history_turns)
        except HistoryError as exc:
            raise HistoryError(f"{args.history}: {exc}") from None
    crag = program_from_args(args).crag
    progress = None if args.quiet else AskProgress()
    # The draft streams to a person at a terminal: a script's run is as it always was (no streamed LM
    # call), and an answer that may be withheld never shows as a draft (as POST /ask/stream).
    draft = progress is not None and sys.stderr.isatty() and settings.on_flag != "withhold"
    cancel = threading.Event()
    inputs: dict[str, Any] = {
        "question": args.question,
        "history": history,
        "on_event": None if progress is None else progress.on_event,
        "cancel": cancel,
    }
    try:
        if draft and progress is not None:
            from .events import run_with_tokens

            prediction = run_with_tokens(crag, progress.on_token, **inputs)
        else:
            prediction = crag(**inputs)
    except BaseException as exc:
        cancel.set()  # a streamed run goes on in its own thread: it stops at its next stage
        if progress is not None:
            progress.failed()
        if args.json and isinstance(exc, CRAGRunError):  # what happened up to the failure, for debugging
            # Under withhold an answer the policy never judged is not shown (as the API's error trace).
            failed = without_answer(exc.trace, None) if settings.on_flag == "withhold" else exc.trace
            print(json_for_terminal(failed.model_dump(mode="json")))
        raise
    if progress is not None:
        progress.finish(prediction.trace, settings.on_flag)
    if args.json:
        print(json_for_terminal(trace_json(prediction.trace, settings.on_flag)))
    else:
        # Documents, titles, file names, web results and the LM's answer are untrusted: an escape sequence
        # in a citation must not erase the warning above it (crag_dspy/terminal.py).
        print(terminal_safe(format_trace(prediction.trace, settings.on_flag)))
    return 0


def trace_json(trace, on_flag: OnFlag) -> dict[str, Any]:
    """``ask --json``'s output: the trace with the answer's ``status`` and ``other_side`` as the API
    gives them; a withheld answer is not in it (:func:`~crag_dspy.flag_policy.without_answer`), so a
    script reading ``answer`` gets what ``ask`` prints, not the value withheld."""
    verdict = judge_flag(trace, on_flag)
    shown = without_answer(trace) if verdict.status == "withheld" else trace
    return {
        "status": verdict.status,
        **shown.model_dump(mode="json"),
        "other_side": [c.model_dump(mode="json") for c in verdict.other_side],
    }


def stage_line(event) -> str:
    """A stage event as ``ask`` prints it on stderr: seconds since the run began, then what it did."""
    return f"[{event.seconds:6.1f} s] {event.message}"


def print_stage(event) -> None:
    # stderr, flushed: the stages show as they happen, and stdout stays the answer for pipes and scripts.
    # One line: titles and citation labels are file names ("cited 1: <name>"); the answer's own line is
    # printed by AskProgress.finish, its newlines kept as on stdout.
    print(one_line(stage_line(event)), file=sys.stderr, flush=True)


def _words(text: str) -> str:
    return " ".join(text.split())


def final_answer_line(event, trace, on_flag: OnFlag, draft: str | None) -> str:
    """The ``answer`` stage as ``ask`` prints it once the run is over: the answer the user gets under the
    flag policy, marked when it is not the ``draft`` streamed above it (None: none was)."""
    verdict = judge_flag(trace, on_flag)
    if verdict.status == "withheld":
        line = f"answer withheld (--on-flag withhold): {verdict.answer}"
        return line + ("; the draft above is not the answer" if draft else "")
    line = event.message  # "answer: ...", redacted
    if draft is not None and _words(draft) != _words(trace.answer or ""):
        why = _why_changed(trace) if trace.lm_answer else "the final answer differs from the LM's reply"
        line += f"  (draft replaced: {why})"
    if verdict.status == "flagged":
        line += "  (flagged: see the warning under the answer)"
    return line


class AskProgress:
    """What ``ask`` prints on stderr while its question runs: each stage as it happens, the answer's
    draft as the LM writes it (when :func:`run_with_tokens` streams it), then the answer and citations
    stages once the run is over, the answer as the user gets it and marked when it is not the draft.

    Stage events come from the run's thread and tokens from the caller's: a lock keeps lines whole."""

    _LAST = ("answer", "citations")  # emitted as the run ends; printed by :meth:`finish`

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self._draft: list[str] = []
        self._writing = False  # a draft line is open
        self._last: list = []

    def on_event(self, event) -> None:
        if event.kind in self._LAST:
            self._last.append(event)
            return
        with self._lock:
            self._end_draft()
            print_stage(event)

    def on_token(self, text: str) -> None:
        with self._lock:
            if not self._writing:
                sys.stderr.write(f"[{time.perf_counter() - self._started:6.1f} s] draft: ")
                self._writing = True
            self._draft.append(text)
            sys.stderr.write(terminal_safe(text))  # the LM's tokens: untrusted, as its answer
            sys.stderr.flush()

    def _end_draft(self) -> None:
        if self._writing:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._writing = False

    @property
    def draft(self) -> str | None:
        """The draft streamed so far; None when no token came."""
        return "".join(self._draft) if self._draft else None

    def finish(self, trace, on_flag: OnFlag) -> None:
        with self._lock:
            self._end_draft()
            for event in self._last:
                if event.kind == "answer":
                    line = final_answer_line(event, trace, on_flag, self.draft)
                    print(terminal_safe(f"[{event.seconds:6.1f} s] {line}"), file=sys.stderr, flush=True)
                else:
                    print_stage(event)

    def failed(self) -> None:
        """The run ended without an answer: a draft shown is none."""
        with self._lock:
            if self._draft:
                self._end_draft()
                print("no answer: the run did not finish; the draft above is not one", file=sys.stderr)


def _engine(args: argparse.Namespace) -> int:
    from .lm import MISSING_ENGINE, describe_engine, resolve_engine

    # Resolved first: a missing engine is an error that names what to install.
    build = describe_engine(engine=resolve_engine(settings_from_args(args).embedded_engine))
    if build is None:
        raise WeightsError(MISSING_ENGINE)
    print(f"{build.name} {build.version or '(unknown version)'}: {', '.join(build.features)}")
    if build.hint:
        print(build.hint)
    elif build.name == "xllamacpp":
        print("built for every speed-relevant feature this CPU has (or the CPU's are unknown)")
    else:
        print("no rebuild needed: ik_llama.cpp's own CPU kernels (docs/performance.md)")
    return 0


def interruptible(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` ending on Ctrl-C with one line on stderr and exit code 130 (128 + SIGINT, what a shell
    expects of an interrupted command) instead of a traceback through whatever was running. What was
    written before it stays (chunks in the store, LM answers in DSPy's disk cache): a rerun reuses it."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return run


@interruptible
def main(argv: list[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """``ingest``, ``ask`` and ``engine`` (the ``crag-dspy`` command is :func:`crag_dspy.console.main`).

    Exit codes: 0 answered, 2 bad input or setup (one line on stderr), 1 a backend failed mid-question."""
    args = (parser or build_parser()).parse_args(argv)
    configure_logging(args.verbose)
    try:
        return {"ingest": _ingest, "ask": _ask, "engine": _engine}[args.command](args)
    except user_error_types() as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except CRAGRunError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1


def error_line(exc: BaseException) -> str:
    """The one ``error: ...`` line a command prints for ``exc``, secrets redacted and the bundled data's
    files named by what they are ("the bundled program for domain 'default'"), not by where the package
    is installed (:func:`~crag_dspy.bundled_paths.show_bundled_paths`). A pydantic error
    (a setting out of range, from a flag or a ``CRAG_*`` variable) is flattened to one line naming the
    setting and the value given, without pydantic's documentation links; a ``CRAG_*`` variable that
    should hold JSON and does not says so."""
    from pydantic_settings import SettingsError

    if isinstance(exc, ValidationError):
        text = f"invalid {exc.title}: {describe_validation_error(exc)}"
    elif isinstance(exc, SettingsError) and isinstance(exc.__cause__, json.JSONDecodeError):
        # pydantic-settings names the field but neither the variable's format nor what is wrong with it.
        text = (
            f"{exc}: the value is not JSON ({exc.__cause__}); a list or a nested setting is JSON in the "
            "environment, e.g. CRAG_WEB_DOMAINS='[\"wikipedia.org\"]', or one variable per part, e.g. "
            "CRAG_CONFIG__K=8"
        )
    else:
        text = str(exc)
    return f"error: {one_line(redact(show_bundled_paths(text)))}"  # one line: messages name files


def user_error_types() -> tuple[type[Exception], ...]:
    """Errors caused by the user's input or setup: reported as one line and exit code 2, not a traceback."""
    from .domain import DomainDataError
    from .lm import LMConfigError, WeightsError
    from .program import ProgramError
    from .store import StoreError

    return (
        DomainDataError,
        LMConfigError,
        WeightsError,
        StoreError,
        ProgramError,
        ValueError,
        ValidationError,
    )
