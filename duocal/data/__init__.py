"""Synthetic passkey data: one generator for calibration and for evaluation."""

from duocal.data.filler import SyntheticFiller
from duocal.data.haystack import Haystack, load_haystack
from duocal.data.passkey import (
    IGNORE_INDEX,
    Answer,
    Needle,
    PasskeyGenerator,
    PasskeySample,
    TokenKind,
    collate,
)
from duocal.data.passkey_formats import FORMATS, PasskeyFormat, get_format

__all__ = [
    "FORMATS",
    "IGNORE_INDEX",
    "Answer",
    "Haystack",
    "Needle",
    "PasskeyFormat",
    "PasskeyGenerator",
    "PasskeySample",
    "SyntheticFiller",
    "TokenKind",
    "collate",
    "get_format",
    "load_haystack",
]
