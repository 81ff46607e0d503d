"""Everything that depends on the transformers version (tested: 5.24).

- Attention functions are registered by name in `AttentionInterface`, and the same name in
  `AttentionMaskInterface` (without it transformers passes `attention_mask=None` even for a
  left-padded batch). duocal's mask function returns the caller's 2D padding mask (or None):
  each head group builds its own causal / sink-window mask from it, so no [T, T] mask is built.
- The decoder attention modules of the supported families call
  `cache.update(k, v, layer_idx, kwargs=kwargs)` and then `attention_fn(..., **kwargs)` with the
  same dict, so a cache layer can hand itself to the attention function under `LAYER_KWARG`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function

LAYER_KWARG = "duocal_cache_layer"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def check_model_supported(config: Any) -> None:
    """Raise ValueError for architectures the runtime cannot serve correctly."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"duocal does not support model type {model_type!r} yet; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    has_sliding_layers = "sliding_attention" in layer_types or (
        model_type == "mistral" and getattr(config, "sliding_window", None) is not None
    )
    if has_sliding_layers:
        raise ValueError(
            f"this {model_type} config uses sliding-window attention layers, which duocal does not combine "
            "with per-head policies; set config.sliding_window = None (or use_sliding_window = False) if the "
            "model was trained without it"
        )


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor | None:
    """AttentionMaskInterface entry: the 2D bool padding mask over the kv range, None if none is padded.

    A static cache reports its seen count as a tensor (`q_offset`) and `max_length` as kv_length:
    its mask is padded to that fixed length (as transformers does for StaticCache) and never
    reduced to None by a check that would sync the host inside a compiled step. For dynamic
    caches the mask must cover every token seen plus the new ones.
    """
    if mask_function is not causal_mask_function:
        raise ValueError(
            "duocal only supports plain causal masks (no packed sequences, sliding windows or custom overlays)"
        )
    if attention_mask is None:
        return None
    mask = attention_mask[:, kv_offset : kv_offset + kv_length].to(torch.bool)
    if isinstance(q_offset, torch.Tensor):
        return torch.nn.functional.pad(mask, (0, kv_length - mask.shape[-1])) if mask.shape[-1] < kv_length else mask
    if mask.shape[-1] != kv_length:
        raise ValueError(
            f"attention_mask covers {attention_mask.shape[-1]} tokens but the cache and input make {kv_length}: "
            "pass a mask over every token seen so far plus the new ones"
        )
    return None if bool(mask.all()) else mask


def calling_attention_module(depth: int = 5):
    """The attention module whose forward called `cache.update(...)` (the supported families call it
    straight from their forward), or None when no such caller is on the stack."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        module = frame.f_locals.get("self")
        if hasattr(module, "layer_idx") and hasattr(module, "config"):
            return module
        frame = frame.f_back
    return None


def check_attention_is(owner, what: str) -> None:
    """Refuse a duocal cache updated by an attention that is not `owner`'s (another model, or the
    model switched to another implementation): that attention would not read what duocal stores."""
    if owner is None or torch.compiler.is_compiling():  # a compiled decode step was checked when it ran eagerly
        return
    module = calling_attention_module()
    if module is None:
        return
    running = getattr(module.config, "_attn_implementation", None)
    if running != owner.name:
        raise RuntimeError(
            f"this {what} was used by an attention that is not its duocal runtime's (the model runs {running!r}); "
            "it would attend to nothing it stored. Use it only with the model its runtime was applied to, and "
            "apply the plan again (dr.apply) after changing the model's attention implementation"
        )


def register(name: str, attention_fn: Callable) -> None:
    AttentionInterface.register(name, attention_fn)
    AttentionMaskInterface.register(name, padding_mask)


def unregister(name: str) -> None:
    AttentionInterface._global_mapping.pop(name, None)
    AttentionMaskInterface._global_mapping.pop(name, None)


def attention_implementation(model) -> str:
    return model.config._attn_implementation


def set_attention_implementation(model, name: str) -> None:
    model.set_attn_implementation(name)
