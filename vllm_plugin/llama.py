"""`DuoLlamaForCausalLM`: vLLM's Llama with one attention module per KV head, each with its plan's policy.

A full head is a stock vLLM `Attention` (its query group, one KV head, `FullAttentionSpec`); a
sink_window head is a `SinkWindowAttention` (sink_window_spec.py, sink_window_backend.py). The
projections, RoPE, MLP, weights and weight loading are vLLM's Llama ones: only the attention module
of each decoder layer changes (vLLM's `LlamaDecoderLayer` takes `attn_layer_type`). Per-head modules
are named ``attn_kv_<letters>`` (letters: the head's slot, rank_heads.py) because vLLM reads the layer index as
the only number in a name. An all-full plan builds vLLM's own layers (one attention module per layer). Under
tensor parallelism each rank builds modules for its own KV heads only (rank_heads.py); the plan is balanced for
vLLM's size unless the settings ask for another one, and an unbalanced plan is refused naming its layers.
"""

from __future__ import annotations

import functools
import string

import torch
from torch import nn
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM

from .group_fit import vllm_head_table
from .head_plan import HeadSpec, check_streaming_heads_run_here
from .rank_heads import rank_table
from .sink_window_backend import SinkWindowCPUBackend
from .sink_window_spec import SinkWindowSpec, check_lone_request_fits, request_in_flight_tokens
from .vllm_internals import (
    Attention,
    VllmConfig,
    current_platform,
    extract_layer_index,
    get_kv_quant_mode,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    kv_cache_dtype_str_to_dtype,
)


def head_name(kv_head: int) -> str:
    """``a``, ``b``, ..., ``z``, ``ba``, ...: a per-head suffix without digits."""
    letters, n = "", kv_head
    while True:
        letters = string.ascii_lowercase[n % 26] + letters
        n //= 26
        if n == 0:
            return letters


class SinkWindowAttention(Attention):
    """One streaming KV head: attends to the first `sink` and the last `recent` tokens, and reports a
    `SinkWindowSpec` so that vLLM's KV cache manager frees the blocks in between."""

    def __init__(self, *args, sink: int, recent: int, **kwargs) -> None:
        super().__init__(*args, per_layer_sliding_window=recent, attn_backend=SinkWindowCPUBackend, **kwargs)
        self.sink = sink
        self.impl.set_sink_window(sink, recent)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> SinkWindowSpec:
        return SinkWindowSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            head_size_v=self.head_size_v,
            dtype=self.kv_cache_torch_dtype,
            kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),
            sliding_window=self.sliding_window,
            sink=self.sink,
            request_in_flight_tokens=request_in_flight_tokens(vllm_config),
        )


class DuoLlamaAttention(nn.Module):
    """Llama attention (vLLM's projections and RoPE) with one attention module per KV head."""

    def __init__(self, *, config, hidden_size, num_heads, num_kv_heads, max_position_embeddings=8192,
                 quant_config=None, bias=False, bias_o_proj=False, cache_config=None, prefix="",
                 attn_type=None, head_table=None) -> None:  # fmt: skip
        super().__init__()
        del attn_type
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // num_heads
        self.group = num_heads // num_kv_heads
        tp_size = get_tensor_model_parallel_world_size()  # this rank's share of the heads (rank_heads.py)
        self.q_size, self.kv_size = num_heads // tp_size * self.head_dim, num_kv_heads // tp_size * self.head_dim
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, num_heads, num_kv_heads, bias=bias, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            num_heads * self.head_dim, hidden_size, bias=bias_o_proj, quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        self.rotary_emb = get_rope(
            self.head_dim, max_position=max_position_embeddings,
            rope_parameters=getattr(config, "rope_parameters", None), is_neox_style=True,
        )  # fmt: skip
        specs: list[HeadSpec] = head_table[extract_layer_index(prefix)]
        self.heads = nn.ModuleList(self._head(spec, cache_config, quant_config, prefix) for spec in specs)

    def _head(self, spec: HeadSpec, cache_config, quant_config, prefix: str) -> Attention:
        args = (self.group, self.head_dim, self.head_dim**-0.5)
        kwargs = dict(num_kv_heads=1, cache_config=cache_config, quant_config=quant_config)
        name = f"{prefix}.attn_kv_{head_name(spec.slot)}"
        if spec.is_full:
            return Attention(*args, prefix=name, **kwargs)
        return SinkWindowAttention(*args, sink=spec.sink, recent=spec.recent, prefix=name, **kwargs)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        qs = q.split(self.group * self.head_dim, dim=-1)
        ks, vs = k.split(self.head_dim, dim=-1), v.split(self.head_dim, dim=-1)
        out = torch.cat([head(qh, kh, vh) for head, qh, kh, vh in zip(self.heads, qs, ks, vs)], dim=-1)
        output, _ = self.o_proj(out)
        return output


class DuoLlamaDecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama decoder layer with `DuoLlamaAttention`."""

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config=None, head_table=None) -> None:
        attn = functools.partial(DuoLlamaAttention, head_table=head_table)
        super().__init__(vllm_config, prefix=prefix, config=config, attn_layer_type=attn)


class DuoLlamaForCausalLM(LlamaForCausalLM):
    """vLLM's `LlamaForCausalLM` running a duocal plan (settings: head_plan.py). An all-full plan is vLLM's own
    model, one attention module per layer: per-head modules would cost three kernel calls per layer for nothing."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        config = vllm_config.model_config.hf_config
        table = vllm_head_table(config, vllm_config)
        if all(spec.is_full for row in table for spec in row):  # vLLM's own layers (and its KV head sharding)
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            return
        check_streaming_heads_run_here(table, current_platform.device_name, current_platform.is_cpu())
        table = rank_table(table, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())
        head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_dtype = kv_cache_dtype_str_to_dtype(vllm_config.cache_config.cache_dtype, vllm_config.model_config)
        check_lone_request_fits(table, vllm_config, head_size, kv_dtype)  # this rank's heads, in their KV dtype
        layer = functools.partial(DuoLlamaDecoderLayer, head_table=table)
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer)
