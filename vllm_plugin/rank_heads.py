"""The KV heads, and their policies, that one tensor-parallel rank builds attention modules for.

vLLM's `QKVParallelLinear` gives rank r of `tp_size` the contiguous KV heads ``shards(num_kv_heads, tp_size)[r]``
and their query groups (vllm/model_executor/layers/linear.py: KV shard ``tp_rank // num_kv_head_replicas``, one
replica when `tp_size` divides the KV heads), so a rank's attention modules are those heads, in that order.
vLLM merges the ranks' KV cache specs by layer name and requires one spec per name on every rank
(`get_kv_cache_configs`), so a module is named by its *slot*, not its head: its place among the rank's heads
ordered full first, then streaming by (sink, recent). Slot ``a`` of layer 3 may be head 1 on rank 0 and head 2 on
rank 1; both are full. That needs every rank to hold the same policies in each layer (a balanced plan,
duocal_runtime.planning.tensor_parallel): other plans are refused, naming their layers.
"""

from __future__ import annotations

from dataclasses import replace

from .head_plan import DuoVllmError, HeadSpec, check_balanced


def slot_key(spec: HeadSpec) -> tuple[bool, int, int]:
    """Full heads first, then streaming heads by (sink, recent)."""
    return (not spec.is_full, spec.sink or 0, spec.recent or 0)


def rank_table(table: list[list[HeadSpec]], tp_size: int, rank: int) -> list[list[HeadSpec]]:
    """Per layer, the heads of `table` that `rank` of `tp_size` holds, in head order, each with its `slot`."""
    from duocal_runtime.planning.tensor_parallel import shards

    check_balanced(table, tp_size)
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} of tensor parallel size {tp_size}")
    mine, uneven = [], []
    for layer, row in enumerate(table):
        held = [[row[h] for h in shard] for shard in shards(len(row), tp_size)]
        if len({tuple(sorted(map(slot_key, heads))) for heads in held}) > 1:
            uneven.append(str(layer))
        order = sorted(range(len(held[rank])), key=lambda i, heads=held[rank]: (slot_key(heads[i]), i))
        slots = {i: slot for slot, i in enumerate(order)}
        mine.append([replace(spec, slot=slots[i]) for i, spec in enumerate(held[rank])])
    if uneven:
        raise DuoVllmError(
            f"tensor parallel size {tp_size}: ranks hold streaming heads of different sink/recent sizes in layers "
            f"{', '.join(uneven)}; vLLM needs every rank to hold the same KV cache layout: give every streaming head "
            "the same sizes (DUOCAL_SINK / DUOCAL_RECENT)"
        )
    return mine
