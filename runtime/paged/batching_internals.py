"""Every name the paged cache takes from transformers' continuous batching
(`transformers.generation.continuous_batching`), in one place.

They were read in transformers 5.24 (the version duocal pins). These are not transformers' documented interface:
when transformers moves, this is the file to check name by name; the comment on each group says what duocal relies
on it for.
"""

# ruff: noqa: F401  (re-exports)
from transformers import ContinuousBatchingConfig  # the engine's settings: pool size, page size, batch tokens

# the paged cache's pieces: duocal's pool is a `PagedAttentionCache` whose groups hand out pages of a `CachePool`
# through allocators (`CacheAllocator`); the memory handler sizes a pool from free memory
from transformers.generation.continuous_batching.cache import PagedAttentionCache, PagedAttentionMemoryHandler
from transformers.generation.continuous_batching.cache_allocators import CacheAllocator
from transformers.generation.continuous_batching.cache_allocators.cache_pool import CachePool

# the manager duocal's subclasses: its batch processor, scheduler classes by name, the config update that follows
# the cache's creation, and the request state it hands back
from transformers.generation.continuous_batching.continuous_api import (
    SCHEDULER_MAPPING,
    ContinuousBatchingManager,
    ContinuousBatchProcessor,
    FIFOScheduler,
    update_cb_config_after_cache_creation,
)
from transformers.generation.continuous_batching.requests import RequestState
