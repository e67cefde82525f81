"""The public API type-checks (issue 61): mypy on ``crag_dspy/__init__.py`` and on a user's code over its
exports (tests/fixtures/public_api_usage.py), with the package's ``py.typed`` (test_packaging.py checks
the wheel ships it). mypy is in the test extra, so CI runs it; skipped where it is not installed."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_public_api_type_checks_as_a_user_uses_it():
    pytest.importorskip("mypy")
    files = ["crag_dspy/__init__.py", "tests/fixtures/public_api_usage.py"]
    # pyproject's [tool.mypy]; its cache keeps a rerun to seconds (the first run reads dspy's sources).
    out = subprocess.run(
        [sys.executable, "-m", "mypy", *files], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found in 2 source files" in out.stdout
