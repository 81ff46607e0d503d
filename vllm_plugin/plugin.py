"""vLLM's entry points into duocal: `register` (``vllm.general_plugins``) and `DuoKVTokensLog`
(``vllm.stat_logger_plugins``).

vLLM calls `register()` in every process it starts (engine core and workers), before it builds models or KV
cache managers. Its OpenAI server (AsyncLLM) creates `DuoKVTokensLog` once the engine has sized its KV cache:
one start-up line with the KV tokens of a duocal plan as a ratio to stock vLLM in the same space. vLLM's own
line ("KV cache size: N tokens, Maximum concurrency for L tokens per request: X") already counts what its
scheduler admits under the per-head layout (`SinkWindowSpec.max_admission_blocks_per_request`); the stock
figure is vLLM's arithmetic for the plain model: blocks of `block_size` tokens of every layer and KV head (of one
rank under tensor parallelism: the space is per rank) in the configured space, then blocks per request at
`max_model_len`. Models without a duocal plan get no line.
"""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.metrics.loggers import StatLoggerBase

from duocal_runtime.planning.sizes import GiB

from .head_plan import DUO_ARCHITECTURES, config_head_dim
from .version import check_vllm_version, installed_vllm

ARCHITECTURES = {duo: f"duocal_vllm.models:{duo}" for duo in DUO_ARCHITECTURES.values()}
logger = init_logger(f"vllm.{__name__}")  # vLLM configures its handlers on the "vllm" logger only


def register() -> None:
    """Check vLLM's version, then register the model classes (lazily, by name) and the sink + recent KV cache
    spec. An untested vLLM is refused here, before anything of vLLM's internals is imported (version.py)."""
    check_vllm_version(installed_vllm())
    from vllm import ModelRegistry

    from . import sink_window_spec

    for name, where in ARCHITECTURES.items():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, where)
    sink_window_spec.register_spec()


def stock_kv_tokens(space_bytes: int, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int,
                    block_size: int, max_model_len: int) -> int:  # fmt: skip
    """The "KV cache size: N tokens" stock vLLM reports for a plain model in `space_bytes` of KV."""
    blocks = space_bytes // (layers * 2 * kv_heads * head_dim * dtype_bytes * block_size)
    return int(blocks / -(-max_model_len // block_size) * max_model_len)


def kv_tokens_line(vllm_config) -> str | None:
    """The duocal line for an engine that runs one of duocal's model classes; None for any other model, or without
    a reported KV size."""
    model, cache = vllm_config.model_config, vllm_config.cache_config
    config = model.hf_config
    tokens = cache.kv_cache_size_tokens
    if not set(ARCHITECTURES) & set(getattr(config, "architectures", None) or []) or tokens is None:
        return None
    from .group_fit import vllm_head_table

    heads = [spec for row in vllm_head_table(config, vllm_config) for spec in row]
    plan = f"plan: {sum(s.is_full for s in heads)} full + {sum(not s.is_full for s in heads)} sink_window KV heads"
    space = cache.kv_cache_memory_bytes
    if space is None or cache.cache_dtype != "auto":
        return f"duocal: KV cache size {tokens:,} tokens; {plan} (no stock comparison without a fixed KV space)"
    head_dim = config_head_dim(config)  # the size vLLM built: models.check_head_size refuses any other
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    kv_heads = max(1, config.num_key_value_heads // tp_size)  # one rank's, in its space (1: vLLM replicates a head)
    stock = stock_kv_tokens(space, config.num_hidden_layers, kv_heads, head_dim, model.dtype.itemsize,
                            cache.block_size, model.max_model_len)  # fmt: skip
    return (
        f"duocal: KV cache size {tokens:,} tokens = {tokens / stock:.2f}x the {stock:,} tokens stock vLLM holds in "
        f"the same {space / GiB:g} GiB (max_model_len {model.max_model_len}, max_num_batched_tokens "
        f"{vllm_config.scheduler_config.max_num_batched_tokens}); {plan}"
    )


class DuoKVTokensLog(StatLoggerBase):
    """Logs `kv_tokens_line` once the engine is up; records nothing else."""

    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        self.vllm_config = vllm_config

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        pass

    def log_engine_initialized(self) -> None:
        line = kv_tokens_line(self.vllm_config)
        if line is not None:
            logger.info(line)
