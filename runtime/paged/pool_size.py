"""A KV pool's size as transformers' continuous batching counts it: blocks of `page_size` tokens of the
plain model (every KV head of every layer, keys and values in the cache's dtype). The one place that
turns bytes into blocks and blocks into the engine's config; the paged cache turns blocks into its
own sectors (paged_cache.py)."""

from __future__ import annotations

from ..quant.codes import plain_bytes


def plain_block_bytes(shape, dtype, page_size: int) -> int:
    """Bytes of `page_size` tokens of every KV head of every layer of `shape` (a `ModelShape`) in
    `dtype` (a torch dtype): one of transformers' `num_blocks`."""
    return shape.num_kv_heads_total * plain_bytes(page_size, shape.head_dim, dtype.itemsize)


def plain_request_bytes(shape, dtype, tokens: int, page_size: int) -> int:
    """Bytes plain attention's paged cache takes for one request of `tokens` tokens (whole pages)."""
    return -(-tokens // page_size) * plain_block_bytes(shape, dtype, page_size)


def pool_blocks(kv_bytes: float, shape, dtype, page_size: int) -> int:
    """The whole blocks of `page_size` tokens that `kv_bytes` holds (0 if it holds none)."""
    return int(kv_bytes // plain_block_bytes(shape, dtype, page_size))


def pool_config(page_size: int, num_blocks: int | None, max_batch_tokens: int | None = None, **engine):
    """transformers' `ContinuousBatchingConfig` for a pool of `num_blocks` (None: sized by transformers
    from free memory); `engine`: its other fields."""
    from .batching_internals import ContinuousBatchingConfig

    return ContinuousBatchingConfig(
        page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, **engine
    )
