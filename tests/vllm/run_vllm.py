"""Runs vLLM engines one after another in this process on token-id prompts, and prints each one's greedy tokens.

Used by the tests in one subprocess for all their offline engines (importing vLLM costs a start; an engine
does not leave the process half-built: each is shut down and vLLM's distributed state torn down before the next):

    python tests/vllm/run_vllm.py '{"model": DIR, "engines": [{"name": "stock", "prompts": [[1, 2, 3]]}, ...]}'

Per engine, in order: ``ENGINE name`` before it starts, then ``RESULT name {"tokens": [[...], ...], "cached":
[prompt tokens read from the prefix cache, ...], "kernel_calls": [calls of vLLM's CPU attention kernel, ...]}``
or ``REFUSED name`` when building it raised (its message is in the log above the line), then ``SECONDS name N``.
vLLM's log-once messages are forgotten between engines, so that each engine's part of the log has its own
start-up lines (e.g. "KV cache size: N tokens").
Engine keys: "prompts", "max_tokens" (16), "min_tokens" (0; as transformers' min_new_tokens), "hf_overrides", "env"
(set in os.environ while the engine is built and runs: the plugin reads DUOCAL_* there), "model" (the run's),
"max_model_len" (2048), "max_num_batched_tokens" (512), "enable_prefix_caching" (false),
"prefix_cache_retention_interval" (0, vLLM's default; null: every block keeps its hash), "block_size" (vLLM's
choice), "long_prefill_token_threshold" (0), "scheduler_cls" (vLLM's), "together" (false: the prompts are sent
one after another, so that a repeated prompt can hit the cache of an earlier one; true: all in one call, as a
server gets requests at once), "enforce_eager" (true: no torch.compile),
"tensor_parallel_size" (1; above 1 its ranks run as worker processes, and VLLM_CPU_OMP_THREADS_BIND must name one
CPU list per rank, e.g. "0|1", before this process imports vLLM). float32, at most 4 sequences.
"""

import contextlib
import gc
import json
import os
import sys
import time
import traceback


def build(spec: dict):
    from vllm import LLM

    tp_size = spec.get("tensor_parallel_size", 1)
    return LLM(
        tensor_parallel_size=tp_size,
        distributed_executor_backend="mp" if tp_size > 1 else None,
        model=spec["model"],
        dtype="float32",
        enforce_eager=spec.get("enforce_eager", True),
        max_model_len=spec.get("max_model_len", 2048),
        max_num_seqs=4,
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 512),
        enable_prefix_caching=spec.get("enable_prefix_caching", False),
        prefix_cache_retention_interval=spec.get("prefix_cache_retention_interval", 0),
        long_prefill_token_threshold=spec.get("long_prefill_token_threshold", 0),
        scheduler_cls=spec.get("scheduler_cls"),
        block_size=spec.get("block_size"),
        hf_overrides=spec.get("hf_overrides"),
    )


def generate(llm, spec: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    max_tokens, min_tokens = spec.get("max_tokens", 16), spec.get("min_tokens", 0)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=min_tokens)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    if spec.get("together"):
        with kernel_calls() as counted:
            outs = llm.generate(prompts, params, use_tqdm=False)
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                "cached": [o.num_cached_tokens for o in outs], "kernel_calls": counted}  # fmt: skip
    outs, calls = [], []
    for prompt in prompts:
        with kernel_calls() as counted:
            outs.append(llm.generate([prompt], params, use_tqdm=False)[0])
        calls.append(counted[0])
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs], "cached": [o.num_cached_tokens for o in outs],
            "kernel_calls": calls}  # fmt: skip


@contextlib.contextmanager
def kernel_calls():
    """Counts calls of vLLM's CPU attention kernel (the backends call it as ``ops.cpu_attention_with_kv_cache``)."""
    from vllm import _custom_ops as ops

    kernel, counted = ops.cpu_attention_with_kv_cache, [0]

    def counting(*args, **kwargs):
        counted[0] += 1
        return kernel(*args, **kwargs)

    ops.cpu_attention_with_kv_cache = counting
    try:
        yield counted
    finally:
        ops.cpu_attention_with_kv_cache = kernel


def shut_down(llm) -> None:
    """Ends the engine (its in-process core) and vLLM's process-wide state, so the next one starts clean."""
    from vllm import logger
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    if llm is not None:
        llm.llm_engine.engine_core.shutdown()
    gc.collect()
    cleanup_dist_env_and_memory()
    for once in (logger._print_debug_once, logger._print_info_once, logger._print_warning_once):
        once.cache_clear()


def run_engine(spec: dict) -> None:
    name, env, start = spec["name"], spec.get("env", {}), time.monotonic()
    print(f"ENGINE {name}", flush=True)
    os.environ.update(env)
    llm = None
    try:
        llm = build(spec)
    except Exception:
        traceback.print_exc()
        print(f"REFUSED {name}", flush=True)
    else:
        print(f"RESULT {name} " + json.dumps(generate(llm, spec)), flush=True)
    finally:
        shut_down(llm)
        for key in env:
            os.environ.pop(key)
        print(f"SECONDS {name} {time.monotonic() - start:.1f}", flush=True)


def main(run: dict) -> None:
    for engine in run["engines"]:
        run_engine({"model": run["model"], **engine})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
