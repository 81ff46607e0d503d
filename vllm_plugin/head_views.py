"""One attention call over several KV heads that each keep a cache layer of their own (cache_layout.py).

A layer's heads of one policy are one vLLM `Attention` with those heads (`HeadGroupAttention`) that shares the KV
cache of their first cache layer (vLLM's ``kv_sharing_target_layer_name``: no cache, no spec of its own, the
metadata of that layer's KV cache group). Its implementation widens that one-head view to all its heads
(`heads_view`: the heads' cache layers are neighbours of one group, one region apart), writes their keys and
values itself (vLLM writes none for a layer that shares a cache) and runs vLLM's CPU kernel once. Its metadata
builder sizes the kernel's schedule for the heads of its layers, not the one head of the group's spec.
"""

from __future__ import annotations

import torch

from .head_plan import DuoVllmError
from .vllm_internals import (
    Attention,
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
    get_layers_from_vllm_config,
)


class HeadGroupAttention(Attention):
    """vLLM's `Attention` over `cache_layers` (one per KV head, in their group's order), sharing the first one's
    cache. Build with ``kv_sharing_target_layer_name=cache_layers[0].layer_name``."""

    def __init__(self, *args, cache_layers: list[Attention], **kwargs) -> None:
        super().__init__(*args, kv_sharing_target_layer_name=cache_layers[0].layer_name, **kwargs)
        self.__dict__["cache_layers"] = cache_layers  # not submodules: DuoLayerAttention owns them
        self.__dict__["heads_cache"] = (None, None)  # (the bound one-head view, its widened view)


def heads_view(layer: HeadGroupAttention, kv_cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, heads, block, 2 * head] over the cache layers of `layer`'s heads, made once per binding."""
    bound, view = layer.heads_cache
    if bound is not kv_cache:
        view = widen([cache_layer.kv_cache for cache_layer in layer.cache_layers])
        layer.__dict__["heads_cache"] = (kv_cache, view)
    return view


def widen(caches: list[torch.Tensor]) -> torch.Tensor:
    """Views [num_blocks, 1, block, 2 * head] of one storage, evenly spaced -> one view [num_blocks, n, ...]."""
    first = caches[0]
    step = caches[1].storage_offset() - first.storage_offset() if len(caches) > 1 else first.numel()
    for i, cache in enumerate(caches):
        same_storage = cache.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not (same_storage and cache.shape == first.shape and cache.stride() == first.stride()) or (
            cache.storage_offset() != first.storage_offset() + i * step or cache.shape[1] != 1
        ):
            raise DuoVllmError(
                "vLLM placed the KV cache layers of one attention call apart from each other (duocal_vllm plans them "
                "as neighbours of one KV cache group, cache_layout.py): this vLLM groups KV cache layers otherwise "
                "than the one the plugin was tested on (duocal_vllm.version)"
            )
    size = (first.shape[0], len(caches), *first.shape[2:])
    return torch.as_strided(first, size, (first.stride(0), step, *first.stride()[2:]), first.storage_offset())


class HeadGroupImpl:
    """Mixin before a CPU attention implementation: writes the call's keys and values into its heads' cache layers,
    then attends on the widened view (`attend`: the base class's forward unless overridden)."""

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, **kwargs):
        if attn_metadata is None:  # vLLM's warm-up and profile runs
            return output
        if not isinstance(layer, HeadGroupAttention):  # a cache layer alone: never attends
            raise DuoVllmError(f"{layer.layer_name} holds a KV head's cache and is never called")
        cache = heads_view(layer, kv_cache)
        tokens = attn_metadata.num_actual_tokens
        self.do_kv_cache_update(layer, key[:tokens], value[:tokens], cache, attn_metadata.slot_mapping[:tokens])
        return self.attend(layer, query, key, value, cache, attn_metadata, output, output_scale, **kwargs)

    def attend(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, **kwargs):
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale, **kwargs)


class HeadGroupBuilder:
    """Mixin before a CPU metadata builder: the kernel's schedule for the KV heads of this builder's layers (its
    attention group: layers of one query head count), not the group spec's one head."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
        kv_heads = {layer.impl.num_kv_heads for layer in layers.values()}
        if len(kv_heads) != 1:
            raise DuoVllmError(f"one attention group of {layer_names} mixes KV head counts {sorted(kv_heads)}")
        self.num_kv_heads = kv_heads.pop()


class FullHeadsImpl(HeadGroupImpl, CPUAttentionBackendImpl):
    """Full heads of one layer: vLLM's CPU kernel as it is, over the widened view."""


class FullHeadsBuilder(HeadGroupBuilder, CPUAttentionMetadataBuilder):
    """vLLM's CPU metadata, scheduled for the full heads of this builder's layers."""


class FullHeadsCPUBackend(CPUAttentionBackend):
    """vLLM's CPU backend for a layer's full heads (`HeadGroupAttention`) and their cache layers."""

    @staticmethod
    def get_impl_cls() -> type[FullHeadsImpl]:
        return FullHeadsImpl

    @staticmethod
    def get_builder_cls() -> type[FullHeadsBuilder]:
        return FullHeadsBuilder
