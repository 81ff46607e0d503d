"""Synthetic passkey data: one generator for calibration and for evaluation.

The names below load on first use, so that light modules of this package (prompt kinds, needle values) can be
imported without the passkey generator's torch (the command line starts without torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_EXPORTS = {
    "duocal.data.filler": ("SyntheticFiller",),
    "duocal.data.haystack": ("Haystack", "load_haystack"),
    "duocal.data.passkey": (
        "IGNORE_INDEX",
        "Answer",
        "Needle",
        "PasskeyGenerator",
        "PasskeySample",
        "TokenKind",
        "collate",
    ),
    "duocal.data.passkey_formats": ("FORMATS", "PasskeyFormat", "get_format"),
}
_LAZY_MODULE_OF = {name: module for module, names in _LAZY_EXPORTS.items() for name in names}
__all__ = sorted(_LAZY_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _LAZY_MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_MODULE_OF[name]), name)
    globals()[name] = value
    return value
