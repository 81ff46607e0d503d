"""What one forward pass tells a cache layer about its new tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import ranks_of_new_tokens


@dataclass(frozen=True)
class Step:
    """One forward pass through one layer: T new tokens for B rows.

    `pad_mask` [B, >= seen_before + T] is the caller's 2D attention mask over every token seen
    so far (None: nothing is padded). Full heads store padding like transformers' DynamicCache
    and mask it; bounded heads never store it.
    """

    seen_before: int
    new_valid: torch.Tensor  # [B, T] bool
    new_ranks: torch.Tensor  # [B, T] long, -1 for padding
    real_after: torch.Tensor  # [B] long: real tokens seen once this pass is stored
    pad_mask: torch.Tensor | None
    scaling: float

    @property
    def all_valid(self) -> bool:
        return self.pad_mask is None or bool(self.new_valid.all())

    @classmethod
    def make(cls, seen_before: int, real_before: torch.Tensor, num_new: int, pad_mask, scaling: float) -> Step:
        batch = real_before.shape[0]
        if pad_mask is None:
            valid = torch.ones(batch, num_new, dtype=torch.bool, device=real_before.device)
        else:
            valid = pad_mask[:, seen_before : seen_before + num_new]
        ranks = ranks_of_new_tokens(valid, real_before)
        return cls(seen_before, valid, ranks, real_before + valid.sum(1), pad_mask, scaling)


@dataclass(frozen=True)
class DecodeStep:
    """One new token per row in a static cache, described by tensors only (no host sync, no
    data-dependent shape): what a compiled decode step sees.

    `position` is the 0-d slot of the token in the padded sequence (tokens seen before it);
    `pad_mask` [B, max_length] is False for padding and for positions not yet written.
    """

    position: torch.Tensor  # [] long
    new_valid: torch.Tensor  # [B] bool
    new_rank: torch.Tensor  # [B] long, -1 for padding
    real_after: torch.Tensor  # [B] long
    pad_mask: torch.Tensor | None
    scaling: float

    @classmethod
    def make(cls, position: torch.Tensor, real_before: torch.Tensor, pad_mask, scaling: float) -> DecodeStep:
        if pad_mask is None:
            valid = torch.ones_like(real_before, dtype=torch.bool)
        else:
            valid = pad_mask.index_select(1, position.view(1))[:, 0]
        rank = torch.where(valid, real_before, -1)
        return cls(position, valid, rank, real_before + valid.long(), pad_mask, scaling)
