"""`key=value` command-line overrides for YAML recipes (torchtune style: `train.steps=100`)."""

from __future__ import annotations

from typing import Any

import yaml


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in `data` (in place) from `key=value` strings; values are parsed as YAML."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value (e.g. train.steps=100)")
        dotted, raw = item.split("=", 1)
        *parents, leaf = dotted.strip().split(".")
        node = data
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {name} is not a section")
            node = child
        node[leaf] = yaml.safe_load(raw)
    return data
