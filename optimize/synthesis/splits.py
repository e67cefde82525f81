"""Which split each source document feeds: whole documents, so that no document feeds two splits.

A question's split is its source document's; its relevance pairs take passages of that split's
documents only, and documents of the test split give no relevance pairs at all (the grader is never
trained or tuned on what the test questions come from). The order is a seeded hash of each
document's key, so adding a document never moves another one, and documents that already fed
synthetic items keep the split they fed (``fixed``).

>>> assign_splits(["a", "b", "c", "d"], seed=0)
{'d': 'val', 'c': 'test', 'a': 'train', 'b': 'train'}
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

__all__ = ["QA_SPLITS", "RELEVANCE_SPLITS", "SPLIT_SHARES", "assign_splits", "split_quotas"]

SPLIT_SHARES = {"val": 0.25, "test": 0.25, "train": 0.5}
"""Share of the documents per split (the bundled default domain has 43% / 30% / 27% train / val / test
questions); val and test come first so that with few documents each still gets one."""
QA_SPLITS = ("train", "val", "test")
RELEVANCE_SPLITS = ("train", "val")


def split_quotas(documents: int) -> dict[str, int]:
    """How many of ``documents`` each split gets: at least one each when there are enough documents
    (three; with two, train and val; with one, train)."""
    if documents >= len(SPLIT_SHARES):
        val = max(1, round(documents * SPLIT_SHARES["val"]))
        test = max(1, round(documents * SPLIT_SHARES["test"]))
        return {"val": val, "test": test, "train": documents - val - test}
    return {"train": documents} if documents <= 1 else {"val": 1, "test": 0, "train": documents - 1}


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}\x00{key}".encode()).hexdigest()


def assign_splits(keys: Sequence[str], seed: int, fixed: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each document key's split: ``fixed`` ones as given, the others in seeded hash order into the
    splits with room left (:func:`split_quotas` of all keys), val first, then test, then train."""
    fixed = {k: s for k, s in (fixed or {}).items() if k in set(keys)}
    room = split_quotas(len(set(keys)))
    for split in fixed.values():
        room[split] = room.get(split, 0) - 1
    out = dict(fixed)
    for key in sorted(set(keys) - fixed.keys(), key=lambda k: _rank(seed, k)):
        out[key] = next((s for s in SPLIT_SHARES if room.get(s, 0) > 0), "train")
        room[out[key]] = room.get(out[key], 0) - 1
    return out
