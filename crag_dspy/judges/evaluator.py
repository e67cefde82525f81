"""The trained retrieval evaluator: a cross-encoder fine-tuned from a local BERT-style encoder folder.

The CRAG paper's evaluator is a fine-tuned T5-large (84.3% on PopQA against 58-65% for prompted
ChatGPT). Its counterpart here starts from the bundled all-MiniLM-L6-v2 encoder (or any local
BERT-style folder), gets a fresh one-logit head, and is trained with BCE on a domain's labelled
(question, passage) pairs. Nothing is downloaded: every load is ``local_files_only`` and only
safetensors weights are ever read. Scoring the k passages of a question is one batched forward pass.

Weights are written as a folder next to the program JSON; :func:`weights_manifest` records each file's
size and sha256 so that loading refuses missing, altered or foreign weights (:func:`verify_folder`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..embeddings import quiet_model_loading

__all__ = [
    "ENCODER_TYPES",
    "EvaluatorError",
    "RelevanceEvaluator",
    "TrainingConfig",
    "TrainingReport",
    "check_encoder_folder",
    "length_batches",
    "native_bf16",
    "train_evaluator",
    "verify_folder",
    "weights_manifest",
]

log = logging.getLogger(__name__)

# Encoder-only model families with a sequence-classification head in transformers: "BERT-style".
ENCODER_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta", "deberta-v2", "mpnet", "albert"}
)
# The files a saved evaluator consists of; anything else in its folder (a pickle) is refused.
_WEIGHTS_FILE = "model.safetensors"
_ALLOWED_SUFFIXES = (".json", ".txt", ".safetensors", ".model")


class EvaluatorError(ValueError):
    """The evaluator cannot be built, trained, loaded or verified; the message names the file or cause."""


class TrainingConfig(BaseModel):
    """How the evaluator is fine-tuned. Defaults measured on popqa-dev and the bundled default domain
    (docs/evaluator.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    learning_rate: float = Field(1.5e-4, gt=0, le=1e-2)
    max_epochs: int = Field(3, ge=1, le=50)
    patience: int = Field(
        1, ge=1, description="epochs in a row without a better held-out AUC that stop training"
    )
    batch_size: int = Field(16, ge=1, le=512)
    max_length: int = Field(256, ge=16, le=512, description="tokens of question + passage")
    warmup: float = Field(0.1, ge=0, lt=1, description="share of steps with a rising learning rate")
    seed: int = 0
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's own)")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="training arithmetic: bf16 autocast with fp32 weights, or fp32; auto takes bf16 "
        "where the CPU computes it natively (AVX512-BF16 or AMX). Scoring is always fp32.",
    )
    bucket_batches: int = Field(
        4,
        ge=1,
        description="batches whose pairs are drawn together and grouped by length, so a batch pads to "
        "similar lengths; 1 keeps the plain shuffled order. Wider windows train faster but rank "
        "slightly worse (docs/evaluator.md)",
    )
    frozen_layers: int = Field(
        3,
        ge=0,
        description="the embeddings and this many of the lowest encoder layers keep their loaded weights; "
        "their outputs are computed once and every epoch trains only the layers above (at most all but "
        "one layer; 0 fine-tunes everything). Applies to encoders whose layers can run apart (BERT-like); "
        "others train whole",
    )


@dataclass
class TrainingReport:
    """What training did: per-epoch held-out AUC and loss, the epoch kept, time, data sizes and precision."""

    train_pairs: int
    holdout_pairs: int
    epochs: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    seconds: float = 0.0
    precision: str = "fp32"
    frozen_layers: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "train_pairs": self.train_pairs,
            "holdout_pairs": self.holdout_pairs,
            "epochs": self.epochs,
            "best_epoch": self.best_epoch,
            "seconds": round(self.seconds, 1),
            "precision": self.precision,
            "frozen_layers": self.frozen_layers,
        }


def _torch():
    import torch

    return torch


