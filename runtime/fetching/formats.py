"""The two file layouts a fetched profile can have, and how a location tells which one it is."""

from __future__ import annotations

from ..profile import CONFIG_NAME, TSV_NAME

DUOCAL, UPSTREAM = "duocal", "upstream-duo-attention"
FORMAT_FILES = {
    DUOCAL: ("profile.json",),
    UPSTREAM: (TSV_NAME, CONFIG_NAME),
}


def format_of(path: str) -> str:
    """An upstream pattern is addressed by its `full_attention_heads.tsv` (config.json beside it);
    anything else is a duocal profile."""
    return UPSTREAM if path.endswith(".tsv") else DUOCAL


def upstream_files(tsv: str, folder: str) -> dict[str, str]:
    """Local name -> location of both files of an upstream pattern whose TSV is at `tsv`."""
    return {TSV_NAME: tsv, CONFIG_NAME: f"{folder}/{CONFIG_NAME}"}
