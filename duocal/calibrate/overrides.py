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
        if not leaf or not all(parents):
            raise ValueError(f"override {item!r} has an empty key part (e.g. train.steps=100)")
        node = data
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: {name} is not a section")
            node = child
        try:
            node[leaf] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problem = str(err).splitlines()[0]
            raise ValueError(
                f"override {item!r}: the value is not valid YAML ({problem}); quote strings, "
                "close brackets (e.g. data.context=[512,1024])"
            ) from None
    return data
