"""How vLLM groups the KV cache layers of streaming heads (`SinkWindowSpec`): one KV cache group holds only heads
of one sink and one window, because the group's manager frees every block but the first ceil(sink / block) and the
window (vLLM's `UniformTypeKVCacheSpecs`, no engine)."""

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, UniformTypeKVCacheSpecs

from duocal_vllm.sink_window_spec import SinkWindowSpec

PAGE = dict(block_size=64, num_kv_heads=1, head_size=64, dtype=torch.float32)


def streaming(sink: int = 64, recent: int = 512) -> SinkWindowSpec:
    return SinkWindowSpec(sink=sink, sliding_window=recent, **PAGE)


def test_streaming_heads_of_one_sink_and_recent_share_a_group():
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": streaming(), "b": streaming()})


def test_streaming_heads_with_other_sinks_recents_or_plain_sliding_layers_do_not():
    """`SlidingWindowSpec`'s own check compares the window only: with it, a sink of 128 would share the group of a
    sink of 64 (and keep half its sink blocks), and a plain sliding-window layer would keep sink blocks it never
    reads."""
    for other in (streaming(sink=128), streaming(recent=256), SlidingWindowSpec(sliding_window=512, **PAGE),
                  FullAttentionSpec(**PAGE)):  # fmt: skip
        assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": streaming(), "b": other}), other
    for other in (streaming(sink=128), FullAttentionSpec(**PAGE)):  # the first layer's spec decides
        assert not UniformTypeKVCacheSpecs.is_uniform_type({"b": other, "a": streaming()}), other
