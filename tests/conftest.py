import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
UPSTREAM_PATTERNS = SHARED / "upstream-duo-attention"
GOLDEN_H2O = SHARED / "golden-h2o"


def _torch_threads():
    import torch

    torch.set_num_threads(1)


_torch_threads()


@pytest.fixture
def upstream_patterns() -> Path:
    if not UPSTREAM_PATTERNS.is_dir():
        pytest.skip("../shared/upstream-duo-attention is absent (only the project's own data is used here)")
    return UPSTREAM_PATTERNS
