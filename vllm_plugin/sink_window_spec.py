"""The KV cache spec of a streaming head: the first `sink` tokens plus a sliding window of `recent`.

`SinkWindowSpec` is a `SlidingWindowSpec` (window = `recent`) that also keeps the first
ceil(sink / block_size) blocks; `SinkWindowManager` frees only the blocks between them and the
window. Both go through vLLM's KV cache spec registry (vllm/v1/kv_cache_spec_registry.py), with
this spec as its own grouping base, so streaming layers get their own KV cache group.

Prefix caching: `find_longest_cache_hit` reports no hit (a hit would need the sink blocks and the
window blocks, which vLLM's sliding-window lookup does not check), and vLLM's hybrid lookup keeps the
shortest hit of all groups, so while a plan has streaming heads no prompt reuses cached blocks: prefix
caching is off in effect, and the first manager says so in one log line. Full heads alone (an all-full plan)
cache as in stock vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.logger import init_logger
from vllm.utils.math_utils import cdiv
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import KVCacheSpec, SlidingWindowSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

logger = init_logger(f"vllm.{__name__}")  # vLLM configures its handlers on the "vllm" logger only
PREFIX_CACHING_OFF = (
    "duocal: prefix caching is off in effect: a plan with sink_window heads reuses no cached prefix (a hit would "
    "need each streaming head's sink blocks, which vLLM's sliding-window lookup does not check); every prompt "
    "is computed in full"
)


@dataclass(frozen=True, kw_only=True)
class SinkWindowSpec(SlidingWindowSpec):
    """Sliding window of `sliding_window` tokens plus the blocks holding the first `sink` tokens."""

    sink: int = 0

    @property
    def sink_blocks(self) -> int:
        return cdiv(self.sink, self.block_size)

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        window = super().max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
        return min(window + self.sink_blocks, cdiv(max_model_len, self.block_size) + 1)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        return all(
            isinstance(spec, SinkWindowSpec) and (spec.sliding_window, spec.sink) == (self.sliding_window, self.sink)
            for spec in kv_cache_specs.values()
        )


class SinkWindowManager(SlidingWindowManager):
    """Frees the blocks between the sink blocks and the window; never frees the sink blocks."""

    def __init__(self, kv_cache_spec: SinkWindowSpec, **kwargs) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sink_blocks = kv_cache_spec.sink_blocks
        if self.enable_caching:
            logger.info_once(PREFIX_CACHING_OFF)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        del num_prompt_tokens
        skipped = self.get_num_skipped_tokens(processed_computed_tokens)
        if skipped <= 0 or request_id not in self.req_to_blocks:
            return
        last = min(skipped // self.block_size, len(self.req_to_blocks[request_id]))
        self._remove_blocks_in_range(request_id, self.sink_blocks, last)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, *args, **kwargs):
        return tuple([] for _ in kv_cache_group_ids), 0


def register_spec() -> None:
    """Register the spec (idempotent). vLLM registers its built-in specs only while its registry is
    empty, so the built-ins are registered first (the public check does it), else they never would be."""
    KVCacheSpecRegistry.check_kv_cache_spec_registry({})
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager, uniform_type_base_spec=SinkWindowSpec)


register_spec()
