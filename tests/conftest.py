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
