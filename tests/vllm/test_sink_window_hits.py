"""Prefix-cache hits of streaming heads (`SinkWindowManager`), no engine: the lookup against a brute-force oracle of
cache states, then vLLM's own `KVCacheManager` (a mixed plan: one full group, two sink + recent groups sharing one
block pool) driven as its scheduler drives it, request by request, chunk by chunk."""

import itertools
import random

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request

from duocal_vllm.sink_window_manager import hit_reads, longest_hit
from duocal_vllm.sink_window_spec import SinkWindowSpec

BLOCK, SINK, RECENT = 16, 16, 64  # one sink block; a hit reads the 4 blocks before it (63 keys)
PAGE = dict(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
SPEC = SinkWindowSpec(sink=SINK, sliding_window=RECENT, **PAGE)
DOCUMENT = list(range(1000, 1000 + 20 * BLOCK))  # 320 tokens: hits can end at the document's last block


def keys_read(hit: int, sink: int, recent: int) -> set[int]:
    """Token oracle: the keys queries at positions >= `hit` read that lie before it (duocal's `SinkWindow.sees`:
    a query at q sees keys < sink and in (q - recent, q]; later queries see later keys only)."""
    return {k for k in range(hit) if k < sink or k > hit - recent}


@pytest.mark.parametrize(("sink", "recent", "block"), [(16, 64, 16), (64, 512, 64), (4, 100, 32), (64, 32, 32)])
def test_a_hit_reads_the_blocks_holding_the_keys_its_queries_see(sink, recent, block):
    sink_blocks, recent_blocks = -(-sink // block), -(-(recent - 1) // block)
    for n in range(0, 40):
        blocks = sorted({k // block for k in keys_read(n * block, sink, recent)})
        assert hit_reads(n, sink_blocks, recent_blocks) == blocks, n


def test_the_longest_hit_is_the_oracles_on_random_cache_states():
    rng = random.Random(0)
    for _ in range(3000):
        max_blocks, sink_blocks, recent_blocks = rng.randint(0, 24), rng.randint(1, 3), rng.randint(1, 5)
        step = rng.choice([1, 1, 2, 4])
        cached = {i for i in range(max_blocks) if rng.random() < rng.choice([0.5, 0.9, 1.0])}
        asked = []

        def is_cached(i, cached=cached, asked=asked):
            asked.append(i)
            return i in cached

        found = longest_hit(is_cached, max_blocks, sink_blocks, recent_blocks, step)
        oracle = max(n for n in range(0, max_blocks + 1, step)
                     if n == 0 or all(i in cached for i in hit_reads(n, sink_blocks, recent_blocks)))  # fmt: skip
        assert found == oracle, (max_blocks, sink_blocks, recent_blocks, step, sorted(cached))
        assert len(asked) == len(set(asked)), "a block's hash looked up twice"


def make_manager(num_blocks: int = 200, retention: int | None = None, groups: int = 2) -> KVCacheManager:
    """vLLM's KV cache manager of a mixed plan: group 0 full heads, then `groups` sink + recent groups."""
    specs = [FullAttentionSpec(**PAGE)] + [SPEC] * groups
    config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], prefix_cache_retention_interval=retention,
        kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)],
    )  # fmt: skip
    return KVCacheManager(config, max_model_len=2048, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                          max_in_flight_tokens=64)  # fmt: skip


init_none_hash(sha256)
HASHER = get_request_block_hasher(BLOCK, sha256)
IDS = itertools.count()


def request(tokens: list[int]) -> Request:
    return Request(f"r{next(IDS)}", tokens, SamplingParams(max_tokens=8), None, block_hasher=HASHER)


def prefill(manager: KVCacheManager, req: Request, chunk: int = 64) -> int:
    """Schedules `req`'s prompt as vLLM's scheduler does (its prefix-cache hit first, then chunks); its hit."""
    blocks, hit, req.shared_prefix_boundary = manager.get_computed_blocks(req)
    first = True
    while req.num_computed_tokens + (hit if first else 0) < req.num_prompt_tokens:
        start = req.num_computed_tokens + (hit if first else 0)
        n = min(chunk, req.num_prompt_tokens - start)
        got = manager.allocate_slots(req, n, hit if first else 0, blocks if first else None)
        assert got is not None, "the pool ran out"
        req.num_computed_tokens = start + n
        first = False
    return hit


def sink_group_blocks(manager: KVCacheManager, req: Request) -> list[list]:
    return [manager.coordinator.single_type_managers[g].req_to_blocks[req.request_id] for g in (1, 2)]


def test_a_documents_second_question_reuses_it_with_its_own_sinks():
    manager = make_manager()
    first = request(DOCUMENT + [1] * 40)
    assert prefill(manager, first) == 0
    first_sinks = [blocks[0] for blocks in sink_group_blocks(manager, first)]
    manager.free(first)
    second = request(DOCUMENT + [2] * 40)
    assert prefill(manager, second) == len(DOCUMENT)
    for blocks, sink in zip(sink_group_blocks(manager, second), first_sinks, strict=True):
        assert blocks[0] is sink and not sink.is_null  # the first request's sink block, not vLLM's null block
        assert all(block.is_null for block in blocks[1:16])  # between the sink and the window: nothing kept
        assert not any(block.is_null for block in blocks[16:])  # the 4 window blocks of the hit, then its own
        assert blocks[0].ref_cnt == 1
    manager.free(second)
    assert manager.block_pool.get_num_free_blocks() == 200 - 1  # every block back (less vLLM's null block)


