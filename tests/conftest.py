import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/fakes.py


@pytest.fixture(scope="session")
def embedder():
    from crag_dspy.embeddings import Embedder

    return Embedder()


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory):
    """A small random BERT encoder folder with the bundled MiniLM's tokenizer: the evaluator's training
    and loading code runs on it in seconds (quality claims use the real MiniLM, in benchmarks/)."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from crag_dspy.embeddings import bundled_model_path

    folder = tmp_path_factory.mktemp("tiny-encoder")
    source = bundled_model_path()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    return folder
