"""Fixed-address tensors for static head groups (what `torch.compile` and CUDA graphs need)."""

from __future__ import annotations

import torch

from ..errors import CacheFullError


def mark_static(tensor: torch.Tensor) -> torch.Tensor:
    """Tell dynamo the tensor keeps its address (as transformers' StaticLayer does); a no-op while tracing."""
    if not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(tensor)
    return tensor


def allocate_static(like: torch.Tensor, slots: int, fill: float = 0) -> torch.Tensor:
    """A buffer typed and placed like `like`, with its slot dim (2 for [B, G, S, ...], else 1) of `slots`."""
    dim = 2 if like.ndim >= 3 else 1
    shape = (*like.shape[:dim], slots, *like.shape[dim + 1 :])
    return mark_static(torch.full(shape, fill, dtype=like.dtype, device=like.device))


def check_room(needed: int, max_length: int) -> None:
    if needed > max_length:
        raise CacheFullError(
            f"static DuoCache is full: this pass needs {needed} token positions but the cache was made with "
            f"max_length={max_length}; make it with runtime.new_cache(max_length=N) for N >= prompt + new tokens"
        )
