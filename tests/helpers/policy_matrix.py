"""The policies every policy test runs over: one line per policy and storage (kvpress's list of presses in its
tests, default_presses.py, is the model). A new policy, or a new storage of one, is tested everywhere by adding its
line here; tests/runtime/policies/test_policy_matrix.py fails while a registered policy or one of its storages has none.

Sizes are small: the tiny models' prompts (tens of tokens) cross every budget during decode. A test that
needs a subset takes `policy_matrix(...)` with a filter, never a list of its own."""

from __future__ import annotations

import pytest

import duocal_runtime as dr

POLICIES = [
    dr.Full(),
    dr.Full(kv_bits=8, group=8, residual=8),
    dr.Full(kv_bits=4, group=8, residual=8),
    dr.SinkWindow(4, 8),
    dr.SinkWindow(4, 8, positions="cache"),  # StreamingLLM's positions (within the cache)
    dr.H2O(5, 7),
    dr.H2O(5, 7, kv_bits=8, group=8),
    dr.SinkH2O(2, 5, 5),
    dr.SinkH2O(2, 5, 5, kv_bits=4, group=8),
    dr.SnapKV(6, 4),
]


def kv_bits(policy) -> int:
    """Bits per stored key/value element (16: the model's own dtype; a policy without codes stores 16)."""
    return getattr(policy, "kv_bits", 16)


def policy_matrix(
    *,
    bits: int | None = None,
    bounded: bool | None = None,
    quantized: bool | None = None,
    names: tuple[str, ...] = (),
    fields: tuple[str, ...] = (),
    cache_positions: bool | None = None,
):
    """POLICIES as pytest params (id: the policy as written), filtered by storage bits, boundedness, codes
    (kv_bits 8 or 4), name, the size fields a policy has (`fields=("recent",)`: sized by a recent window), or
    whether its heads see positions within their cache."""
    chosen = [
        p
        for p in POLICIES
        if (bits is None or kv_bits(p) == bits)
        and (bounded is None or p.bounded == bounded)
        and (quantized is None or (kv_bits(p) < 16) == quantized)
        and (not names or p.name in names)
        and all(hasattr(p, f) for f in fields)
        and (cache_positions is None or p.cache_positions == cache_positions)
    ]
    assert chosen, "the filter leaves no policy: a test over nothing would pass without testing"
    return [pytest.param(p, id=str(p)) for p in chosen]