def test_a_hit_fails_when_a_sink_block_is_evicted_though_its_recent_blocks_stay_cached():
    manager = make_manager()
    first = request(DOCUMENT + [1] * 40)
    prefill(manager, first)
    sink_ids = {blocks[0].block_id for blocks in sink_group_blocks(manager, first)}
    manager.free(first)
    second = request(DOCUMENT + [2] * 40)
    assert manager.get_computed_blocks(second)[1] == len(DOCUMENT)
    manager.block_pool.evict_blocks({min(sink_ids)})  # one sink group's sink only
    assert manager.get_computed_blocks(second)[1] == 0
    # vLLM's own sliding-window lookup checks the window only: it still reports the document
    coordinator = manager.coordinator
    _, plain = SlidingWindowManager.find_longest_cache_hit(
        second.block_hashes, len(DOCUMENT), [1, 2], coordinator.block_pool,
        SlidingWindowSpec(sliding_window=RECENT, **PAGE), False, BLOCK,
    )  # fmt: skip
    assert plain == len(DOCUMENT)


def test_vllms_default_retention_reuses_a_document_only_from_its_third_question_duocals_from_its_second():
    hits = {}
    for retention in (0, None):
        manager = make_manager(retention=retention)
        hits[retention] = []
        for question in range(3):
            req = request(DOCUMENT + [question + 1] * 40)
            hits[retention].append(prefill(manager, req))
            manager.free(req)
    assert hits[None] == [0, len(DOCUMENT), len(DOCUMENT)]
    assert hits[0][1] < len(DOCUMENT) and hits[0][2] == len(DOCUMENT)


def test_the_blocks_counted_for_a_hit_are_the_free_blocks_it_takes():
    """A hit touches cached blocks that sit in the free queue (the sinks among them): the count vLLM checks against
    the free blocks must be what allocation then takes, or a hit at a full pool fails mid-allocation."""
    manager = make_manager()
    first = request(DOCUMENT + [1] * 40)
    prefill(manager, first)
    manager.free(first)
    second = request(DOCUMENT + [2] * 40)
    blocks, hit, _ = manager.get_computed_blocks(second)
    coordinator = manager.coordinator
    counted = coordinator.get_num_blocks_to_allocate(
        request_id=second.request_id, num_tokens=hit + 32, new_computed_blocks=blocks.blocks, num_encoder_tokens=0,
        total_computed_tokens=hit, num_local_computed_tokens=hit, num_tokens_main_model=hit + 32,
    )  # fmt: skip
    free = manager.block_pool.get_num_free_blocks()
    assert manager.allocate_slots(second, 32, hit, blocks) is not None
    assert free - manager.block_pool.get_num_free_blocks() == counted


def test_a_hit_request_is_reserved_at_least_what_it_takes_at_its_peak():
    manager = make_manager()
    first = request(DOCUMENT + [1] * 40)
    prefill(manager, first)
    manager.free(first)
    second = request(DOCUMENT + [2] * 200)  # 200 tokens after the hit: several chunks
    blocks, hit, _ = manager.get_computed_blocks(second)
    reserved = manager.coordinator.get_num_blocks_to_allocate(
        request_id=second.request_id, num_tokens=second.num_tokens, new_computed_blocks=blocks.blocks,
        num_encoder_tokens=0, total_computed_tokens=hit, num_local_computed_tokens=hit,
        num_tokens_main_model=second.num_tokens, apply_admission_cap=True,
    )  # fmt: skip
    free = manager.block_pool.get_num_free_blocks()
    assert prefill(manager, second) == hit
    assert free - manager.block_pool.get_num_free_blocks() <= reserved  # held at the prefill's end: its peak
    assert reserved >= 3 * (1 + 4)  # each group at least its window and sinks


def test_a_prompt_inside_the_sinks_or_diverging_inside_the_last_block_hits_only_whole_matching_blocks():
    manager = make_manager()
    short = request([5] * 10)  # shorter than one block (and than the sink)
    assert prefill(manager, short) == 0
    manager.free(short)
    assert prefill(manager, request([5] * 10)) == 0
    first = request(DOCUMENT + [1] * 40)
    prefill(manager, first)
    manager.free(first)
    diverging = request(DOCUMENT[:-5] + [7] * 45)  # differs 5 tokens before the document's last block ends
    assert prefill(manager, diverging) == len(DOCUMENT) - BLOCK


def test_a_new_document_into_a_pool_full_of_cached_blocks_evicts_them_and_older_hits_end_cleanly():
    """60 blocks: one document (3 groups x 23 blocks, less what the window frees) fills most of it; freed, its
    blocks stay cached. A second document must evict them; afterwards the first one's hit is gone or shorter,
    never pointing at a reused block, and every block comes back free."""
    manager = make_manager(num_blocks=60)
    first = request(DOCUMENT + [1] * 40)
    prefill(manager, first)
    manager.free(first)
    other = request([d + 5000 for d in DOCUMENT] + [1] * 40)
    assert prefill(manager, other) == 0
    manager.free(other)
    again = request(DOCUMENT + [2] * 40)
    blocks, hit, _ = manager.get_computed_blocks(again)
    for group in blocks.blocks:
        assert all(block.is_null or block.block_hash is not None for block in group)  # only blocks still cached
    assert prefill(manager, again) == hit < len(DOCUMENT)
    manager.free(again)
    assert manager.block_pool.get_num_free_blocks() == 60 - 1
