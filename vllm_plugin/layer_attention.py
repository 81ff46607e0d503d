"""`DuoLayerAttention`: what replaces vLLM's `Attention` in one decoder layer under a duocal plan.

It takes vLLM's post-RoPE ``q, k, v`` of the layer (as every family's attention module calls ``self.attn(q, k, v)``)
and makes one call per policy: one `HeadGroupAttention` over the layer's full heads, one over its streaming heads
(head_views.py; two when a layer's heads of one policy had to be split over two KV cache groups, which
cache_layout.py avoids). Each KV head also keeps a cache layer of its own (`cache_layers`: a vLLM `Attention` of
one head that is never called, only reports its KV spec and receives its cache), named
``<layer's attention>.kv_<letters>`` by its slot (rank_heads.py: every tensor-parallel rank reports the same
specs) and built in the order cache_layout.py gives, so that vLLM's grouping places a call's heads side by side.
"""

from __future__ import annotations

import string

import torch
from torch import nn

from .cache_layout import CacheLayout, CacheSlot
from .head_plan import HeadSpec
from .head_views import FullHeadsCPUBackend, HeadGroupAttention
from .sink_window_backend import SinkWindowCPUBackend
from .sink_window_spec import SinkWindowSpec, request_in_flight_tokens
from .vllm_internals import Attention, VllmConfig, get_kv_quant_mode

FULL = "full"


def letters(n: int) -> str:
    """``a``, ``b``, ..., ``z``, ``ba``, ...: a suffix without digits (vLLM reads the layer index off a name)."""
    out = ""
    while True:
        out = string.ascii_lowercase[n % 26] + out
        n //= 26
        if n == 0:
            return out


def policy_key(spec: HeadSpec):
    """Heads with equal keys share a KV cache spec (and may share a call)."""
    return FULL if spec.is_full else (spec.sink, spec.recent)


class SinkWindowCache(Attention):
    """The cache layer of one streaming head: reports a `SinkWindowSpec`, so that vLLM's KV cache manager frees
    the blocks between the sink and the recent tokens."""

    def __init__(self, *args, sink: int, recent: int, **kwargs) -> None:
        super().__init__(*args, per_layer_sliding_window=recent, attn_backend=SinkWindowCPUBackend, **kwargs)
        self.sink = sink
        self.impl.set_sink_window(sink, recent)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> SinkWindowSpec:
        return SinkWindowSpec(
            block_size=vllm_config.cache_config.block_size, num_kv_heads=self.num_kv_heads, head_size=self.head_size,
            head_size_v=self.head_size_v, dtype=self.kv_cache_torch_dtype,
            kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype), sliding_window=self.sliding_window,
            sink=self.sink, request_in_flight_tokens=request_in_flight_tokens(vllm_config),
        )  # fmt: skip


class SinkWindowHeads(HeadGroupAttention):
    """One call over a layer's streaming heads of one sink and recent."""

    def __init__(self, *args, sink: int, recent: int, **kwargs) -> None:
        super().__init__(*args, per_layer_sliding_window=recent, attn_backend=SinkWindowCPUBackend, **kwargs)
        self.impl.set_sink_window(sink, recent)


class DuoLayerAttention(nn.Module):
    """``attn(q [T, H*g*D], k [T, H*D], v [T, H*D]) -> [T, H*g*D]`` with one call per `calls` entry; `heads`: the
    layer's KV heads each call takes (rank-local, in its cache layers' order)."""

    def __init__(self, calls: list[Attention], heads: list[tuple[int, ...]], cache_layers: list[Attention],
                 group: int, head_dim: int) -> None:  # fmt: skip
        super().__init__()
        self.calls = nn.ModuleList(calls)
        self.cache_layers = nn.ModuleList(cache_layers)
        order = [h for call_heads in heads for h in call_heads]
        self.order = None if order == sorted(order) else order  # None: the calls take the heads as they come
        self.inverse = None if self.order is None else sorted(range(len(order)), key=order.__getitem__)
        self.sizes = [len(call_heads) for call_heads in heads]
        self.group, self.head_dim = group, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tokens, kv_heads = q.shape[0], sum(self.sizes)
        if self.order is not None:
            q = q.view(tokens, kv_heads, -1)[:, self.order].reshape(tokens, -1)
            k = k.view(tokens, kv_heads, -1)[:, self.order].reshape(tokens, -1)
            v = v.view(tokens, kv_heads, -1)[:, self.order].reshape(tokens, -1)
        qs = q.split([n * self.group * self.head_dim for n in self.sizes], dim=-1)
        ks = k.split([n * self.head_dim for n in self.sizes], dim=-1)
        vs = v.split([n * self.head_dim for n in self.sizes], dim=-1)
        out = torch.cat([call(qc, kc, vc) for call, qc, kc, vc in zip(self.calls, qs, ks, vs, strict=True)], dim=-1)
        if self.inverse is not None:
            out = out.view(tokens, kv_heads, -1)[:, self.inverse].reshape(tokens, -1)
        return out


