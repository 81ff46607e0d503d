"""How many streaming heads a plan keeps on vLLM, so that vLLM's KV cache groups need few padding layers.

vLLM puts KV cache layers (here: one per KV head) of one spec in groups of equal size, the smaller of the two
head counts (or the larger when they are within 1.5x), and pads the other count up to whole groups with
padding layers that hold memory and attend to nothing (vllm/v1/core/kv_cache_utils.py,
`_get_kv_cache_groups_uniform_page_size`). SmolLM2's shipped profile at 0.75 is 22 full and 68 streaming
heads: 4 groups of 22 for 68 heads, 20 padding layers, 29% of the streaming heads' memory. The plugin makes
the fewest of the best-scored streaming heads full (the profile's own order, on the plan's own head set:
`with_fewer_bounded`) so that a request's blocks, padding included, are fewest; it never makes a full head
streaming, so quality can only rise. 22 + 68 becomes 23 + 67 (3 groups of 23 for 67: 2 padding layers).
"""

from __future__ import annotations

import math
import os

from vllm.logger import init_logger

from duocal_runtime.planning.tensor_parallel import with_fewer_bounded

from .head_plan import HeadSpec, head_table, make_plan, settings_of
from .sink_window_spec import SinkWindowSpec, request_in_flight_tokens
from .vllm_internals import cdiv

logger = init_logger(f"vllm.{__name__}")


def group_slots(full: int, streaming: int) -> tuple[int, int]:
    """Layers vLLM allocates for `full` and `streaming` per-head layers, padding included."""
    if not full or not streaming:
        return full, streaming
    size = min(full, streaming)
    if max(full, streaming) < 1.5 * size:
        size = max(full, streaming)
    return math.ceil(full / size) * size, math.ceil(streaming / size) * size


def fitted_streaming_count(full: int, streaming: int, full_blocks: int, streaming_blocks: int) -> int:
    """The streaming head count, at most `streaming`, whose request blocks (padding included) are fewest;
    among equals the largest (closest to the plan). The plan as it is when a streaming head is reserved no fewer
    blocks than a full one (a short max_model_len, or no per-request chunk cap): then no head is worth moving."""
    if streaming_blocks >= full_blocks:
        return streaming

    def request_blocks(kept: int) -> int:
        full_slots, streaming_slots = group_slots(full + streaming - kept, kept)
        return full_slots * full_blocks + streaming_slots * streaming_blocks

    return min(range(streaming, -1, -1), key=request_blocks)


PLANNED: dict[tuple, list[list[HeadSpec]]] = {}  # one plan per engine process and setting: the model and the log


def vllm_head_table(config, vllm_config) -> list[list[HeadSpec]]:
    """The head table duocal's model class (models.py) runs under `vllm_config`: the settings' plan
    (head_plan.py), for vLLM's tensor parallel size unless the settings name one, with the streaming head count
    fitted to vLLM's groups (`fitted_streaming_count`). vLLM groups one rank's layers, so under tensor parallelism
    the counts are per rank and the fitted plan is balanced again (whole heads per rank). Planned once per process
    for the same settings and engine sizes (a copy each call)."""
    block, length = vllm_config.cache_config.block_size, vllm_config.model_config.max_model_len
    dtype, tp_size = vllm_config.model_config.dtype, vllm_config.parallel_config.tensor_parallel_size
    settings = settings_of(config)
    key = (tuple(sorted(settings.items())), profile_version(settings.get("profile")), block, length, str(dtype),
           tp_size, vllm_config.max_in_flight_tokens, request_in_flight_tokens(vllm_config))  # fmt: skip
    if key not in PLANNED:
        PLANNED[key] = fitted_head_table(config, vllm_config)
    return [list(row) for row in PLANNED[key]]


def profile_version(where: str | None) -> tuple[int, int] | None:
    """(modified time, size) of a profile file, so that a file rewritten in place is planned again."""
    try:
        found = os.stat(where) if where else None
    except OSError:
        return None
    return None if found is None else (found.st_mtime_ns, found.st_size)


def fitted_head_table(config, vllm_config) -> list[list[HeadSpec]]:
    block, length = vllm_config.cache_config.block_size, vllm_config.model_config.max_model_len
    dtype, tp_size = vllm_config.model_config.dtype, vllm_config.parallel_config.tensor_parallel_size
    settings = settings_of(config)
    settings.setdefault("tensor_parallel", str(tp_size))
    profile, planned = make_plan(config, settings, dtype)
    table = head_table(planned, block)
    streaming = [spec for row in table for spec in row if not spec.is_full]
    total = sum(len(row) for row in table)
    if not streaming or len({(s.sink, s.recent) for s in streaming}) > 1:
        return table
    if int(settings["tensor_parallel"]) != tp_size:
        logger.info_once(
            "duocal: the plan is for tensor parallel size %s, vLLM runs %d: its streaming head count is kept as "
            "planned (not fitted to vLLM's KV cache groups)", settings["tensor_parallel"], tp_size,
        )  # fmt: skip
        return table
    kv_spec = SinkWindowSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=dtype, sink=streaming[0].sink,
                            sliding_window=streaming[0].recent,
                            request_in_flight_tokens=request_in_flight_tokens(vllm_config))  # fmt: skip
    per_rank = fitted_streaming_count(
        (total - len(streaming)) // tp_size, len(streaming) // tp_size, cdiv(length, block),
        kv_spec.max_admission_blocks_per_request(vllm_config.max_in_flight_tokens, length),
    )  # fmt: skip
    kept = per_rank * tp_size
    if kept == len(streaming):
        return table
    fitted = head_table(with_fewer_bounded(planned, profile, kept, tp_size), block)
    logger.info_once(
        "duocal: %d of the plan's %d streaming KV heads run full (the best scored): vLLM's KV cache groups then need "
        "fewer padding layers, and a request fewer bytes (%d full + %d sink_window)",
        len(streaming) - kept, len(streaming), total - kept, kept,
    )  # fmt: skip
    return fitted
