"""Evaluation through the per-head KV cache (passkey retrieval, perplexity), and where retrieval happens.

Names load on first use (PEP 562): the torch-free modules of this package (row_names.py) import
without the evaluation's machinery."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # public name -> the module that defines it
    "passkey_retrieval": ("PasskeyEvalConfig", "PasskeyRow", "evaluate_passkey"),
    "perplexity": ("PerplexityConfig", "PerplexityRow", "evaluate_perplexity"),
    "retrieval_heads": ("find_retrieval_heads", "flat_indices", "needle_attention", "top_heads"),
    "row_kinds": ("ROWS", "register_row"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
