"""The program file format: DSPy's own JSON save format, with crag-dspy's metadata.

A program file is what ``dspy.Module.save("program.json")`` writes for a :class:`~crag_dspy.module.CRAG`:
every parameter's DSPy state at the top level (predictors, calibrations, ``thresholds``, ``grading``),
the CRAG's ``config`` (:meth:`CRAG.dump_state <crag_dspy.module.CRAG.dump_state>` adds it) and
``metadata``, where DSPy keeps ``dependency_versions`` and crag-dspy adds its format, version and
what the compile recorded (:class:`ProgramMetadata`)::

    {"grader.predict": {...}, ..., "thresholds": {...}, "grading": {...}, "config": {...},
     "metadata": {"dependency_versions": {...}, "format": "crag-dspy-program", "format_version": 7,
                  "crag_dspy_version": "...", "created": "...", "domain": "default", ...}}

So ``crag.save(path)`` / ``crag.load(path)`` and :func:`save_program` / :func:`read_program` +
:func:`apply_program` read and write the same file, and plain ``dspy.Module.load`` reads it too.
No pickle, ever. A trained evaluator's weights live in a folder beside the file (:func:`evaluator_folder`).

This module reads and writes the file for ``CRAG.save`` / ``CRAG.load`` and so does not import the
module (``crag`` is any :class:`~crag_dspy.module.CRAG`); :mod:`crag_dspy.program` adds the module's
own thresholds check to reading, for apps that validate a file before they build the module.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import dspy
from dspy.utils.saving import get_dependency_versions
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    ValidationError,
    field_validator,
)

from .config import CRAGConfig, describe_validation_error
from .domain import check_domain_name
from .files import read_regular_file
from .judges.calibration import check_evidence_names
from .judges.evaluator import EvaluatorError, RelevanceEvaluator
from .version import __version__

ADDED_PREDICTORS = ("condenser",)
"""Predictors added after programs were first shipped: a program saved before one existed loads with it
as the module builds it (no demos, the signature's own instruction), instead of failing on a missing key."""

__all__ = [
    "ADDED_PREDICTORS",
    "MAX_DEMOS",
    "MAX_INSTRUCTIONS_CHARS",
    "MAX_PROGRAM_BYTES",
    "PROGRAM_FORMAT",
    "PROGRAM_FORMAT_VERSION",
    "PROGRAM_PARAMETERS",
    "FileMetadata",
    "ProgramError",
    "ProgramFile",
    "ProgramMetadata",
    "apply_program",
    "check_dataset",
    "check_domain",
    "evaluator_folder",
    "load_into",
    "program_config",
    "program_crag_config",
    "read_program",
    "read_program_json",
    "save_program",
]

PROGRAM_FORMAT = "crag-dspy-program"
# 7: DSPy's save format (state at the top level, config beside it, crag-dspy's fields in "metadata").
# Programs of earlier versions are refused: recompiling is one command, and a program's numbers hold
# only for the code that measured them (format 6 files convert: python -m optimize.convert_program).
PROGRAM_FORMAT_VERSION = 7
PROGRAM_PARAMETERS = (
    "grading",
    "grader.predict",
    "grader.calibration",
    "strip_filter.predict",
    "strip_filter.calibration",
    "condenser",
    "rewriter",
    "reviser",
    "answerer",
    "thresholds",
)
"""The state keys of a CRAG program file: ``CRAG.named_parameters()``'s names (a test keeps them equal).
Any other top-level key but ``config`` and ``metadata`` is refused: it would be ignored, silently."""
# What crag-dspy writes into "metadata" itself; a compile's metadata must not name them.
_FILE_KEYS = ("dependency_versions", "format", "format_version", "crag_dspy_version", "created")

log = logging.getLogger(__name__)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

MAX_PROGRAM_BYTES = 50 * 1024 * 1024
"""Largest program file read (50 MB): a compiled program is tens of kB; a bigger file is no program, and
reading it whole (or /dev/zero behind a symlink) would take all memory first."""
MAX_DEMOS = 64
"""Most demos one predictor may hold: compiles keep a handful, and every prompt of that stage carries all."""
MAX_INSTRUCTIONS_CHARS = 20_000
"""Longest instruction (and longest demo value, field prefix or description): every prompt carries it."""
MAX_CALIBRATION = 1e3
"""Largest magnitude of a calibration's or a fitted score's numbers (fitted ones are below 10): finite but
huge values (1e308) overflow to NaN when a passage is graded, long after the file was read."""
MIN_SLOPE = 1e-3
"""Smallest calibration slope: the decision point is ``-shift / slope``, which a tiny slope sends to inf."""

_Bounded = Annotated[FiniteFloat, Field(ge=-MAX_CALIBRATION, le=MAX_CALIBRATION)]
_Text = Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)]


