"""How a CRAG program is saved and loaded: DSPy's own save/load, with the config in the state."""

from __future__ import annotations

from typing import Any, Self

import dspy

from .config import CRAGConfig
from .program_file import ADDED_PREDICTORS

__all__ = ["SavedAsProgram"]


def _saved_fields_by_name(module: dspy.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each predictor's saved signature fields in the order its signature has now.

    DSPy restores a signature's fields by position, so a program saved before a signature's inputs were
    reordered (the answerer's context now comes before its question) would give each field the other's
    description. Saved fields are matched to the current ones by their prefix ("Question:"), which DSPy
    derives from the field's name; a predictor whose prefixes do not match one to one (an optimizer
    rewrote one) keeps DSPy's positional order.
    """
    reordered = dict(state)
    for name, predictor in module.named_predictors():
        entry = state.get(name)
        signature = entry.get("signature") if isinstance(entry, dict) else None
        saved = signature.get("fields") if isinstance(signature, dict) else None
        if not isinstance(saved, list) or not all(isinstance(f, dict) for f in saved):
            continue  # DSPy's own load reports a malformed state
        current = [f.json_schema_extra["prefix"] for f in predictor.signature.fields.values()]
        by_prefix = {f.get("prefix"): f for f in saved}
        if len(by_prefix) == len(saved) and sorted(by_prefix, key=str) == sorted(current):
            fields = [by_prefix[prefix] for prefix in current]
            reordered[name] = {**entry, "signature": {**signature, "fields": fields}}
    return reordered


def _with_added_predictors(module: dspy.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the current state of each of :data:`ADDED_PREDICTORS` it predates."""
    missing = {
        name: predictor.dump_state()
        for name, predictor in module.named_predictors()
        if name in ADDED_PREDICTORS and name not in state
    }
    return {**state, **missing} if missing else state


class SavedAsProgram:
    """The state methods of :class:`~crag_dspy.module.CRAG` (a DSPy module with ``config`` and
    ``thresholds``): DSPy's JSON state with the config in it, written and read as a program file
    (:mod:`crag_dspy.program_file`), never pickled."""

    config: CRAGConfig
    thresholds: Any

    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        """Every parameter's DSPy state and, under ``config``, the :class:`~crag_dspy.config.CRAGConfig`
        with the (lower, upper) the thresholds route with. DSPy's ``save`` writes this."""
        state = super().dump_state(json_mode=json_mode)
        config = self.config.replace(lower=self.thresholds.lower, upper=self.thresholds.upper)
        state["config"] = config.model_dump(mode="json" if json_mode else "python")
        return state

    def load_state(self, state: dict[str, Any], *, allow_unsafe_lm_state: bool = False) -> Self:
        """Apply a :meth:`dump_state`: its ``config`` (validated), then every parameter's state. Raises
        (pydantic's ValidationError for a bad config) and leaves the module as it was on any error."""
        if allow_unsafe_lm_state:
            raise ValueError("a CRAG program never carries an LM: there is no LM state to allow")
        if "config" not in state:
            raise ValueError("a CRAG state holds its 'config' (written by CRAG.dump_state)")
        config = CRAGConfig.model_validate(state["config"])
        previous, thresholds = self.config, self.thresholds.dump_state()
        self.config = config
        try:
            # DSPy's load_state does a trial run on a copy first: a bad parameter state raises untouched.
            super().load_state(_saved_fields_by_name(self, _with_added_predictors(self, state)))
        except Exception:
            self.config = previous
            self.thresholds.load_state(thresholds)
            raise
        return self

    def save(self, path: Any, save_program: bool = False, modules_to_serialize: Any = None) -> None:
        """Write the program file (:mod:`crag_dspy.program`): DSPy's JSON save format with the config and
        crag-dspy's metadata; a trained evaluator's weights go to a folder beside it. JSON only: a
        program is never pickled, so ``save_program=True`` is refused."""
        from . import program_file as program

        if save_program or modules_to_serialize:
            raise program.ProgramError(
                "CRAG programs are saved as JSON state only (crag.save('program.json'))"
            )
        program.save_program(self, path)

    def load(self, path: Any, allow_pickle: bool = False, allow_unsafe_lm_state: bool = False) -> Self:
        """Load a program file written by :meth:`save` or ``python -m optimize.compile``: validated
        (format version, config, state) before anything is applied, config included; a trained
        evaluator is loaded from beside the file. Raises :class:`~crag_dspy.program.ProgramError`."""
        from . import program_file as program

        if allow_pickle or allow_unsafe_lm_state:
            raise program.ProgramError(
                "CRAG programs are JSON and never carry an LM: nothing unsafe to allow"
            )
        return program.load_into(self, path)
