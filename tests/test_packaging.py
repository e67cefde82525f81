"""The wheel a non-editable ``pip install .`` builds: every package, and the bundled domains as package data."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    # Built from a copy: setuptools builds in the source tree (build/, *.egg-info), which must stay clean.
    source, out = tmp_path_factory.mktemp("source") / "crag-dspy", tmp_path_factory.mktemp("wheel")
    # Only what the build reads (a checkout may hold .venv/ and runs/).
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("crag_dspy", "optimize", "signatures", "data"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-qw", str(out), source],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("crag_dspy-*.whl")
    return zipfile.ZipFile(path)


@pytest.fixture(scope="module")
def wheel_files(wheel) -> set[str]:
    return set(wheel.namelist())


def test_the_wheel_holds_every_bundled_domain_file(wheel_files):
    domains = sorted(p for p in (ROOT / "data").iterdir() if p.is_dir())
    assert {"default", "transit"} <= {d.name for d in domains}  # and any domain added later
    for domain in domains:
        for path in sorted(domain.iterdir()):
            if path.is_file():
                assert f"crag_dspy/bundled/{domain.name}/{path.name}" in wheel_files, path
    for name in ("corpus.jsonl", "web.jsonl", "qa.jsonl", "domain.toml", "program.json"):
        assert f"crag_dspy/bundled/default/{name}" in wheel_files


def test_the_wheel_holds_every_package(wheel_files):
    packages = [
        p.parent.relative_to(ROOT)
        for p in ROOT.glob("*/**/__init__.py")
        if p.parts[len(ROOT.parts)] in ("crag_dspy", "optimize", "signatures")
    ]
    assert len(packages) >= 6
    for package in packages:
        assert f"{package.as_posix()}/__init__.py" in wheel_files, (
            f"{package}: add it to pyproject's packages"
        )
    assert "crag_dspy/serve/static/index.html" in wheel_files
    assert "crag_dspy/instruction_weights.json" in wheel_files  # the grounding check's classifier
    assert "crag_dspy/py.typed" in wheel_files  # PEP 561: type checkers read the annotations


def test_the_console_script_is_the_one_command_over_every_subcommand(wheel):
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    entry_points = wheel.read(name).decode()
    assert "crag-dspy = crag_dspy.console:main" in entry_points
