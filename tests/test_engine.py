"""The engine-build check: parsing llama.cpp's system info and /proc/cpuinfo, and when to suggest a rebuild."""

from __future__ import annotations

import platform

import pytest
from fakes import compile_report

from crag_dspy.lm.engine import (
    EngineBuild,
    cpu_flags,
    describe_engine,
    engine_features,
    native_build_command,
    unused_cpu_features,
)
from optimize.report import write_report

# What the PyPI wheel printed on the project's machine, and what a native build prints there.
WHEEL = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
NATIVE = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
EPYC = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512vbmi avx512_vnni avx512_bf16\n"
OLD_XEON = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"


def test_engine_features_reads_the_enabled_ones():
    assert engine_features(WHEEL) == {
        "SSE3",
        "SSSE3",
        "AVX",
        "AVX2",
        "F16C",
        "FMA",
        "BMI2",
        "LLAMAFILE",
        "OPENMP",
        "REPACK",
    }
    assert "AVX512_VNNI" in engine_features(NATIVE)
    assert engine_features("CPU : AVX = 1 | AVX512 = 0 | ") == {"AVX"}
    assert engine_features("") == set()


def test_cpu_flags():
    assert {"avx512f", "avx512_vnni", "avx2"} <= cpu_flags(EPYC)
    assert cpu_flags("processor\t: 0\nmodel name\t: something\n") == set()


@pytest.mark.parametrize(
    ("system_info", "cpuinfo", "unused"),
    [
        (WHEEL, EPYC, ["AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"]),
        (NATIVE, EPYC, []),  # already built for this CPU
        (WHEEL, OLD_XEON, []),  # the CPU has nothing the wheel lacks
        (WHEEL, "", []),  # CPU unknown: never guess
    ],
)
def test_unused_cpu_features(system_info, cpuinfo, unused):
    assert unused_cpu_features(engine_features(system_info), cpu_flags(cpuinfo)) == unused


def test_hint_only_when_something_is_unused():
    assert EngineBuild("2026.10.1", ("AVX2",), ()).hint is None
    hint = EngineBuild("2026.10.1", ("AVX2",), ("AVX512", "AVX512_VNNI")).hint
    assert "AVX512, AVX512_VNNI" in hint
    assert native_build_command("2026.10.1") in hint


def test_native_build_command_pins_the_installed_version_and_builds_offline():
    command = native_build_command("2026.10.11549")
    assert '"xllamacpp==2026.10.11549"' in command
    assert "--no-binary xllamacpp" in command
    # Both clone sources at build time, which offline machines cannot reach.
    assert "-DLLAMA_LLGUIDANCE=OFF" in command and "-DLLAMA_BUILD_BORINGSSL=OFF" in command
    assert '"xllamacpp"' in native_build_command(None)


def test_describe_engine_compares_the_installed_engine_with_the_cpu(tmp_path):
    xllamacpp = pytest.importorskip("xllamacpp")
    features = engine_features(xllamacpp.get_system_info())
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(EPYC)
    build = describe_engine(cpuinfo, engine="xllamacpp")
    assert build.name == "xllamacpp" and set(build.features) == features
    expected = (
        unused_cpu_features(features, cpu_flags(EPYC))
        if platform.machine().lower() in {"x86_64", "amd64"}
        else []
    )
    assert list(build.unused) == expected
    assert (
        describe_engine(tmp_path / "missing", engine="xllamacpp").unused == ()
    )  # no /proc/cpuinfo: nothing suggested


def test_the_ik_llama_engine_needs_no_rebuild(tmp_path):
    pytest.importorskip("ik_llama_cpp")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(EPYC)
    build = describe_engine(cpuinfo, engine="ik_llama")
    assert build.name == "ik_llama" and build.version
    if platform.machine().lower() in {"x86_64", "amd64"}:
        assert "AVX2" in build.features
    assert build.unused == () and build.hint is None
    assert describe_engine(cpuinfo).name == "ik_llama"  # auto prefers it
    # A hint is only ever about rebuilding xllamacpp.
    assert EngineBuild("0.1.5", ("AVX2",), ("AVX512_VNNI",), "ik_llama").hint is None


def test_report_shows_the_engine_and_its_hint(tmp_path):
    report = compile_report(engine=EngineBuild("2026.10.1", ("AVX", "AVX2"), ("AVX512_VNNI",)).as_dict())
    _, md = write_report(report, tmp_path / "program.json")
    text = md.read_text()
    assert "Engine: xllamacpp 2026.10.1, CPU features AVX, AVX2." in text
    assert "Note: the llama.cpp engine was built without AVX512_VNNI" in text
    report["engine"] = EngineBuild("2026.10.1", ("AVX512_VNNI",), ()).as_dict()
    _, md = write_report(report, tmp_path / "program.json")
    assert "Note:" not in md.read_text()


def test_cli_engine_prints_the_build(capsys):
    xllamacpp = pytest.importorskip("xllamacpp")
    from crag_dspy.cli import main

    assert main(["engine", "--embedded-engine", "xllamacpp"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("xllamacpp ")
    assert "AVX2" in out or not {"AVX2"} & engine_features(xllamacpp.get_system_info())
    build = describe_engine(engine="xllamacpp")
    assert (build.hint or "built for every speed-relevant feature") in out
    if describe_engine(engine="auto").name == "ik_llama":
        assert main(["engine"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("ik_llama ") and "no rebuild needed" in out


def test_cli_engine_without_the_engine_is_a_clear_error(monkeypatch, capsys):
    from crag_dspy.cli import main
    from crag_dspy.lm import embedded

    monkeypatch.setattr(embedded, "find_spec", lambda name: None)  # neither engine installed
    assert main(["engine"]) == 2
    assert "pip install 'crag-dspy[local]'" in capsys.readouterr().err
    assert main(["engine", "--embedded-engine", "ik_llama"]) == 2
    assert "pip install ik-llama-cpp-python" in capsys.readouterr().err