def _demo_value(value: Any) -> Any:
    # A demo is a dspy.Example as JSON: its values are what the signatures' fields hold (str, bool) and
    # DSPy's own flags ("augmented": true). A list or an object is no field value any signature reads.
    if value is not None and not isinstance(value, str | bool | int | float):
        raise ValueError(
            f"a demo's value is a string, a boolean, a number or null, not {type(value).__name__}"
        )
    if isinstance(value, str) and len(value) > MAX_INSTRUCTIONS_CHARS:
        raise ValueError(f"a demo's value is at most {MAX_INSTRUCTIONS_CHARS} characters, not {len(value)}")
    return value


_DemoValue = Annotated[Any, AfterValidator(_demo_value)]


class ProgramError(ValueError):
    """A program file is unreadable, corrupt, of another format or version, or for another domain."""


class ProgramMetadata(BaseModel):
    """What a compile records about itself in a program's metadata. Descriptive only: the app names the
    domain (folder) a program runs on, and nothing here is used to locate a file. Other keys are kept
    as written."""

    model_config = ConfigDict(extra="allow")

    domain: str = Field(description="Name of the domain the program was compiled for.")
    domain_dir: str | None = Field(
        None, description="Folder the compile read (written by earlier compiles; never used to find it)."
    )
    dataset_hashes: dict[str, str] = Field(
        default_factory=dict, description="sha256 of each data file the compile saw (Domain.file_hashes)."
    )
    lm: str | None = None
    optimizer: str | None = None
    seed: int | None = None
    stages: list[str] | None = None
    scores: dict[str, Any] | None = None

    @field_validator("domain")
    @classmethod
    def _domain_is_a_name(cls, value: str | None) -> str | None:
        return None if value is None else check_domain_name(value, "domain")

    @field_validator("dataset_hashes")
    @classmethod
    def _hashes(cls, hashes: dict[str, str]) -> dict[str, str]:
        for name, digest in hashes.items():
            if Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"{name!r} is not a file name")
            if not _SHA256.match(digest):
                raise ValueError(f"{name}: {digest!r} is not a sha256 hex digest")
        return hashes


class FileMetadata(ProgramMetadata):
    """A program file's ``metadata``: DSPy's ``dependency_versions``, crag-dspy's format fields and,
    for a compiled program, the compile's :class:`ProgramMetadata` (a program saved with
    ``crag.save`` names no domain)."""

    dependency_versions: dict[str, str] = Field(
        default_factory=dict, description="What dspy.Module.save records: python, dspy, cloudpickle."
    )
    format: Literal[PROGRAM_FORMAT]  # type: ignore[valid-type] - constants, one place to change them
    format_version: Literal[PROGRAM_FORMAT_VERSION]  # type: ignore[valid-type]
    crag_dspy_version: str
    created: str
    domain: str | None = Field(None, description="Domain the program was compiled for, when recorded.")


