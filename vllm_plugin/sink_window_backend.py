"""Attention of a streaming head over vLLM's paged CPU cache: the first `sink` tokens plus the last `recent`.

`SinkWindowCPUBackend` is vLLM's CPU attention backend with its own metadata builder and implementation class,
one call over a layer's streaming heads (head_views.py); the KV cache write (`do_kv_cache_update`) and the cache
layout are the CPU backend's. When the sink is a whole
number of blocks and the window at least one block (virtual_tables.kernel_fits), the builder turns each step's
batch into virtual requests (virtual_tables.py), once per KV cache group (every streaming head with the same
sink and recent), and every call runs vLLM's own kernel (`cpu_attention_with_kv_cache`) on them with a window of
recent + sink: exact, prefill and decode alike. Otherwise each request gathers its visible keys and runs one
masked sdpa (sink_window_gather.py; slow), and the builder says once which block sizes would use the kernel.
"""

from __future__ import annotations

from dataclasses import replace

from vllm.logger import init_logger

from .head_plan import DuoVllmError
from .head_views import HeadGroupBuilder, HeadGroupImpl
from .sink_window_gather import gather_forward, page_layout  # noqa: F401 (page_layout: its tests import it from here)
from .virtual_tables import fitting_block_sizes, kernel_fits, virtual_batch
from .vllm_internals import (
    Attention,
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
    get_layers_from_vllm_config,
)

logger = init_logger(f"vllm.{__name__}")  # vLLM configures its handlers on the "vllm" logger only


class SinkWindowCPUImpl(HeadGroupImpl, CPUAttentionBackendImpl):
    """CPU attention with a sink + window mask over a layer's streaming heads (head_views.py). `sliding_window` is
    the kernel's window over virtual tables, recent + sink (`set_sink_window`); `sink` and `recent` are the
    heads' policy."""

    sink: int = 0
    recent: int = 0

    def set_sink_window(self, sink: int, recent: int) -> None:
        self.sink, self.recent = sink, recent
        self.sliding_window = recent + sink

    def attend(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, **kwargs):
        if kernel_fits(self.sink, self.recent, kv_cache.size(2)):  # the builder made virtual tables
            return super().attend(layer, query, key, value, kv_cache, attn_metadata, output, output_scale, **kwargs)
        return gather_forward(
            query, kv_cache, attn_metadata, output, isa=layer.isa, sink=self.sink, recent=self.recent, scale=self.scale
        )


class SinkWindowMetadataBuilder(HeadGroupBuilder, CPUAttentionMetadataBuilder):
    """vLLM's CPU metadata, built on virtual requests (one per segment) when the group's heads fit the kernel."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.sink, self.recent = self._group_sink_window()
        self.use_kernel = kernel_fits(self.sink, self.recent, self.block_size)
        if not self.use_kernel:
            sizes = fitting_block_sizes(self.sink, self.recent)
            advice = f"start vLLM with --block-size {sizes[0]} (block_size={sizes[0]})" if sizes else "none fits"
            logger.warning_once(
                f"duocal: streaming heads with sink {self.sink} / recent {self.recent} at block size "
                f"{self.block_size} run a per-request PyTorch gather (slow): vLLM's kernel needs the sink to be a "
                f"multiple of the block size and recent >= it; {advice}"
            )

    def _group_sink_window(self) -> tuple[int, int]:
        layers = get_layers_from_vllm_config(self.vllm_config, Attention, self.layer_names)
        found = {(layer.impl.sink, layer.impl.recent) for layer in layers.values()}
        if len(found) != 1:
            raise DuoVllmError(f"one KV cache group holds streaming heads of different sink/recent sizes: {found}")
        return found.pop()

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        if self.use_kernel:
            common_attn_metadata = self._virtual(common_attn_metadata)
        return super().build(common_prefix_len, common_attn_metadata, fast_build)

    def _virtual(self, common):
        n = common.num_reqs
        batch = virtual_batch(
            common.query_start_loc[: n + 1], common.seq_lens[:n], common.block_table_tensor[:n],
            self.sink, self.recent, self.block_size,
        )  # fmt: skip
        return replace(
            common, query_start_loc=batch.query_start_loc, query_start_loc_cpu=batch.query_start_loc,
            seq_lens=batch.seq_lens, num_reqs=batch.num_reqs, max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len, block_table_tensor=batch.block_table,
        )  # fmt: skip


class SinkWindowCPUBackend(CPUAttentionBackend):
    """vLLM's CPU backend with `SinkWindowCPUImpl` and `SinkWindowMetadataBuilder`."""

    @staticmethod
    def get_impl_cls() -> type[SinkWindowCPUImpl]:
        return SinkWindowCPUImpl

    @staticmethod
    def get_builder_cls() -> type[SinkWindowMetadataBuilder]:
        return SinkWindowMetadataBuilder