def build_layers(layout: CacheLayout, table: list[list[HeadSpec]], stock: list[Attention], vllm_config: VllmConfig
                 ) -> list[DuoLayerAttention]:  # fmt: skip
    """The `DuoLayerAttention` of every layer; `stock`: vLLM's attention of each layer (names, sizes, scale)."""
    caches: dict[tuple[int, int], Attention] = {}
    spares: dict[int, list[Attention]] = {}
    for slot in layout.build_order:  # vLLM groups cache layers in the order they are built
        module = cache_layer(slot, table, stock[slot.layer], vllm_config, len(spares.get(slot.layer, [])))
        if slot.head is None:
            spares.setdefault(slot.layer, []).append(module)
        else:
            caches[slot.layer, slot.head] = module
    layers = []
    for index, calls in enumerate(layout.calls):
        attn = stock[index]
        modules = []
        for n, call in enumerate(calls):
            nth = sum(other.key == call.key for other in calls[:n])  # > 0 only for a split segment's pieces
            modules.append(head_call(attn, call.key, [caches[index, h] for h in call.heads], vllm_config, nth))
        own = [caches[index, h] for h in range(len(table[index]))] + spares.get(index, [])
        group = attn.num_heads // attn.num_kv_heads
        layers.append(DuoLayerAttention(modules, [call.heads for call in calls], own, group, attn.head_size))
    return layers


def cache_layer(slot: CacheSlot, table, attn: Attention, vllm_config: VllmConfig, spare: int) -> Attention:
    """The one-head cache layer of `slot` (a spare: the `spare`-th of its layer)."""
    suffix = f"kv_spare_{letters(spare)}" if slot.head is None else f"kv_{letters(table[slot.layer][slot.head].slot)}"
    args = (attn.num_heads // attn.num_kv_heads, attn.head_size, attn.impl.scale)
    kwargs = dict(num_kv_heads=1, cache_config=vllm_config.cache_config, quant_config=attn.quant_config,
                  prefix=f"{attn.layer_name}.{suffix}")  # fmt: skip
    if slot.key == FULL:
        return Attention(*args, attn_backend=FullHeadsCPUBackend, **kwargs)
    sink, recent = slot.key
    return SinkWindowCache(*args, sink=sink, recent=recent, **kwargs)


def head_call(attn: Attention, key, caches: list[Attention], vllm_config: VllmConfig, n: int) -> HeadGroupAttention:
    """The `n`-th call of `attn`'s layer over heads of policy `key` (0 but where a policy's heads were split),
    whose cache layers are `caches`."""
    group = attn.num_heads // attn.num_kv_heads
    name = f"{attn.layer_name}.{'full' if key == FULL else 'streaming'}{'' if n == 0 else '_' + letters(n)}"
    args = (group * len(caches), attn.head_size, attn.impl.scale)
    kwargs = dict(num_kv_heads=len(caches), cache_config=vllm_config.cache_config, quant_config=attn.quant_config,
                  prefix=name, cache_layers=caches)  # fmt: skip
    if key == FULL:
        return HeadGroupAttention(*args, attn_backend=FullHeadsCPUBackend, **kwargs)
    sink, recent = key
    return SinkWindowHeads(*args, sink=sink, recent=recent, **kwargs)