class CalibrationState(BaseModel):
    """A judge's :class:`~crag_dspy.judges.calibration.Calibration`: finite numbers of at most
    :data:`MAX_CALIBRATION`, a slope of at least :data:`MIN_SLOPE`.

    Python's json reads ``NaN`` and ``Infinity``; checked here, they are refused by name when the file
    is read instead of failing as a ``TypeError`` once the program is applied."""

    model_config = ConfigDict(extra="allow")

    slope: FiniteFloat = Field(ge=MIN_SLOPE, le=MAX_CALIBRATION)
    intercept: _Bounded
    weights: dict[str, _Bounded] | None = None  # programs of format 2 have none

    @field_validator("weights")
    @classmethod
    def _known_evidence(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        # Checked when the file is read, before the store and the embedder open (it was refused only
        # when the program was applied).
        check_evidence_names(weights or {})
        return weights


class LinearScoreState(BaseModel):
    """A fitted :class:`~crag_dspy.judges.fusion.LinearScore`: finite weights and intercept, each of
    magnitude at most :data:`MAX_CALIBRATION`."""

    model_config = ConfigDict(extra="allow")

    weights: dict[str, _Bounded]
    intercept: _Bounded


class SignatureFieldState(BaseModel):
    """One field of a signature as ``Signature.dump_state`` writes it."""

    model_config = ConfigDict(extra="forbid")

    prefix: _Text
    description: _Text


class SignatureState(BaseModel):
    """A predictor's signature as ``Signature.dump_state`` writes it: its instructions and its fields."""

    model_config = ConfigDict(extra="forbid")

    instructions: _Text
    fields: list[SignatureFieldState]


class PredictorState(BaseModel):
    """A ``dspy.Predict``'s state as ``Predict.dump_state`` writes it. ``Predict.load_state`` sets every
    key it does not know as an attribute of the predictor, unchecked: a wrong type there (``"demos":
    "abc"``) loaded and failed as an ``AttributeError`` at the answer stage, after LM calls were spent,
    so each key is typed here and any other key is refused."""

    model_config = ConfigDict(extra="forbid")

    traces: list[Any] = Field(default_factory=list)
    train: list[Any] = Field(default_factory=list)
    demos: list[dict[str, _DemoValue]] = Field(default_factory=list, max_length=MAX_DEMOS)
    signature: SignatureState
    # DSPy's per-output decision overrides (Predict.fields), written only when a predictor has some.
    fields: dict[str, dict[str, Any]] | None = None
    lm: dict[str, Any] | None  # always written (None by save_program); apply_program refuses one


class WeightsFileState(BaseModel):
    """One file of a trained evaluator's folder, as the program lists it (the folder is verified against
    it when the weights load: a missing size or digest is refused there)."""

    model_config = ConfigDict(extra="allow")

    bytes: int | None = Field(None, ge=0)
    sha256: str | None = Field(None, pattern=_SHA256.pattern)


class EvaluatorManifestState(BaseModel):
    """Where a trained evaluator's weights are (a folder beside the program) and what they are."""

    model_config = ConfigDict(extra="allow")

    path: str
    base_model: str | None = None
    max_length: int | None = Field(None, gt=0)
    files: dict[str, WeightsFileState]


class GradingState(BaseModel):
    """The grader's :class:`~crag_dspy.judges.fusion.Grading`: its mode, evaluator and fitted scores
    (the module checks that they fit together when the program is applied)."""

    model_config = ConfigDict(extra="allow")

    mode: str = "llm"
    evaluator: EvaluatorManifestState | None = None
    evaluator_score: LinearScoreState | None = None
    fused_score: LinearScoreState | None = None


class ProgramFile(BaseModel):
    """The whole program file, checked before any of it is applied (and before a store or model is
    opened): the :class:`~crag_dspy.config.CRAGConfig` with its ranges, the metadata, and the state's
    shape (each parameter's DSPy state an object; each predictor's demos, signature and LM typed and
    bounded; thresholds in range and ordered; calibrations, the grading and the evaluator's manifest with
    finite, bounded numbers)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    # Every other key is a parameter's DSPy state, named as CRAG.named_parameters() names it.
    __pydantic_extra__: dict[str, dict[str, Any]] = Field(init=False)

    config: CRAGConfig
    metadata: FileMetadata
    thresholds: dict[str, Any] | None = None
    grading: GradingState | None = None
    grader_calibration: CalibrationState | None = Field(None, alias="grader.calibration")
    strip_filter_calibration: CalibrationState | None = Field(None, alias="strip_filter.calibration")
    grader_predict: PredictorState | None = Field(None, alias="grader.predict")
    strip_filter_predict: PredictorState | None = Field(None, alias="strip_filter.predict")
    condenser: PredictorState | None = None
    rewriter: PredictorState | None = None
    reviser: PredictorState | None = None
    answerer: PredictorState | None = None


def program_config(crag: dspy.Module) -> dict[str, Any]:
    """``crag``'s config as a program stores it, with the (lower, upper) its thresholds route with."""
    thresholds = crag.thresholds
    return crag.config.replace(lower=thresholds.lower, upper=thresholds.upper).model_dump(mode="json")


def evaluator_folder(path: Path) -> Path:
    """Where the trained evaluator of the program at ``path`` keeps its weights: beside it."""
    return path.with_name(f"{path.stem}.evaluator")


def save_program(crag: dspy.Module, path: Path | str, metadata: dict[str, Any] | None = None) -> Path:
    """Write ``crag`` as DSPy's JSON save writes it (its state and config, :meth:`CRAG.dump_state`),
    with crag-dspy's format fields and the compile's ``metadata`` (:class:`ProgramMetadata`; None for a
    program that records no compile) in the file's ``metadata``. A trained evaluator's weights go to a
    safetensors folder beside it (:func:`evaluator_folder`), recorded with each file's size and sha256.
    """
    path = Path(path)
    if path.suffix != ".json":
        raise ProgramError(
            f"{path}: crag-dspy programs are JSON files (a .json path); pickles are never written"
        )
    compile_facts: dict[str, Any] = {}
    if metadata is not None:
        reserved = sorted(set(metadata) & set(_FILE_KEYS))
        if reserved:
            raise ProgramError(f"program metadata is invalid: {reserved} are written by save_program itself")
        try:
            ProgramMetadata.model_validate(metadata)  # never write a program that read_program refuses
        except ValidationError as exc:
            raise ProgramError(
                f"program metadata is invalid: {describe_validation_error(exc, 'file')}"
            ) from None
        compile_facts = metadata
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
    document = crag.dump_state(json_mode=True)
    for value in document.values():
        if isinstance(value, dict) and "lm" in value:
            # The app chooses the LM; a saved LM would carry its endpoint (and so where keys are sent).
            value["lm"] = None
    document["metadata"] = {
        "dependency_versions": get_dependency_versions(),  # what dspy.Module.save records
        "format": PROGRAM_FORMAT,
        "format_version": PROGRAM_FORMAT_VERSION,
        "crag_dspy_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **compile_facts,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)  # never leave a half-written program where an app would load it
    return path


MAX_INT_DIGITS = 20
"""Most digits of an integer in a program file: every integer a program holds (k, counts, sizes) fits in
a few; Python refuses to read one of over 4,300 digits with an error that named no file."""


class _LongInteger(ValueError):
    """An integer in a program file with more than :data:`MAX_INT_DIGITS` digits."""


def _program_int(digits: str) -> int:
    """A JSON integer of a program file, refused past :data:`MAX_INT_DIGITS` digits before Python
    converts it (which is quadratic in the digits, and fails past 4,300 of them)."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(
            f"an integer of {len(digits.lstrip('-'))} digits (a program's integers have at most {MAX_INT_DIGITS})"
        )
    return int(digits)


def read_program_json(path: Path | str) -> Any:
    """The parsed JSON of a program file, of any format or version; a file that is missing, a
    pickle (never unpickled), undecodable or corrupt raises :class:`ProgramError` naming it."""
    path = Path(path)
    if path.suffix.lower() in {".pkl", ".pickle"} or path.is_dir():
        raise ProgramError(f"{path}: crag-dspy programs are JSON files; pickled programs are never loaded")
    # A device (/dev/zero) was read until memory ran out, and a FIFO waited for a writer for ever.
    raw = read_regular_file(path, MAX_PROGRAM_BYTES, "program", ProgramError)
    raw = raw.removeprefix(codecs.BOM_UTF8)  # editors on Windows write one; domain files accept it too
    if raw[:2] == b"\x80\x04" or raw[:1] == b"\x80":
        raise ProgramError(f"{path}: this is a pickle, not a program JSON; pickles are never loaded")
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_program_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProgramError(f"{path}: corrupt or truncated program JSON ({exc})") from None
    except _LongInteger as exc:
        raise ProgramError(f"{path}: invalid program: {exc}") from None
    except RecursionError:  # json parses nested arrays/objects recursively
        raise ProgramError(
            f"{path}: corrupt program JSON: nested too deeply to parse (past Python's recursion limit)"
        ) from None


def read_program(
    path: Path | str,
    *,
    domain: str | None = None,
    schema: type[ProgramFile] = ProgramFile,
    parameters: Collection[str] = PROGRAM_PARAMETERS,
) -> dict[str, Any]:
    """Read and validate a program file (``schema``: :class:`ProgramFile`, or
    :class:`crag_dspy.program.ProgramFile`, which also checks the thresholds as the module does); with
    ``domain``, also require that it was compiled for it. ``parameters`` are the state keys the file may
    hold besides ``config`` and ``metadata`` (a module's ``named_parameters()``). Returns the validated
    document as JSON-able dicts, shaped as the file."""
    path = Path(path)
    document = read_program_json(path)
    _check_format(document, path)
    if not isinstance(document.get("config"), dict):
        raise ProgramError(f"{path}: program is missing its 'config' section")
    # A program saved before ``strip_view`` existed fitted its strip filter on whole strips.
    document["config"].setdefault("strip_view", {"sentences": 0})
    try:
        document = schema.model_validate(document).model_dump(mode="json", exclude_unset=True, by_alias=True)
    except ValidationError as exc:
        raise ProgramError(f"{path}: invalid program: {describe_validation_error(exc, 'file')}") from None
    unknown = sorted(set(document) - set(parameters) - {"config", "metadata"})
    if unknown:
        raise ProgramError(
            f"{path}: invalid program: {unknown[0]}: not a part of a CRAG program (its keys are config, "
            f"metadata and the state of {', '.join(sorted(parameters))}); it would be ignored"
        )
    _warn_on_other_dependencies(document["metadata"]["dependency_versions"], path)
    if domain is not None:
        check_domain(document, domain, path)
    return document


def _check_format(document: Any, path: Path) -> None:
    """Refuse a file that is no crag-dspy program, or one of another format version, with how to
    recompile it. Formats up to 6 wrapped the state in an envelope with the format at the top."""
    envelope = isinstance(document, dict) and document.get("format") == PROGRAM_FORMAT
    metadata = document.get("metadata") if isinstance(document, dict) else None
    if envelope:
        version = document.get("format_version")
    elif isinstance(metadata, dict) and metadata.get("format") == PROGRAM_FORMAT:
        version = metadata.get("format_version")
    else:
        raise ProgramError(
            f'{path}: not a crag-dspy program (its "metadata" lacks "format": "{PROGRAM_FORMAT}"; '
            "a DSPy save of another module?)"
        )
    if version != PROGRAM_FORMAT_VERSION:
        domain_name = (metadata if isinstance(metadata, dict) else {}).get("domain") or "<domain>"
        raise ProgramError(
            f"{path}: program format version {version!r}; this crag-dspy reads version "
            f"{PROGRAM_FORMAT_VERSION} only. Recompile it: crag-dspy compile --domain {domain_name} "
            f"--out {path}"
        )


def _warn_on_other_dependencies(saved: dict[str, str], path: Path) -> None:
    """Warn, as dspy.Module.load does, when the program was saved with other dependency versions."""
    current = get_dependency_versions()
    for key, version in saved.items():
        if key in current and current[key] != version:
            log.warning("%s: saved with %s %s, running %s %s", path, key, version, key, current[key])


def check_domain(document: dict[str, Any], domain: str, path: Path | str) -> None:
    """Refuse a program compiled for another domain than ``domain``. A program that names no domain
    (``crag.save`` writes its config, thresholds and demos, but cannot know the data they were tuned on)
    runs on ``domain`` unchecked, with one warning that says how to have it checked."""
    found = document["metadata"].get("domain")
    if found is None:
        log.warning(
            "%s: program names no domain (saved with crag.save), so it is not checked against the data of "
            "domain %r; its thresholds and demos are used as saved. To have it checked, save it with "
            "crag_dspy.program.save_program(crag, path, {'domain': %r})",
            path,
            domain,
            domain,
        )
        return
    if found != domain:
        raise ProgramError(
            f"{path}: program was compiled for domain {found!r}, not {domain!r}; "
            f"compile one for {domain!r} or pass --domain {found}"
        )


def check_dataset(
    document: dict[str, Any], hashes: dict[str, str], path: Path | str, *, force: bool = False
) -> None:
    """Refuse a program compiled on other data than the domain holds now: ``hashes`` are the domain's
    :meth:`~crag_dspy.domain.Domain.file_hashes`. With ``force`` the difference is only logged.
    Programs that recorded no hashes are not checked."""
    recorded = document["metadata"].get("dataset_hashes") or {}
    if not recorded:
        return
    differ = [
        f"{name}: program {_digest(recorded.get(name))}, domain {_digest(hashes.get(name))}"
        for name in sorted(recorded.keys() | hashes.keys())
        if recorded.get(name) != hashes.get(name)
    ]
    if not differ:
        return
    message = f"{path}: the domain's data differ from the data the program was compiled on (sha256 of " + (
        "; ".join(differ) + ")"
    )
    if not force:
        raise ProgramError(f"{message}; recompile the program, or pass --force to use it anyway")
    log.warning("%s; using it anyway (--force)", message)


def _digest(value: str | None) -> str:
    return value[:12] if value else "absent"


APP_CONFIG_FIELDS = ("lm_calls", "max_history_turns")
"""The config fields that describe the app, not the compiled program: how the app's LM is called and
how much history its requests may carry. An app keeps its own when it loads a program."""


def program_crag_config(document: dict[str, Any], app: CRAGConfig | None = None) -> CRAGConfig:
    """The :class:`~crag_dspy.config.CRAGConfig` a validated program stores, with ``app``'s
    :data:`APP_CONFIG_FIELDS` instead of the compile's when ``app`` is given."""
    try:
        config = CRAGConfig.model_validate(document["config"])
    except ValidationError as exc:
        raise ProgramError(f"program config is invalid: {describe_validation_error(exc, 'file')}") from None
    if app is None:
        return config
    return config.replace(**{name: getattr(app, name) for name in APP_CONFIG_FIELDS})


def apply_program(
    crag: dspy.Module,
    document: dict[str, Any],
    program_dir: Path | str | None = None,
    *,
    keep_app_config: bool = True,
) -> dspy.Module:
    """Apply a validated program's config and state to ``crag`` (raises ProgramError, leaves it untouched).

    With ``keep_app_config`` (the app's case) ``crag`` keeps its own ``lm_calls`` and
    ``max_history_turns`` (:data:`APP_CONFIG_FIELDS`): they describe the app. ``program_dir`` is the folder of the program file: a program with a trained evaluator finds its
    weights there, and they are verified against the program's sha256s before anything is applied.
    """
    config = program_crag_config(document, crag.config if keep_app_config else None)
    state = {name: value for name, value in document.items() if name != "metadata"}
    evaluator = _load_evaluator(state.get("grading"), program_dir)
    # A predictor added after the program was compiled (ADDED_PREDICTORS) loads as the module builds it.
    expected = {name for name, _ in crag.named_parameters()} - set(ADDED_PREDICTORS)
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
    state["config"] = config.model_dump(mode="json")
    try:
        crag.load_state(state)  # CRAG.load_state leaves the module untouched when it raises
    except Exception as exc:  # any malformed state is one clear error
        raise ProgramError(
            f"program state does not fit this CRAG module: {type(exc).__name__}: {exc}"
        ) from exc
    crag.grading.evaluator = evaluator
    return crag


def load_into(crag: dspy.Module, path: Path | str) -> dspy.Module:
    """What ``crag.load(path)`` does: read and validate the program file at ``path`` and apply all of it,
    its ``lm_calls`` and ``max_history_turns`` included, to ``crag``; a trained evaluator is loaded from
    beside the file."""
    path = Path(path)
    parameters = [name for name, _ in crag.named_parameters()]
    return apply_program(crag, read_program(path, parameters=parameters), path.parent, keep_app_config=False)


def _load_evaluator(grading: Any, program_dir: Path | str | None) -> RelevanceEvaluator | None:
    """The program's trained evaluator, verified and loaded, or None when it grades with the LLM alone."""
    manifest = grading.get("evaluator") if isinstance(grading, dict) else None
    if manifest is None:
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("path"), str):
        raise ProgramError("program state has a malformed evaluator manifest (needs 'path' and 'files')")
    if program_dir is None:
        raise ProgramError(
            "this program grades with a trained evaluator: load it from its file (crag.load(path) or "
            "load_program) so that its weights folder can be found"
        )
    name = manifest["path"]
    if Path(name).name != name or name in ("", ".", ".."):
        raise ProgramError(f"program names an evaluator folder outside its own folder: {name!r}")
    try:
        return RelevanceEvaluator.load(Path(program_dir) / name, manifest.get("files") or {})
    except EvaluatorError as exc:
        raise ProgramError(f"program's trained evaluator is not usable: {exc}") from exc
