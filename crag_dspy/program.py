"""Compiled program files (:mod:`crag_dspy.program_file`), read with the module's own checks.

The file format lives in :mod:`crag_dspy.program_file`, which ``CRAG.save`` / ``CRAG.load`` use. Apps
read a file here before they build a module, open a store or start a model: :func:`read_program` also
checks the thresholds as :class:`~crag_dspy.module.Thresholds` does, so a bad file fails first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import field_validator

from . import program_file
from .module import Thresholds
from .program_file import (
    PROGRAM_FORMAT,
    PROGRAM_FORMAT_VERSION,
    FileMetadata,
    ProgramError,
    ProgramMetadata,
    apply_program,
    check_dataset,
    check_domain,
    evaluator_folder,
    load_into,
    program_config,
    program_crag_config,
    read_program_json,
    save_program,
)

__all__ = [
    "PROGRAM_FORMAT",
    "PROGRAM_FORMAT_VERSION",
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


class ProgramFile(program_file.ProgramFile):
    """:class:`crag_dspy.program_file.ProgramFile` with the thresholds in range and ordered, as the
    module's :class:`~crag_dspy.module.Thresholds` requires them."""

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, state: dict[str, Any] | None) -> dict[str, Any] | None:
        if state is not None:
            try:
                Thresholds().load_state(state)  # the module's own check, on a throwaway
            except KeyError as exc:
                raise ValueError(f"{exc} is missing") from None
            except (TypeError, ValueError) as exc:
                raise ValueError(str(exc)) from None
        return state


def read_program(path: Path | str, *, domain: str | None = None) -> dict[str, Any]:
    """Read and validate a program file (:class:`ProgramFile`); with ``domain``, also require that it
    was compiled for it. Returns the validated document as JSON-able dicts, shaped as the file."""
    return program_file.read_program(path, domain=domain, schema=ProgramFile)
