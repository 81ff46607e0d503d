"""Deprecated name of `duocal_runtime.bench.pool_requests` (how many requests a serving pool holds): importing or
running it (`python -m duocal_runtime.bench.pool_capacity`) warns, then does what `pool_requests` does."""

from __future__ import annotations

import warnings

from .pool_requests import held, main, synthetic_profile

__all__ = ["held", "main", "synthetic_profile"]

warnings.warn(
    "duocal_runtime.bench.pool_capacity is deprecated: use duocal_runtime.bench.pool_requests",
    DeprecationWarning,
    stacklevel=1 if __name__ == "__main__" else 2,  # run: shown as __main__'s; imported: at the importer
)

if __name__ == "__main__":
    main()
