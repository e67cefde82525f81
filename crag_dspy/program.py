"""Compiled program files: one JSON with every predictor's DSPy state, the thresholds and metadata.

No pickle, ever: the file is plain JSON that :func:`load_program` applies to a freshly built CRAG.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dspy

from . import __version__
from .evaluator import EvaluatorError, RelevanceEvaluator
from .focus import check_grade_sentences, check_term_stems, check_term_weight
from .generation import check_text_adapter
from .module import CRAG
from .retry import check_internal_retries
from .strips import check_fallback_web_strips

__all__ = [
    "PROGRAM_FORMAT",
    "PROGRAM_FORMAT_VERSION",
    "ProgramError",
    "apply_program",
    "check_domain",
    "program_config",
    "read_program",
    "save_program",
]

PROGRAM_FORMAT = "crag-dspy-program"
# 2: judges carry a fitted calibration; 3: a calibration may weigh lexical evidence; 4: the grade
# source (LLM judge, trained evaluator or fused) with the evaluator's weights folder. Versions 2 and 3
# load as LLM-judge programs; older readers refuse version 4 instead of ignoring its evaluator.
# 5: per-question-type thresholds and internal retry rounds; older readers refuse them instead of
# routing every question with one pair and no retries.
PROGRAM_FORMAT_VERSION = 5
SUPPORTED_FORMAT_VERSIONS = (2, 3, 4, 5)
_LLM_GRADING = {"mode": "llm", "evaluator": None, "evaluator_score": None, "fused_score": None}
_CONFIG_KEYS = ("k", "strip_threshold", "max_strips", "sentences_per_strip", "web_results")


class ProgramError(ValueError):
    """A program file is unreadable, corrupt, of another format or version, or for another domain."""


def program_config(crag: CRAG) -> dict[str, Any]:
    return {key: getattr(crag, key) for key in _CONFIG_KEYS} | {
        "judge_adapter": crag.grader.adapter_name,
        "text_adapter": crag.text_adapter,
        "grade_sentences": crag.grade_sentences,
        "grade_term_weight": crag.grade_term_weight,
        "grade_term_stems": crag.grade_term_stems,
        "answer_units": crag.answer_units,
        "fallback_web_strips": crag.fallback_web_strips,
        "internal_retries": crag.internal_retries,
    }


def evaluator_folder(path: Path) -> Path:
    """Where the trained evaluator of the program at ``path`` keeps its weights: beside it."""
    return path.with_name(f"{path.stem}.evaluator")


def save_program(crag: CRAG, path: Path | str, metadata: dict[str, Any]) -> Path:
    """Write ``crag``'s state (demos, instructions, thresholds), its config and ``metadata`` as one JSON;
    a trained evaluator's weights go to a safetensors folder beside it (:func:`evaluator_folder`),
    recorded in the JSON with each file's size and sha256."""
    path = Path(path)
    grading = crag.grading
    if grading.evaluator is not None:
        folder = evaluator_folder(path)
        files = grading.evaluator.save(folder)
        grading.manifest = {
            "path": folder.name,
            "base_model": grading.evaluator.base_model,
            "max_length": grading.evaluator.max_length,
            "files": files,
        }
    state = crag.dump_state(json_mode=True)
    for value in state.values():
        if isinstance(value, dict) and "lm" in value:
            # The app chooses the LM; a saved LM would carry its endpoint (and so where keys are sent).
            value["lm"] = None
    document = {
        "format": PROGRAM_FORMAT,
        "format_version": PROGRAM_FORMAT_VERSION,
        "crag_dspy_version": __version__,
        "dspy_version": dspy.__version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": program_config(crag),
        "metadata": metadata,
        "state": state,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)  # never leave a half-written program where an app would load it
    return path


def read_program(path: Path | str, *, domain: str | None = None) -> dict[str, Any]:
    """Read and validate a program file; with ``domain``, also require that it was compiled for it."""
    path = Path(path)
    if path.suffix.lower() in {".pkl", ".pickle"} or path.is_dir():
        raise ProgramError(f"{path}: crag-dspy programs are JSON files; pickled programs are never loaded")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProgramError(f"{path}: cannot read program ({exc.strerror})") from None
    if raw[:2] == b"\x80\x04" or raw[:1] == b"\x80":
        raise ProgramError(f"{path}: this is a pickle, not a program JSON; pickles are never loaded")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"{path}: corrupt or truncated program JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != PROGRAM_FORMAT:
        raise ProgramError(f'{path}: not a crag-dspy program (missing "format": "{PROGRAM_FORMAT}")')
    version = document.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        supported = ", ".join(map(str, SUPPORTED_FORMAT_VERSIONS))
        raise ProgramError(
            f"{path}: program format version {version!r} is not supported by this crag-dspy "
            f"(supports {supported}); recompile with python -m optimize.compile"
        )
    for key in ("state", "config", "metadata"):
        if not isinstance(document.get(key), dict):
            raise ProgramError(f"{path}: program is missing its {key!r} section")
    if domain is not None:
        check_domain(document, domain, path)
    return document


def check_domain(document: dict[str, Any], domain: str, path: Path | str) -> None:
    """Refuse a program compiled for another domain than ``domain``."""
    found = document["metadata"].get("domain")
    if found != domain:
        raise ProgramError(
            f"{path}: program was compiled for domain {found!r}, not {domain!r}; "
            f"compile one for {domain!r} or pass --domain {found}"
        )


