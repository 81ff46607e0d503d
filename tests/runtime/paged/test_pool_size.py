"""KV bytes have one owner per storage kind (runtime/quant/codes.py) and a pool's size one owner
(runtime/paged/pool_size.py): policies, the paged cache, the benchmarks and `duocal serve` all agree with it."""

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.paged.pool_size import plain_block_bytes, plain_request_bytes, pool_blocks, pool_config
from duocal_runtime.quant.codes import plain_bytes, quantized_bytes, token_quantized_bytes

SHAPE = dr.ModelShape(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=64)


def test_plain_bytes_are_keys_and_values_of_every_token():
    assert plain_bytes(10, 64, 2) == 2 * 10 * 64 * 2
    assert quantized_bytes(10, 64, 16, 32, 128, 2) == plain_bytes(10, 64, 2)
    assert token_quantized_bytes(10, 64, 16, 32, 2) == plain_bytes(10, 64, 2)
    # 4-bit tokens quantized alone: 32 bytes of codes + a scale and a zero per 32 channels (2 groups, 2 bytes each)
    assert token_quantized_bytes(10, 64, 4, 32, 2) == 2 * 10 * (32 + 2 * 2 * 2)
    # 300 tokens, group 32, residual 128: 160 quantized (5 groups), 140 in full precision
    quantized = 2 * 160 * 64 * 4 // 8 + 2 * 5 * 64 * 2 + 2 * 160 * 2 * 2
    assert quantized_bytes(300, 64, 4, 32, 128, 2) == quantized + plain_bytes(140, 64, 2)


@pytest.mark.parametrize(
    "policy, stored",
    [
        (dr.Full(), lambda n: plain_bytes(n, 64, 2)),
        (dr.SinkWindow(sink=4, recent=60), lambda n: plain_bytes(min(n, 64), 64, 2)),
        (dr.H2O(heavy=32, recent=32), lambda n: plain_bytes(min(n, 64), 64, 2)),
        (dr.H2O(heavy=32, recent=32, kv_bits=4), lambda n: token_quantized_bytes(min(n, 64), 64, 4, 32, 2)),
        (dr.Full(kv_bits=8), lambda n: quantized_bytes(n, 64, 8, 32, 128, 2)),
    ],
    ids=lambda p: getattr(p, "label", ""),
)
def test_every_policy_counts_its_bytes_with_its_storage_kind(policy, stored):
    for n in (1, 64, 300, 1000):
        assert policy.kv_bytes(n, 64, 2) == stored(n)


def test_a_plain_block_is_every_kv_head_of_every_layer_for_a_page():
    assert plain_block_bytes(SHAPE, torch.bfloat16, 16) == 3 * 2 * 2 * 64 * 2 * 16
    assert plain_block_bytes(SHAPE, torch.float32, 32) == 4 * plain_block_bytes(SHAPE, torch.bfloat16, 16)
    assert plain_request_bytes(SHAPE, torch.bfloat16, 17, 16) == 2 * plain_block_bytes(SHAPE, torch.bfloat16, 16)


def test_pool_blocks_are_whole_blocks_and_the_config_carries_them():
    block = plain_block_bytes(SHAPE, torch.bfloat16, 16)
    assert pool_blocks(10 * block + block - 1, SHAPE, torch.bfloat16, 16) == 10
    assert pool_blocks(block - 1, SHAPE, torch.bfloat16, 16) == 0
    config = pool_config(32, 7, 512, allow_block_sharing=False)
    assert (config.page_size, config.num_blocks, config.max_batch_tokens) == (32, 7, 512)
    assert config.allow_block_sharing is False
