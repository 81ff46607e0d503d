"""Benchmark rows: which cache and plan each row runs, and the state a prompt leaves in it.

| row | cache | attention |
|---|---|---|
| `dynamic` | transformers `DynamicCache` | sdpa (the baseline of every ratio) |
| `static` | transformers `StaticCache` | sdpa, decode compiled |
| `full` | duocal, all heads `full` | duocal |
| `stream50` / `stream75` | duocal, the first 50% / 75% of KV heads sink 64 + recent 256 (whole layers) | duocal |
| `mixed50` / `mixed75` | the same, heads drawn at random (seed 0): layers mix policies, as in real profiles | duocal |
| `h2o50` | duocal, H2O on every head at the KV bytes of `stream50` | duocal |
| `full-kv8` / `full-kv4` / `stream50-kv4` | duocal, full heads in 8- / 4-bit KIVI codes | duocal, blocked over codes |
| `h2o50-kv4` | duocal, `h2o50` with each slot in 4-bit codes of its own token | duocal, slots decoded |
| `quanto4` / `hqq8` / `hqq4` | transformers `QuantizedCache` (quanto / HQQ, residual 128, groups of 32) | sdpa |
| `<row>-compiled` | the duocal row's static cache (`max_length`), decode compiled (16-bit and KIVI rows) | duocal |
"""

from __future__ import annotations

import random

import torch
from transformers import DynamicCache, StaticCache

import duocal_runtime as dr
from duocal_runtime.policies.static_buffers import mark_static
from duocal_runtime.quant import hf_baselines as H
from duocal_runtime.quant.codes import default_group

SINK, RECENT = 64, 256
DUO_ROWS = ("full", "stream50", "stream75", "mixed50", "mixed75", "h2o50")
QUANTIZED_ROWS = ("full-kv8", "full-kv4", "stream50-kv4", "h2o50-kv4", *H.HF_QUANTIZED)
COMPILEABLE_ROWS = (*DUO_ROWS, "full-kv8", "full-kv4", "stream50-kv4", "h2o50-kv4")
ROWS = ("dynamic", "static", *DUO_ROWS, *QUANTIZED_ROWS, *(f"{r}-compiled" for r in COMPILEABLE_ROWS))


def kv_bits_of(row: str) -> tuple[str, int]:
    """'full-kv4' -> ('full', 4); rows without the suffix store 16 bits."""
    base, _, bits = row.partition("-kv")
    return (base, int(bits)) if bits else (row, 16)


def base_row(row: str) -> str:
    return row.removesuffix("-compiled")


def is_compiled(row: str) -> bool:
    return row == "static" or row.endswith("-compiled")


def row_plan(row: str, shape: dr.ModelShape, context: int) -> dr.Plan | None:
    """The plan of a duocal row (None for transformers' caches). Random weights: any head choice is as good."""
    row, bits = kv_bits_of(base_row(row))
    if bits != 16 and row != "h2o50":
        return dr.with_kv_bits(row_plan(row, shape, context), bits)
    sink_window = dr.SinkWindow(SINK, RECENT)
    if row == "full":
        return dr.uniform_plan(shape, dr.Full())
    if row in ("stream50", "stream75", "mixed50", "mixed75"):
        count = shape.num_kv_heads_total * int(row[-2:]) // 100
        heads = (
            range(count)
            if row.startswith("stream")
            else random.Random(0).sample(range(shape.num_kv_heads_total), count)
        )
        return dr.plan_from_bounded_set(shape, set(heads), sink_window)
    if row == "h2o50":
        capacity = (context + sink_window.capacity) // 2  # per head: the mean of full and streaming
        quantized = {} if bits == 16 else {"kv_bits": bits, "group": default_group(shape.head_dim)}
        return dr.uniform_plan(shape, dr.H2O.halves(capacity, **quantized))
    if row in ("dynamic", "static", *H.HF_QUANTIZED):
        return None
    raise ValueError(f"unknown row {row!r}; choose from {', '.join(ROWS)}")


def size_reference(row: str, shape: dr.ModelShape) -> dr.Plan:
    """What a transformers row's bytes are compared with: every head full, in our codes at the
    QuantizedCache row's bits (16 for DynamicCache and StaticCache)."""
    full = dr.uniform_plan(shape, dr.Full())
    return dr.with_kv_bits(full, H.bits_of(row)) if row in H.HF_QUANTIZED else full


def new_cache(row: str, model, runtime, max_length: int):
    """A fresh cache for the row; static rows hold `max_length` positions."""
    if row == "dynamic":
        return DynamicCache(config=model.config)
    if row == "static":
        return StaticCache(config=model.config, max_cache_len=max_length)
    if row in H.HF_QUANTIZED:
        return H.quantized_cache(row, model.config)
    return runtime.new_cache(max_length=max_length if is_compiled(row) else None)


def fill(cache, model, context: int) -> None:
    """Give the cache the state a `context`-token prompt leaves, with random keys and values
    (decode cost does not depend on the values)."""
    shape, param = dr.shape_of_config(model.config), next(model.parameters())
    if isinstance(cache, dr.DuoCache):
        for layer in cache.layers:
            for group in layer.groups:
                group.fill(1, context, shape.head_dim, param.dtype, param.device)
            _set_counters(layer, context, param.device)
        return
    for layer in range(shape.num_hidden_layers):
        k = torch.randn(1, shape.num_key_value_heads, context, shape.head_dim, dtype=param.dtype, device=param.device)
        if isinstance(cache, StaticCache):
            cache.layers[layer].lazy_initialization(k, k)
            cache.layers[layer].keys[:, :, :context] = k
            cache.layers[layer].values[:, :, :context] = k
            cache.layers[layer].cumulative_length.fill_(context)
        else:
            cache.update(k, torch.randn_like(k), layer)


def _set_counters(layer, context: int, device) -> None:
    if isinstance(layer.seen, torch.Tensor):  # static layer: counters are tensors updated in place
        layer.seen = mark_static(torch.tensor(context, device=device))
        layer.real = mark_static(torch.tensor([context], device=device))
    else:
        layer.seen, layer.real = context, torch.tensor([context], device=device)
    layer._place_head_indices(device)  # as a real prefill does: no host-to-device copy in a (captured) step
    layer.is_initialized = True


def kv_bytes(cache) -> int:
    return cache.kv_bytes() if isinstance(cache, dr.DuoCache) else H.cache_bytes(cache)
