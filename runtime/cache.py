"""`DuoCache`: a transformers `Cache` whose layers hold per-head-group storage.

Each `DuoCacheLayer` owns one `HeadGroup` per distinct policy in its layer of the plan. The
layer's `update` stores nothing itself: it hands itself to the attention function through the
attention kwargs (see `hf_compat.LAYER_KWARG`), which attends every group to its own storage and
lets the groups store and evict. `get_seq_length` reports tokens *seen*, not stored, as
transformers' sliding-window layers do (generate builds positions and slices follow-up prompts
from it).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .head_groups import HeadGroup, make_group
from .hf_compat import LAYER_KWARG
from .planning import Plan
from .step import Step


class DuoCacheLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, plan: Plan, layer: int, owner=None, prefill_chunk_size: int | None = None):
        super().__init__()
        rep = plan.shape.num_attention_heads // plan.shape.num_key_value_heads
        self.groups: list[HeadGroup] = [make_group(p, heads, rep) for p, heads in plan.layer_groups(layer)]
        self.rep, self.owner, self.prefill_chunk_size = rep, owner, prefill_chunk_size
        self.num_kv = plan.shape.num_key_value_heads
        self.seen = 0
        self.real: torch.Tensor | None = None  # [B] real (unpadded) tokens seen per row
        self._indices = [self._head_indices(g.kv_heads) for g in self.groups]

    def _head_indices(self, kv_heads: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        if len(self.groups) == 1:
            return None  # one group holding every head in order: no gather/scatter
        kv = torch.tensor(kv_heads)
        q = (kv[:, None] * self.rep + torch.arange(self.rep)).flatten()
        return kv, q

    # --- transformers' CacheLayerMixin ----------------------------------------------------
    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if self.owner is not None and not self.owner.active:
            raise RuntimeError(
                "this DuoCache belongs to a duocal runtime that was removed; make a new cache with the "
                "runtime now applied (runtime.new_cache()), or a plain cache for the model without duocal"
            )
        attn_kwargs = kwargs.get("kwargs")
        if not isinstance(attn_kwargs, dict):
            raise RuntimeError(
                "duocal: this model's attention does not pass its kwargs to cache.update(); "
                "supported families are listed in duocal_runtime.SUPPORTED_MODEL_TYPES"
            )
        attn_kwargs[LAYER_KWARG] = self
        self.is_initialized = True
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.groups = [make_group(g.policy, g.kv_heads, g.rep) for g in self.groups]
        self.seen, self.real = 0, None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for group in self.groups:
            group.select_batch(indices)
        if self.real is not None:
            self.real = self.real.index_select(0, indices.to(self.real.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.real is not None:
            self.batch_select_indices(torch.arange(self.real.shape[0]).repeat_interleave(repeats))

    # --- attention ------------------------------------------------------------------------
    def attend(self, q, k, v, pad_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, Hkv, T, D] of the new tokens -> attention output [B, H, T, D]."""
        t = q.shape[2]
        chunk = self.prefill_chunk_size or t
        outs = [self._attend_pass(q[:, :, i : i + chunk], k[:, :, i : i + chunk], v[:, :, i : i + chunk],
                                  pad_mask, scaling) for i in range(0, t, chunk)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _attend_pass(self, q, k, v, pad_mask, scaling):
        if self.real is None:
            self.real = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        t = q.shape[2]
        seen_mask = None if pad_mask is None else pad_mask[:, : self.seen + t]
        step = Step.make(self.seen, self.real, t, seen_mask, scaling)
        if len(self.groups) == 1:
            out = self.groups[0].attend(q, k, v, step)
        else:
            out = q.new_empty(q.shape)
            for group, (kv_idx, q_idx) in zip(self.groups, self._indices):
                out[:, q_idx] = group.attend(q[:, q_idx], k[:, kv_idx], v[:, kv_idx], step)
        self.seen += t
        self.real = step.real_after
        return out

    # --- inspection -----------------------------------------------------------------------
    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups)


class DuoCache(Cache):
    """One `DuoCacheLayer` per model layer, built from a plan (use `runtime.new_cache()`)."""

    def __init__(self, plan: Plan, owner=None, prefill_chunk_size: int | None = None):
        layers = [DuoCacheLayer(plan, i, owner, prefill_chunk_size) for i in range(plan.shape.num_hidden_layers)]
        super().__init__(layers=layers)
        self.plan = plan

    def kv_bytes(self) -> int:
        """Bytes of keys and values held, read from the tensors themselves (slack included)."""
        return sum(layer.nbytes() for layer in self.layers)

    def head_groups(self, layer: int) -> list[HeadGroup]:
        return self.layers[layer].groups
