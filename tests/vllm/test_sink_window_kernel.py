"""Streaming heads through vLLM's CPU paged-attention kernel on virtual block tables (vllm_plugin/virtual_tables.py)
give duocal's sink + window attention (`SinkWindow.sees`): decode and prefill chunks in one batch, positions around
every boundary, fp32 and bf16, a group of query heads per KV head. No engine: the kernel ops run on plain tensors,
and blocks vLLM has already freed (between the sinks and the window) are poisoned in the block table."""

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from vllm import _custom_ops as ops
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from duocal_runtime.policies.sink_window import SinkWindow
from duocal_vllm.sink_window_backend import SinkWindowCPUImpl, SinkWindowMetadataBuilder
from duocal_vllm.sink_window_gather import gather_forward
from duocal_vllm.virtual_tables import fitting_block_sizes, kernel_fits, virtual_batch

D = 64
POISON = 1e4


def make_batch(cases, sink, recent, block_size, kv_heads, heads, dtype, seed=0):
    """cases: (seq_len, query_len) per request. -> (query, kv_cache, common metadata, keys, values)."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per = [-(-seq // block_size) for seq, _ in cases]
    columns, num_blocks = max(blocks_per) + 2, sum(blocks_per) + 1  # block 0: the poisoned "freed" block
    kv_cache = torch.zeros(num_blocks, kv_heads, 2 * block_size, D, dtype=dtype)
    key_cache, value_cache = kv_cache.chunk(2, dim=2)
    isa = _get_attn_isa(dtype, block_size, D)
    poison = torch.full((block_size, kv_heads, D), POISON, dtype=dtype)
    ops.cpu_attn_reshape_and_cache(poison, poison, key_cache, value_cache, torch.arange(block_size), isa)
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    table = torch.zeros(len(cases), columns, dtype=torch.int32)
    keys, values, queries, slots = [], [], [], []
    for r, (seq, n) in enumerate(cases):
        mine = [ids.pop() for _ in range(blocks_per[r])]
        k = torch.randn(seq, kv_heads, D, generator=gen).to(dtype)
        v = torch.randn(seq, kv_heads, D, generator=gen).to(dtype)
        where = torch.tensor(mine)[torch.arange(seq) // block_size] * block_size + torch.arange(seq) % block_size
        ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, where, isa)
        table[r, : len(mine)] = torch.tensor(mine, dtype=torch.int32)
        freed_to = max(0, seq - n - recent + 1) // block_size  # vLLM frees blocks before the first query's window
        table[r, -(-sink // block_size) : freed_to] = 0
        keys.append(k), values.append(v), slots.append(where[seq - n :])
        queries.append(torch.randn(n, heads, D, generator=gen).to(dtype))
    qsl = torch.tensor([0] + [n for _, n in cases]).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([seq for seq, _ in cases], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq_lens, num_reqs=len(cases),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(n for _, n in cases), max_seq_len=int(seq_lens.max()),
        block_table_tensor=table, slot_mapping=torch.cat(slots),
    )  # fmt: skip
    return torch.cat(queries), kv_cache, common, keys, values, isa


def reference(query, common, keys, values, sink, recent):
    """Dense sdpa over each request's own keys, masked by duocal's `SinkWindow.sees`, in float32."""
    policy, outs, starts = SinkWindow(sink=sink, recent=recent), [], common.query_start_loc.tolist()
    for r, (k, v) in enumerate(zip(keys, values, strict=True)):
        q = query[starts[r] : starts[r + 1]].float().transpose(0, 1)  # [H, n, D]
        seq, n = k.shape[0], q.shape[1]
        mask = policy.sees(torch.arange(seq - n, seq)[:, None], torch.arange(seq)[None, :])
        group = q.shape[0] // k.shape[1]
        kk = k.float().transpose(0, 1).repeat_interleave(group, 0)
        vv = v.float().transpose(0, 1).repeat_interleave(group, 0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=D**-0.5))
    return torch.cat([o.transpose(0, 1) for o in outs])


def builder_for(sink, recent, block_size, kv_heads, heads, dtype, isa):
    """The metadata builder with the fields vLLM's constructor derives from the engine config."""
    builder = object.__new__(SinkWindowMetadataBuilder)
    builder.__dict__.update(
        num_heads=heads, num_kv_heads=kv_heads, head_dim=D, dtype=dtype, window_size=recent + sink,
        block_size=block_size, kv_cache_dtype="auto", isa=isa, is_cross_attention=False,
        is_encoder_only_attention=False, sink=sink, recent=recent, use_kernel=kernel_fits(sink, recent, block_size),
    )  # fmt: skip
    return builder


