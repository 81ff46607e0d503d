"""`DuoCache`: a transformers `Cache` whose layers hold per-head-group storage.

Each layer owns one `HeadGroup` per distinct policy in its layer of the plan. The
layer's `update` stores nothing itself: it hands itself to the attention function through the
attention kwargs (see `compat.LAYER_KWARG`), which attends every group to its own storage and
lets the groups store and evict. `get_seq_length` reports tokens *seen*, not stored, as
transformers' sliding-window layers do (generate builds positions and slices follow-up prompts
from it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from .. import compat
from ..compat import LAYER_KWARG
from ..planning.plan import Plan
from ..policies.base import DecodeStep, HeadGroup, Step
from ..policies.static_buffers import check_room, mark_static


def check_batch(real: torch.Tensor | None, rows: int) -> None:
    """A cache serves the batch it was first given (its rows' tokens are in it), never another."""
    if real is not None and real.shape[0] != rows:
        raise ValueError(
            f"this DuoCache holds {real.shape[0]} sequences but was given a batch of {rows}: a cache continues the "
            "batch it was made for; make a new one with runtime.new_cache() for another batch"
        )


class DuoCacheLayer(CacheLayerMixin):
    """Dynamic storage: every group holds exactly what its policy keeps (full heads grow)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    max_length: int | None = None

    def __init__(self, plan: Plan, layer: int, owner=None, prefill_chunk_size: int | None = None):
        super().__init__()
        rep = plan.shape.num_attention_heads // plan.shape.num_key_value_heads
        self.groups: list[HeadGroup] = [
            p.make_group(heads, rep, self.max_length) for p, heads in plan.layer_groups(layer)
        ]
        self.rep, self.owner, self.prefill_chunk_size = rep, owner, prefill_chunk_size
        self.num_kv = plan.shape.num_key_value_heads
        self.seen = 0
        self.real: torch.Tensor | None = None  # [B] real (unpadded) tokens seen per row
        self.position_base: torch.Tensor | None = None  # [B] the model is given ranks less this (stream_positions.py)
        self._indices = [self._head_indices(g.kv_heads) for g in self.groups]

    def _head_indices(self, kv_heads: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        if len(self.groups) == 1:
            return None  # one group holding every head in order: no gather/scatter
        kv = torch.tensor(kv_heads)
        q = (kv[:, None] * self.rep + torch.arange(self.rep)).flatten()
        return mark_static(kv), mark_static(q)

    # --- transformers' CacheLayerMixin ----------------------------------------------------
    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if self.owner is not None and not self.owner.active:
            raise RuntimeError(
                "this DuoCache belongs to a duocal runtime that was removed; make a new cache with the "
                "runtime now applied (runtime.new_cache()), or a plain cache for the model without duocal"
            )
        compat.check_attention_is(self.owner, "DuoCache")
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
        self.groups = [g.policy.make_group(g.kv_heads, g.rep, self.max_length) for g in self.groups]
        self.seen, self.real, self.position_base = 0, None, None

    def crop(self, max_length: int) -> None:
        raise NotImplementedError(
            "a DuoCache cannot be cropped: bounded heads have already evicted tokens a shorter sequence may need; "
            "start a new cache (runtime.new_cache()) instead"
        )

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for group in self.groups:
            group.select_batch(indices)
        if self.real is not None:
            self.real = self.real.index_select(0, indices.to(self.real.device))
            self.position_base = self.position_base.index_select(0, indices.to(self.real.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.real is not None:
            self.batch_select_indices(torch.arange(self.real.shape[0]).repeat_interleave(repeats))

    # --- attention ------------------------------------------------------------------------
    def attend(self, q, k, v, pad_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        """q [B, H, T, D], k/v [B, Hkv, T, D] of the new tokens -> attention output [B, H, T, D]."""
        t = q.shape[2]
        chunk = self.prefill_chunk_size or t
        outs = [
            self._attend_pass(q[:, :, i : i + chunk], k[:, :, i : i + chunk], v[:, :, i : i + chunk], pad_mask, scaling)
            for i in range(0, t, chunk)
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _attend_pass(self, q, k, v, pad_mask, scaling):
        check_batch(self.real, q.shape[0])
        if self.real is None:
            self.real = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
            self.position_base = torch.zeros_like(self.real)
        t = q.shape[2]
        seen_mask = None if pad_mask is None else pad_mask[:, : self.seen + t]
        step = Step.make(self.seen, self.real, t, seen_mask, scaling, **self._positions())
        out = self._each_group(q, k, v, lambda group: group.attend, step)
        self.seen += t
        self.real = step.real_after
        return out

    def _positions(self) -> dict:
        """What heads that see positions within their cache need to know of the stream (Step's fields)."""
        return {"position_base": self.position_base, "rotation": getattr(self.owner, "rotation", None)}

    def shift_positions(self, delta: torch.Tensor) -> None:
        """Give the model positions `delta` [B] lower from now on: every group's keys move with them."""
        delta = delta.to(self.position_base.device)
        for group in self.groups:
            group.shift_positions(delta, self.owner.rotation)
        self.position_base.add_(delta)

    def store_prefix(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Take a new sequence's first tokens from full attention: keys and values [B, Hkv, T, D] (RoPE
        applied, no padding), stored as if this layer had attended to them (`DuoCache.load_prefix`)."""
        if self.real is not None:
            raise ValueError("a prefix goes into a new cache, before any token: make one with runtime.new_cache()")
        step = Step.make(0, torch.zeros(k.shape[0], dtype=torch.long, device=k.device), k.shape[2], None, 1.0)
        self._place_head_indices(k.device)
        for group, indices in zip(self.groups, self._indices, strict=True):
            if indices is None:  # one group holding every head
                group.store(k, v, step)
            else:
                group.store(k[:, indices[0]], v[:, indices[0]], step)
        self.seen, self.real = k.shape[2], step.real_after
        self.position_base = torch.zeros_like(self.real)

    def _each_group(self, q, k, v, method, step):
        """Run `method(group)(q, k, v, step)` for every group on its own heads; one output [B, H, T, D]."""
        if len(self.groups) == 1:
            return method(self.groups[0])(q, k, v, step)
        if not torch.compiler.is_compiling():
            self._place_head_indices(q.device)
        out = q.new_empty(q.shape)
        for group, (kv_idx, q_idx) in zip(self.groups, self._indices, strict=True):
            out[:, q_idx] = method(group)(q[:, q_idx], k[:, kv_idx], v[:, kv_idx], step)
        return out

    def _place_head_indices(self, device: torch.device) -> None:
        """Keep the head indices on the device of the heads, at fixed addresses: CPU indices put a
        host-to-device copy in every step, which CUDA graph capture refuses (mixed layers crashed
        the compiled decode step on CUDA)."""
        if len(self.groups) > 1 and self._indices[0][0].device != device:
            self._indices = [(mark_static(kv.to(device)), mark_static(q.to(device))) for kv, q in self._indices]

    # --- inspection -----------------------------------------------------------------------
    def nbytes(self) -> int:
        return sum(g.nbytes() for g in self.groups)


class StaticDuoCacheLayer(DuoCacheLayer):
    """Static storage for `torch.compile`: fixed buffers (full heads `max_length` slots, bounded
    heads their budget), counters kept in tensors updated in place, and decode steps (one token)
    with no data-dependent shape and no host sync. Prefill passes run eagerly, as in transformers'
    `generate`, which compiles only the decode step."""

    is_compileable = True

    def __init__(self, plan: Plan, layer: int, owner=None, prefill_chunk_size: int | None = None, max_length: int = 0):
        self.max_length = max_length
        super().__init__(plan, layer, owner, prefill_chunk_size)
        self.seen = torch.zeros((), dtype=torch.long)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.max_length, 0

    def store_prefix(self, k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError(
            "a static DuoCache takes no prefix from full attention: use a dynamic cache (runtime.new_cache())"
        )

    def get_seq_length(self):
        return self.seen  # a tensor, as transformers' StaticLayer: reading it must not sync

    def get_max_length(self) -> int:
        return self.max_length

    def reset(self) -> None:
        super().reset()
        self.seen = torch.zeros((), dtype=torch.long)

    def _attend_pass(self, q, k, v, pad_mask, scaling):
        check_batch(self.real, q.shape[0])
        if pad_mask is not None and pad_mask.shape[-1] < self.max_length:
            pad_mask = torch.nn.functional.pad(pad_mask, (0, self.max_length - pad_mask.shape[-1]))
        if self.real is None:
            self.seen = mark_static(self.seen.to(q.device))
            self.real = mark_static(torch.zeros(q.shape[0], dtype=torch.long, device=q.device))
            self.position_base = mark_static(torch.zeros_like(self.real))
        elif q.shape[2] == 1:
            return self._decode(q, k, v, pad_mask, scaling)
        t, seen = q.shape[2], int(self.seen)
        check_room(seen + t, self.max_length)
        step = Step.make(seen, self.real, t, pad_mask, scaling, **self._positions())
        out = self._each_group(q, k, v, lambda group: group.attend, step)
        self._advance(t, step.real_after)
        return out

    def _decode(self, q, k, v, pad_mask, scaling):
        if torch.compiler.is_compiling():
            check_compile_device(q.device)
            torch._assert_async(
                self.seen < self.max_length, "static DuoCache is full: make it with a larger max_length"
            )
        else:
            check_room(int(self.seen) + 1, self.max_length)
        step = DecodeStep.make(self.seen, self.real, pad_mask, scaling, **self._positions())
        out = self._each_group(q, k, v, lambda group: group.decode, step)
        self._advance(1, step.real_after)
        return out

    def _advance(self, tokens: int, real_after: torch.Tensor) -> None:
        self.seen.add_(tokens)  # in place: compiled steps hold these addresses
        self.real.copy_(real_after)


COMPILE_DEVICES = ("cuda", "cpu", "xpu")  # where the compiled decode step is built and tested (cuda, cpu)


def check_compile_device(device: torch.device) -> None:
    if device.type not in COMPILE_DEVICES:
        raise RuntimeError(
            f"duocal's static cache does not support torch.compile on {device.type} (supported: "
            f"{', '.join(COMPILE_DEVICES)}); run uncompiled with generation_config.disable_compile = True, or use a "
            "dynamic cache (runtime.new_cache())"
        )


@torch.no_grad()
def full_attention_kv(model, input_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values per layer after `model` ran `input_ids` [B, T] as it is, without duocal (call it
    outside `dr.apply`): the prefix `DuoCache.load_prefix` takes."""
    cache = DynamicCache()
    model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


class DuoCache(Cache):
    """One layer per model layer, built from a plan (use `runtime.new_cache()`).

    With `max_length`, a static cache (`is_compileable`): `model.generate()` compiles its decode
    steps on CUDA by itself, as for transformers' `StaticCache`.
    """

    made_by_duocal = True  # what drop-in generation lets through (drop_in.py)

    def __init__(self, plan: Plan, owner=None, prefill_chunk_size: int | None = None, max_length: int | None = None):
        if max_length is None:
            layers = [DuoCacheLayer(plan, i, owner, prefill_chunk_size) for i in range(plan.shape.num_hidden_layers)]
        else:
            layers = [
                StaticDuoCacheLayer(plan, i, owner, prefill_chunk_size, max_length)
                for i in range(plan.shape.num_hidden_layers)
            ]
        super().__init__(layers=layers)
        self.plan, self.max_length = plan, max_length

    def __deepcopy__(self, memo: dict) -> DuoCache:
        """An independent copy of the stored tokens that still belongs to the same runtime (transformers'
        prefix reuse, or one question per copy of a compressed context)."""
        owner = self.layers[0].owner if self.layers else None
        memo[id(owner)], memo[id(self.plan)] = owner, self.plan  # shared, not copied (the runtime holds the model)
        for holder in [*self.layers, *(g for layer in self.layers for g in layer.groups)]:
            for value in vars(holder).values():
                if isinstance(value, torch.Tensor):  # stored keys may carry autograd history: copy the values
                    memo[id(value)] = value.detach().clone()
        copied = self.__class__.__new__(self.__class__)
        memo[id(self)] = copied
        for name, value in vars(self).items():
            setattr(copied, name, copy.deepcopy(value, memo))
        return copied

    def load_prefix(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Start this new cache from full attention's keys and values of a sequence's first T tokens, one
        (k, v) [B, Hkv, T, D] per layer (RoPE applied, no padding: e.g. a transformers `DynamicCache` the
        model filled without duocal), as if it had run them itself. Every plan computes such a prefix alike
        while each head still attends to all of it (T <= `plan.full_attention_prefix`): compute it once."""
        shape = self.plan.shape
        if len(layers) != shape.num_hidden_layers:
            raise ValueError(
                f"load_prefix: {len(layers)} layers of keys and values for a {shape.num_hidden_layers}-layer plan"
            )
        k0 = layers[0][0]
        want = (k0.shape[0], shape.num_key_value_heads, k0.shape[2], shape.head_dim)
        if any(tuple(t.shape) != want for pair in layers for t in pair):
            raise ValueError(f"load_prefix: every layer's keys and values must be [B, Hkv, T, D] = {list(want)}")
        if k0.shape[2] > self.plan.full_attention_prefix:
            raise ValueError(
                f"load_prefix: {k0.shape[2]} tokens, but this plan's heads attend as full attention does to the first "
                f"{self.plan.full_attention_prefix} only (plan.full_attention_prefix); give a shorter prefix"
            )
        for layer, (k, v) in zip(self.layers, layers, strict=True):
            layer.store_prefix(k, v)

    def kv_bytes(self) -> int:
        """Bytes of keys and values held, read from the tensors themselves (slack included)."""
        return sum(layer.nbytes() for layer in self.layers)

    def head_groups(self, layer: int) -> list[HeadGroup]:
        return self.layers[layer].groups