def native_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX tiles)."""
    cpu = _torch().cpu
    return any(
        bool(getattr(cpu, probe, lambda: False)())
        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


def length_batches(
    lengths: Sequence[int], batch_size: int, bucket_batches: int, rng: random.Random
) -> list[list[int]]:
    """One epoch's batches of indices into ``lengths``: shuffled, then grouped by length.

    The shuffled order is cut into windows of ``bucket_batches`` batches; each window is sorted by
    length and cut into batches, and all batches are shuffled. A batch is padded to its longest pair,
    and passages vary from 20 to 256 tokens, so fewer padding tokens are computed, while every batch
    still mixes pairs from a random window of the data.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * bucket_batches
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    if bucket_batches > 1:
        rng.shuffle(batches)
    return batches


def check_encoder_folder(folder: Path) -> dict[str, Any]:
    """The config of a local BERT-style encoder folder with safetensors weights; raises
    :class:`EvaluatorError` saying what the folder lacks."""
    config_path = folder / "config.json"
    if not folder.is_dir():
        raise EvaluatorError(f"{folder}: no such model folder")
    if not config_path.is_file():
        raise EvaluatorError(f"{folder}: not a transformers model folder (no config.json)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvaluatorError(f"{config_path}: unreadable model config ({exc})") from None
    model_type = config.get("model_type")
    if model_type not in ENCODER_TYPES or config.get("is_decoder"):
        raise EvaluatorError(
            f"{folder}: model type {model_type!r} is not a BERT-style encoder; the evaluator is trained "
            f"from an encoder folder ({', '.join(sorted(ENCODER_TYPES))})"
        )
    if not (folder / _WEIGHTS_FILE).is_file():
        raise EvaluatorError(f"{folder}: no {_WEIGHTS_FILE} (only safetensors weights are loaded)")
    return config


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """``{file name: {"bytes": size, "sha256": digest}}`` for every file of a saved evaluator folder."""
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def verify_folder(folder: Path, manifest: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`EvaluatorError` naming the first file that is missing, altered or unexpected."""
    if not folder.is_dir():
        raise EvaluatorError(f"{folder}: the evaluator's weights folder is missing")
    if _WEIGHTS_FILE not in manifest:
        raise EvaluatorError(f"{folder}: the manifest lists no {_WEIGHTS_FILE}")
    for name in sorted(manifest):
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(_ALLOWED_SUFFIXES):
            raise EvaluatorError(f"{folder}: the manifest names a file the evaluator never loads: {name!r}")
    present = {p.name for p in folder.iterdir() if p.is_file()}
    for name in sorted(present - manifest.keys()):
        raise EvaluatorError(f"{folder / name}: a file the program does not list (refused, never loaded)")
    for name, expected in sorted(manifest.items()):
        path = folder / name
        if not path.is_file():
            raise EvaluatorError(f"{path}: missing (the program lists it)")
        if path.stat().st_size != expected.get("bytes") or _sha256(path) != expected.get("sha256"):
            raise EvaluatorError(
                f"{path}: altered or foreign weights (size or sha256 differs from the program)"
            )


class RelevanceEvaluator:
    """A cross-encoder scoring (question, passage) pairs; :meth:`logits` are its raw relevance scores.

    Inference is thread-safe (no state changes); one instance is shared by copies of a program.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_length: int, base_model: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.base_model = base_model

    @classmethod
    def from_base(cls, folder: Path | str, *, max_length: int = 256, seed: int = 0) -> RelevanceEvaluator:
        """A new evaluator: the encoder in ``folder`` with a fresh, seeded one-logit head."""
        folder = Path(folder)
        check_encoder_folder(folder)
        torch = _torch()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.manual_seed(seed)
        try:
            with quiet_model_loading():
                model = AutoModelForSequenceClassification.from_pretrained(
                    folder, num_labels=1, local_files_only=True, use_safetensors=True
                )
                tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # transformers raises many types; one error names the folder
            raise EvaluatorError(
                f"{folder}: cannot load the base encoder ({type(exc).__name__}: {exc})"
            ) from exc
        return cls(model, tokenizer, max_length=max_length, base_model=folder.name)

    @classmethod
    def load(
        cls, folder: Path | str, manifest: dict[str, dict[str, Any]] | None = None
    ) -> RelevanceEvaluator:
        """Load a saved evaluator; with ``manifest``, verify every file first (nothing is half-loaded)."""
        folder = Path(folder)
        if manifest is not None:
            verify_folder(folder, manifest)
        config = check_encoder_folder(folder)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            with quiet_model_loading():
                model = AutoModelForSequenceClassification.from_pretrained(
                    folder, local_files_only=True, use_safetensors=True
                )
                tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except Exception as exc:  # transformers raises many types; one error names the folder
            raise EvaluatorError(
                f"{folder}: cannot load the evaluator ({type(exc).__name__}: {exc})"
            ) from exc
        crag = config.get("crag_dspy", {})
        return cls(
            model,
            tokenizer,
            max_length=int(crag.get("max_length", 256)),
            base_model=crag.get("base_model", ""),
        )

    def save(self, folder: Path | str) -> dict[str, dict[str, Any]]:
        """Write safetensors weights, config and tokenizer into ``folder`` (replaced whole); returns
        the manifest."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if old.is_file():
                old.unlink()
        self.model.config.crag_dspy = {"max_length": self.max_length, "base_model": self.base_model}
        with quiet_model_loading():
            self.model.save_pretrained(folder, safe_serialization=True)
            self.tokenizer.save_pretrained(folder)
        return weights_manifest(folder)

    def _batch(self, questions: Sequence[str], passages: Sequence[str]):
        return self.tokenizer(
            list(questions),
            list(passages),
            truncation="only_second",
            max_length=self.max_length,
            padding=True,
            return_tensors="pt",
        )

    def logits(self, pairs: Sequence[tuple[str, str]], *, batch_size: int = 32) -> list[float]:
        """The raw relevance logit of each (question, passage) pair, in batches of ``batch_size``."""
        torch = _torch()
        # Longest first, so each batch pads to similar lengths; the k passages of one question fit one batch.
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        out: list[float] = [0.0] * len(pairs)
        with torch.inference_mode():
            for i in range(0, len(order), batch_size):
                chunk = order[i : i + batch_size]
                batch = self._batch([pairs[j][0] for j in chunk], [pairs[j][1] for j in chunk])
                for j, logit in zip(chunk, self.model(**batch).logits.squeeze(-1).tolist()):
                    out[j] = float(logit)
        return out

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the weights: two evaluators with equal fingerprints score identically."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def __deepcopy__(self, memo: dict) -> RelevanceEvaluator:
        return self  # immutable at inference time: programs' copies share the weights


def _auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    from sklearn.metrics import roc_auc_score

    if len(set(labels)) < 2:
        return None
    return float(roc_auc_score(labels, scores))


def train_evaluator(
    train: Sequence[tuple[str, str, int]],
    holdout: Sequence[tuple[str, str, int]],
    *,
    base: Path | str,
    config: TrainingConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[RelevanceEvaluator, TrainingReport]:
    """Fine-tune a cross-encoder from ``base`` on labelled (question, passage, label) ``train`` pairs.

    After every epoch the held-out AUC is measured; training stops after ``config.patience`` epochs
    without a better one, and the weights of the best epoch are kept. Batches group pairs of similar
    length (:func:`length_batches`) and, where the CPU has native bf16, run under bf16 autocast
    (``config.precision``). The embeddings and the lowest ``config.frozen_layers`` layers keep their
    weights; their outputs are computed once, so an epoch runs only the layers above
    (``TrainingReport.frozen_layers`` says how many were frozen). Seeded and deterministic on CPU.
    ``progress(done_steps, total_steps)`` is called after every step.
    """
    config = config or TrainingConfig()
    labels = [int(y) for _, _, y in train]
    positives = sum(labels)
    if not train or positives in (0, len(labels)):
        raise EvaluatorError(
            f"training needs positive and negative pairs, got {positives} positive of {len(labels)}"
        )
    holdout_labels = [int(y) for _, _, y in holdout]
    if len(set(holdout_labels)) < 2:
        raise EvaluatorError("the held-out pairs need both labels to choose the epoch")
    torch = _torch()
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _train(train, holdout, labels, base, config, progress)
    finally:
        torch.set_num_threads(threads)  # the caller's setting, whatever this training used


def _train(
    train: Sequence[tuple[str, str, int]],
    holdout: Sequence[tuple[str, str, int]],
    labels: list[int],
    base: Path | str,
    config: TrainingConfig,
    progress: Callable[[int, int], None] | None,
) -> tuple[RelevanceEvaluator, TrainingReport]:
    torch = _torch()
    positives = sum(labels)
    holdout_labels = [int(y) for _, _, y in holdout]
    started = time.perf_counter()
    evaluator = RelevanceEvaluator.from_base(base, max_length=config.max_length, seed=config.seed)
    model = evaluator.model
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    bf16 = config.precision == "bf16" or (config.precision == "auto" and native_bf16())
    report = TrainingReport(
        train_pairs=len(train), holdout_pairs=len(holdout), precision="bf16" if bf16 else "fp32"
    )
    holdout_pairs = [(q, p) for q, p, _ in holdout]
    lengths = [
        len(ids)
        for ids in evaluator.tokenizer(
            [q for q, _, _ in train],
            [p for _, p, _ in train],
            truncation="only_second",
            max_length=config.max_length,
        )["input_ids"]
    ]
    split = _SplitEncoder.of(evaluator, config.frozen_layers, holdout_pairs[:4])
    features = split.lower_outputs(evaluator, train, lengths, bf16) if split else None
    report.frozen_layers = split.frozen if split else 0

    def inputs(idx: list[int]) -> dict[str, Any]:
        if features is None:
            return dict(evaluator._batch([train[j][0] for j in idx], [train[j][1] for j in idx]))
        return _padded([features[j] for j in idx])

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.01)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    total = steps_per_epoch * config.max_epochs
    warmup = max(1, int(total * config.warmup))

    def schedule(step: int) -> float:
        return (step + 1) / warmup if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    # Balanced loss: most retrieved passages are negatives (70% of popqa-dev's train pairs).
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(labels) - positives) / positives))
    best_auc, best_state, stale, step = -1.0, None, 0, 0
    for epoch in range(1, config.max_epochs + 1):
        model.train()
        running = 0.0
        with split.upper_only() if split else contextlib.nullcontext():
            for idx in length_batches(lengths, config.batch_size, config.bucket_batches, rng):
                target = torch.tensor([float(labels[j]) for j in idx])
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(**inputs(idx)).logits.squeeze(-1)
                loss = loss_fn(logits.float(), target)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                running += loss.item() * len(idx)
                step += 1
                if progress is not None:
                    progress(step, total)
        model.eval()
        auc = _auc(evaluator.logits(holdout_pairs), holdout_labels) or 0.0
        report.epochs.append(
            {"epoch": epoch, "train_loss": round(running / len(train), 4), "holdout_auc": round(auc, 4)}
        )
        log.info("evaluator epoch %d: train loss %.4f, held-out AUC %.4f", epoch, running / len(train), auc)
        if auc > best_auc:
            best_auc, best_state, stale = auc, copy.deepcopy(model.state_dict()), 0
            report.best_epoch = epoch
        else:
            stale += 1
            if stale >= config.patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    report.seconds = time.perf_counter() - started
    return evaluator, report


def _padded(rows: Sequence[Any]) -> dict[str, Any]:
    """Hidden-state rows of different lengths as one zero-padded batch with its attention mask."""
    torch = _torch()
    longest = max(len(r) for r in rows)
    states = torch.zeros(len(rows), longest, rows[0].shape[-1])
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        states[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return {"inputs_embeds": states, "attention_mask": mask}


@functools.cache
def _passthrough_type() -> type:
    class Passthrough(_torch().nn.Module):
        """Stands in for the embeddings while the upper layers train: their input is already hidden states."""

        def forward(self, *args: Any, inputs_embeds: Any = None, **kwargs: Any) -> Any:
            return inputs_embeds

    return Passthrough


@dataclass
class _SplitEncoder:
    """A classifier whose encoder runs as two stacks: the frozen lower layers (with the embeddings),
    whose outputs are computed once, and the trained upper ones. An epoch then costs only the upper
    layers' forward and backward passes."""

    base: Any
    layers: Any
    frozen: int

    @classmethod
    def of(
        cls, evaluator: RelevanceEvaluator, frozen: int, probe: Sequence[tuple[str, str]]
    ) -> _SplitEncoder | None:
        """The split with ``frozen`` layers below (at most all but one), or None: nothing to freeze, or
        an encoder whose stacks do not reproduce the whole model on ``probe`` (e.g. ALBERT's shared
        layers, DistilBERT's layout, ELECTRA's projection)."""
        model = evaluator.model
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        layers = getattr(getattr(base, "encoder", None), "layer", None)
        if (
            not frozen
            or base is None
            or not hasattr(base, "embeddings")
            or not isinstance(layers, _torch().nn.ModuleList)
            or len(layers) < 2
        ):
            return None
        split = cls(base, layers, min(frozen, len(layers) - 1))
        batch = evaluator._batch([q for q, _ in probe], [p for _, p in probe])
        torch = _torch()
        with torch.inference_mode():
            whole = model.eval()(**batch).logits
            try:
                lower = split._lower(batch)
                with split.upper_only():
                    apart = model(inputs_embeds=lower, attention_mask=batch["attention_mask"]).logits
                same = torch.allclose(whole, apart, atol=1e-4)
            except (RuntimeError, TypeError, ValueError) as exc:  # a layout this split does not fit
                log.info("evaluator: %s's layers cannot run apart (%s)", type(model).__name__, exc)
                same = False
        if not same:
            log.info(
                "evaluator: %s's stacks differ from the whole model; every layer is trained",
                type(model).__name__,
            )
            return None
        for module in (base.embeddings, *layers[: split.frozen]):
            module.requires_grad_(False)
        return split

    @contextlib.contextmanager
    def _running(self, layers: Any, embeddings: Any = None):
        """While inside, the base model runs only ``layers`` (and, given, ``embeddings`` instead of its own)."""
        saved = self.base.embeddings, self.base.encoder.layer
        self.base.encoder.layer = layers
        if embeddings is not None:
            self.base.embeddings = embeddings
        try:
            yield
        finally:
            self.base.embeddings, self.base.encoder.layer = saved

    def _lower(self, batch: Any) -> Any:
        with self._running(self.layers[: self.frozen]):
            return self.base(**batch).last_hidden_state

    def lower_outputs(
        self,
        evaluator: RelevanceEvaluator,
        pairs: Sequence[tuple[str, str, int]],
        lengths: Sequence[int],
        bf16: bool,
    ) -> list[Any]:
        """Each pair's hidden states after the frozen layers (unpadded), as the training's precision
        computes them."""
        torch = _torch()
        out: list[Any] = [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: lengths[i])
        self.base.eval()
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for start in range(0, len(order), 64):
                idx = order[start : start + 64]
                states = self._lower(evaluator._batch([pairs[j][0] for j in idx], [pairs[j][1] for j in idx]))
                for row, j in enumerate(idx):
                    out[j] = states[row, : lengths[j]].clone()
        return out

    def upper_only(self) -> contextlib.AbstractContextManager[None]:
        """While inside, the model reads hidden states (``inputs_embeds``) and runs the upper layers only."""
        return self._running(self.layers[self.frozen :], _passthrough_type()())
