import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"  # copies of reference data, with their sources: tests/data/README.md
UPSTREAM_PATTERNS = DATA / "upstream-duo-attention"
GOLDEN_H2O = DATA / "golden-h2o"


def _torch_threads():
    import torch

    torch.set_num_threads(1)


_torch_threads()


@pytest.fixture
def upstream_patterns() -> Path:
    return UPSTREAM_PATTERNS


@pytest.fixture(scope="module")
def tiny_llama():
    """A random 2-layer Llama in memory (runtime_models.tiny_model), one per test module."""
    from runtime_models import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """A random 2-layer Llama with the demo tokenizer, saved to a folder (runtime_models.save_tiny_model)."""
    from runtime_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="module")
def demo_model():
    """The bundled demo model (eval mode) and its tokenizer, loaded as the CLI loads them, one per test module."""
    from duocal.models import ModelRef

    ref = ModelRef.resolve(None)
    return ref.load_model(), ref.load_tokenizer()
