"""Evaluation through the per-head KV cache (passkey retrieval, perplexity), and where retrieval happens.

Names load on first use (PEP 562): `ROW_NAMES` imports without the evaluation's machinery, so the
CLI's `--help` names the rows without loading a model's."""

from __future__ import annotations

import importlib
from typing import Any

# The built-in evaluation rows, in the order tables list them; row_kinds.py registers one kind per name.
ROW_NAMES = ("full", "duo", "streaming", "h2o", "random", "snapkv", "mix")

_EXPORTS = {  # public name -> the module that defines it
    "passkey_retrieval": ("PasskeyEvalConfig", "PasskeyRow", "evaluate_passkey"),
    "perplexity": ("PerplexityConfig", "PerplexityRow", "evaluate_perplexity"),
    "retrieval_heads": ("find_retrieval_heads", "flat_indices", "needle_attention", "top_heads"),
    "row_kinds": ("ROWS", "register_row"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_MODULE_OF, "ROW_NAMES"])


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value
