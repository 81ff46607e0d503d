"""The transformers side of the runtime: `apply` and `Runtime`, the per-head `DuoCache`, the drop-in cache."""