def run_head(query, kv_cache, common, sink, recent, kv_heads, isa):
    heads, block_size = query.shape[1], kv_cache.shape[2] // 2
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=query.dtype))  # what the impl reads of it
    with mock.patch("vllm.v1.attention.backends.cpu_attn.get_current_vllm_config", return_value=config):
        impl = SinkWindowCPUImpl(heads, D, D**-0.5, kv_heads, None, recent, "auto")
    impl.set_sink_window(sink, recent)
    metadata = builder_for(sink, recent, block_size, kv_heads, heads, query.dtype, isa).build(0, common)
    layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)
    output = torch.full_like(query, float("nan"))
    kv = kv_cache.view(kv_cache.shape[0], kv_heads, block_size, 2 * D)
    return impl.attend(layer, query, query, query, kv, metadata, output)  # the keys are in the cache already


def boundary_cases(sink, recent, block_size):
    """(seq_len, query_len): decodes at and around S + W and block edges, and prefill chunks across them."""
    edge = sink + recent
    decodes = {1, 2, 40, edge - 1, edge, edge + 1, edge + 2, edge + block_size - 1, edge + block_size,
               edge + block_size + 1, 3 * block_size + edge, 3 * block_size + edge + 1, 1000}  # fmt: skip
    chunks = [(edge + 70, edge + 70), (edge + 300, 250), (700, 2), (edge + block_size + 5, block_size + 7)]
    return [(seq, 1) for seq in sorted(decodes)] + chunks


SHAPES = [  # sink, recent, block size
    (64, 128, 64), (64, 128, 32), (32, 128, 32), (32, 100, 32), (128, 512, 128), (64, 32, 32),
]  # fmt: skip


@pytest.mark.parametrize("sink,recent,block_size", SHAPES)
@pytest.mark.parametrize("kv_heads,heads", [(1, 3), (2, 4)])
def test_the_kernel_on_virtual_tables_is_sink_window_attention_fp32(sink, recent, block_size, kv_heads, heads):
    cases = boundary_cases(sink, recent, block_size)
    query, kv_cache, common, keys, values, isa = make_batch(
        cases, sink, recent, block_size, kv_heads, heads, torch.float32
    )
    out = run_head(query, kv_cache, common, sink, recent, kv_heads, isa)
    torch.testing.assert_close(out, reference(query, common, keys, values, sink, recent), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("sink,recent,block_size", [(64, 128, 64), (64, 512, 128), (32, 128, 128)])
def test_bf16_matches_the_reference_and_the_gather_path(sink, recent, block_size):
    cases = boundary_cases(sink, recent, block_size)
    query, kv_cache, common, keys, values, isa = make_batch(cases, sink, recent, block_size, 1, 3, torch.bfloat16)
    out = run_head(query, kv_cache, common, sink, recent, 1, isa)
    expected = reference(query, common, keys, values, sink, recent)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    real = builder_for(sink, recent, block_size, 1, 3, torch.bfloat16, isa)
    real.use_kernel = False  # the real tables, as for a head the kernel does not fit
    gathered = gather_forward(query, kv_cache.view(kv_cache.shape[0], 1, block_size, 2 * D), real.build(0, common),
                              torch.zeros_like(query), isa=isa, sink=sink, recent=recent, scale=D**-0.5)  # fmt: skip
    torch.testing.assert_close(gathered.float(), expected, atol=2e-2, rtol=2e-2)


def test_a_decode_step_is_one_virtual_request_per_request_and_a_chunk_one_per_recent_block():
    sink, recent, block = 64, 128, 32
    qsl = torch.tensor([0, 1, 2, 102], dtype=torch.int32)
    seq_lens = torch.tensor([100, 500, 400], dtype=torch.int32)  # the last: queries at 300..399
    table = torch.arange(3 * 16, dtype=torch.int32).view(3, 16)
    batch = virtual_batch(qsl, seq_lens, table, sink, recent, block)
    # request 0: q=99 < S+W sees all (its own table); request 1: q=499, f=(499-127)//32=11
    assert batch.seq_lens[:2].tolist() == [100, block + sink + 500 - 12 * block]
    assert batch.block_table[0].tolist() == table[0].tolist()
    assert batch.block_table[1, :5].tolist() == [16 + 11, 16 + 0, 16 + 1, 16 + 12, 16 + 13]
    # request 2: q=300..399 -> f = 5 (300..318), 6, 7, 8 (396..399)
    assert batch.query_start_loc.tolist() == [0, 1, 2, 21, 53, 85, 102]
    assert batch.max_query_len == 32 and batch.max_seq_len == int(batch.seq_lens.max())


def test_heads_whose_sink_is_not_whole_blocks_do_not_fit_the_kernel():
    assert not kernel_fits(64, 512, 128) and kernel_fits(64, 512, 64) and not kernel_fits(64, 32, 64)
    assert fitting_block_sizes(64, 512) == [64, 32]
    assert fitting_block_sizes(16, 512) == []
