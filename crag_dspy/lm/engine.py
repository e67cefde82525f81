"""Which CPU instructions the embedded llama.cpp engine was built for, next to what this CPU offers.

The xllamacpp wheel on PyPI is built for AVX2 so that it runs on any x86-64 machine of the last decade.
On a CPU with AVX-512 (VNNI) the same engine built for the machine itself evaluates prompts faster
(measured ~1.3x on the project's 2-core machine, ``docs/performance.md``), and prompt evaluation is
where a compile spends its time. Nothing is rebuilt behind the user's back (it takes a compiler and
~8 minutes on 2 cores); the compile report records the engine's build and gives the command when it
would help. The ik_llama engine (the default when installed) needs no rebuild: its AVX2 wheel
already evaluates prompts faster than either xllamacpp build there.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..version import installed_version

__all__ = [
    "EngineBuild",
    "cpu_flags",
    "describe_engine",
    "engine_features",
    "native_build_command",
    "unused_cpu_features",
]

# llama.cpp's name of a feature (as ``get_system_info`` prints it) -> the Linux /proc/cpuinfo flag.
# Only features that speed up its quantized matrix products are listed: those are what a native
# build adds on the CPUs that have them.
SPEEDUPS: dict[str, str] = {
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AVX_VNNI": "avx_vnni",
    "AMX_INT8": "amx_int8",
}


def engine_features(system_info: str) -> set[str]:
    """The features llama.cpp reports as compiled in, from its system-info line
    (``"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | ..."``)."""
    return {name for name, value in re.findall(r"([A-Z][A-Z0-9_]*) = (\d+)", system_info) if value != "0"}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of a Linux ``/proc/cpuinfo`` text (empty when it has none)."""
    match = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    return set(match.group(1).split()) if match else set()


def unused_cpu_features(engine: set[str], cpu: set[str]) -> list[str]:
    """The speed-relevant features this CPU has and the engine was built without, in a stable order."""
    return [name for name, flag in SPEEDUPS.items() if flag in cpu and name not in engine]


def native_build_command(version: str | None) -> str:
    """The pip command that rebuilds the installed xllamacpp for this machine's CPU.

    A source build of xllamacpp targets the building CPU (``GGML_NATIVE``). LLGuidance and BoringSSL are
    switched off because their builds clone sources (github.com, boringssl.googlesource.com), which
    offline machines cannot reach, and the embedded model needs neither (no grammars, loopback HTTP).
    """
    pin = f"xllamacpp=={version}" if version else "xllamacpp"
    return (
        'CMAKE_ARGS="-DLLAMA_LLGUIDANCE=OFF -DLLAMA_BUILD_BORINGSSL=OFF" '
        f'pip install --force-reinstall --no-deps --no-binary xllamacpp "{pin}"'
    )


@dataclass(frozen=True)
class EngineBuild:
    """The engine's compiled-in CPU features, those this CPU would add, and how to get them."""

    version: str | None
    features: tuple[str, ...]
    unused: tuple[str, ...]
    name: str = "xllamacpp"

    @property
    def hint(self) -> str | None:
        """One line for users whose CPU the engine underuses; None when there is nothing to gain."""
        if not self.unused or self.name != "xllamacpp":
            return None
        return (
            f"the llama.cpp engine was built without {', '.join(self.unused)}, which this CPU has; "
            f"a build for this machine evaluates prompts faster (docs/performance.md): "
            f"{native_build_command(self.version)}"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "hint": self.hint}


def _ik_llama_system_info() -> str:
    import ctypes

    from ik_llama_cpp import _ctypes_api

    info = _ctypes_api._lib.llama_print_system_info
    info.argtypes, info.restype = [], ctypes.c_char_p
    return info().decode("utf-8", errors="replace")


def describe_engine(cpuinfo_path: Path = Path("/proc/cpuinfo"), engine: str = "auto") -> EngineBuild | None:
    """The build of the engine that ``engine`` ("auto", "ik_llama", "xllamacpp") selects, or None when
    it is not installed.

    Off Linux (no ``/proc/cpuinfo``) or off x86 the CPU's flags are unknown and nothing is reported as
    unused: a hint must never send a user to a 10-minute build on a guess.
    """
    from .embedded import PACKAGES, resolve_engine
    from .weights import WeightsError

    try:
        name = resolve_engine(engine)
    except WeightsError:
        return None
    version = installed_version(PACKAGES[name])
    if name == "ik_llama":
        return EngineBuild(version, tuple(sorted(engine_features(_ik_llama_system_info()))), (), name)
    import xllamacpp

    features = engine_features(xllamacpp.get_system_info())
    x86 = platform.machine().lower() in {"x86_64", "amd64"}
    try:
        cpu = cpu_flags(cpuinfo_path.read_text(encoding="utf-8", errors="replace")) if x86 else set()
    except OSError:
        cpu = set()
    return EngineBuild(version, tuple(sorted(features)), tuple(unused_cpu_features(features, cpu)))
