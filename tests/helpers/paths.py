"""Where the repository and the tests' reference data are."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"  # copies of reference data, with their sources: tests/data/README.md
UPSTREAM_PATTERNS = REPO / "profiles" / "duo-attention"  # shipped with duocal, offline
GOLDEN_H2O = DATA / "golden-h2o"
