import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/fakes.py


@pytest.fixture(scope="session")
def embedder():
    from crag_dspy.embeddings import Embedder

    return Embedder()