def _checked(config: dict[str, Any], key: str, default: Any, check: Callable[[Any], Any]) -> Any:
    """``config[key]`` (``default`` for programs saved before the key existed), validated by ``check``,
    which raises ValueError for a bad value."""
    value = config.get(key, default)
    try:
        check(value)
    except ValueError as exc:
        raise ProgramError(f"program config has an invalid {key} {value!r}: {exc}") from exc
    return value


def apply_program(crag: CRAG, document: dict[str, Any], program_dir: Path | str | None = None) -> CRAG:
    """Apply a validated program's state and config to ``crag`` (raises ProgramError, leaves it untouched).

    ``program_dir`` is the folder of the program file: a program with a trained evaluator finds its
    weights there, and they are verified against the program's sha256s before anything is applied.
    """
    config = document["config"]
    if config.get("judge_adapter", crag.grader.adapter_name) != crag.grader.adapter_name:
        raise ProgramError(
            f"program uses judge adapter {config['judge_adapter']!r}, the module {crag.grader.adapter_name!r}"
        )
    try:
        text_adapter = check_text_adapter(config.get("text_adapter", "chat"))
    except ValueError as exc:
        raise ProgramError(f"program uses an {exc}") from exc
    # Programs from before the grader's sentence focus existed graded whole passages.
    grade_sentences = _checked(config, "grade_sentences", 0, check_grade_sentences)
    # Programs from before the question's words counted chose the graded sentences by similarity alone.
    grade_term_weight = _checked(config, "grade_term_weight", 0.0, check_term_weight)
    # Programs from before stems were compared matched the question's words exactly.
    grade_term_stems = _checked(config, "grade_term_stems", False, check_term_stems)
    # Programs from before the web's reserve strips existed answered "I don't know" instead.
    fallback_web_strips = _checked(config, "fallback_web_strips", 0, check_fallback_web_strips)
    # Programs from before the internal retries existed went to the web at once.
    internal_retries = _checked(config, "internal_retries", 0, check_internal_retries)
    answer_units = config.get("answer_units", False)
    if not isinstance(answer_units, bool):
        raise ProgramError(
            f"program config has an invalid answer_units {answer_units!r}: expected true or false"
        )
    state = dict(document["state"])
    if document.get("format_version", PROGRAM_FORMAT_VERSION) < 4:
        state.setdefault("grading", _LLM_GRADING)  # programs before the evaluator graded with the LLM
    # Programs from before the internal retries' query reviser existed: it keeps its uncompiled prompt
    # (they never call it unless internal_retries is set to 2 or more).
    state.setdefault("reviser", crag.reviser.dump_state(json_mode=True))
    evaluator = _load_evaluator(state.get("grading"), program_dir)
    expected = {name for name, _ in crag.named_parameters()}
    missing = expected - state.keys()
    if missing:
        raise ProgramError(
            f"program state lacks {sorted(missing)}: it was saved from a different program structure"
        )
    with_lm = sorted(name for name in expected if isinstance(state[name], dict) and state[name].get("lm"))
    if with_lm:
        raise ProgramError(
            f"program state of {with_lm} names its own LM: programs never choose the LM (it would decide "
            "where your API keys are sent); the app passes it to load_program"
        )
    try:
        # dspy's load_state does a trial run on a copy first, so a bad state leaves `crag` untouched.
        crag.load_state({name: state[name] for name in expected})
    except Exception as exc:  # noqa: BLE001 - any malformed state is one clear error
        raise ProgramError(
            f"program state does not fit this CRAG module: {type(exc).__name__}: {exc}"
        ) from exc
    crag.grading.evaluator = evaluator
    for key in _CONFIG_KEYS:
        if key in config:
            setattr(crag, key, config[key])
    # The format the program was compiled and measured with; programs from before the text adapter
    # existed answered through DSPy's ChatAdapter.
    crag.text_adapter = text_adapter
    crag.grade_term_weight = grade_term_weight
    crag.grade_term_stems = grade_term_stems
    crag.grade_sentences = grade_sentences
    # Programs from before units were attached were measured with the LM's bare replies.
    crag.answer_units = answer_units
    crag.fallback_web_strips = fallback_web_strips
    crag.internal_retries = internal_retries
    return crag


def _load_evaluator(grading: Any, program_dir: Path | str | None) -> RelevanceEvaluator | None:
    """The program's trained evaluator, verified and loaded, or None when it grades with the LLM alone."""
    manifest = grading.get("evaluator") if isinstance(grading, dict) else None
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("path"), str):
        raise ProgramError("program state has a malformed evaluator manifest (needs 'path' and 'files')")
    if program_dir is None:
        raise ProgramError(
            "this program grades with a trained evaluator: load it from its file (load_program) so that "
            "its weights folder can be found"
        )
    name = manifest["path"]
    if Path(name).name != name or name in ("", ".", ".."):
        raise ProgramError(f"program names an evaluator folder outside its own folder: {name!r}")
    try:
        return RelevanceEvaluator.load(Path(program_dir) / name, manifest.get("files") or {})
    except EvaluatorError as exc:
        raise ProgramError(f"program's trained evaluator is not usable: {exc}") from exc
