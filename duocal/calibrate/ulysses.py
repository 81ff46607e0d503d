"""Long-sequence parallelism for calibration: DeepSpeed Ulysses around the gated attention.

Each of P processes holds 1/P of every sequence's tokens (all heads) for the embeddings, MLPs
and norms. Around attention, DeepSpeed's `DistributedAttention` does an all-to-all so that each
process holds the whole sequence for 1/P of the heads, runs the local (teacher or gated)
attention, and returns the outputs to the token layout (Jacobs et al., "DeepSpeed Ulysses",
arXiv 2309.14509; upstream DuoAttention trains 32k-token samples this way on 8 GPUs). Heads are
split by KV group, so process r holds KV heads [r*G/P, (r+1)*G/P) and their query heads, and
reads the matching slice of the gates. Requires P to divide the number of KV heads; every
process gets the same samples (`batches.StepData(sequence_parallel=True)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SequenceParallel:
    group: Any  # torch.distributed process group
    size: int
    rank: int
    num_kv_heads: int

    @classmethod
    def world(cls, num_kv_heads: int) -> SequenceParallel:
        import torch.distributed as dist

        size = dist.get_world_size()
        if num_kv_heads % size:
            raise ValueError(
                f"sequence parallelism over {size} processes needs a multiple of {size} KV heads, "
                f"the model has {num_kv_heads}"
            )
        return cls(dist.group.WORLD, size, dist.get_rank(), num_kv_heads)

    def attend(self, local: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """q [B,H,t,D], k/v [B,G,t,D] (t = T/P local tokens) -> out [B,t,H,D] (transformers' layout).

        `local(q, k, v, kv_offset)` gets [B, H/P, T, D] / [B, G/P, T, D] and returns [B, H/P, T, D].
        """
        from deepspeed.sequence.layer import DistributedAttention

        kv_offset = self.rank * (self.num_kv_heads // self.size)

        def local_bshd(q, k, v, *args, **kwargs):  # [B, T, h, D] in and out
            out = local(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kv_offset)
            return out.transpose(1, 2).contiguous()

        # scatter heads (dim 2), gather tokens (dim 1) in the [B, t, H, D] layout
        attention = DistributedAttention(
            local_bshd, self.group, scatter_idx=2, gather_idx=1, num_kv_heads=self.num_kv_heads
        )
        q, k, v = (x.transpose(1, 2).contiguous() for x in (query, key, value))
        return attention(q, k, v, 0)
