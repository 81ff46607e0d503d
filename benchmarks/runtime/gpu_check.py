"""GPU checks before the GPU benchmark: `python -m benchmarks.runtime.gpu_check` (CUDA only).

1. An all-full plan gives plain transformers' greedy tokens (bf16, left padding).
2. A mixed plan's static cache, decode compiled by generate() (CUDA graphs), gives the dynamic
   cache's tokens (fp32), and the streaming prefill (compiled FlexAttention, Triton) and H2O
   prefill (FlexAttention with log-sum-exp) run at a length where they are used.
3. Full-head decode attention at 32k / 128k keys (Llama-3-8B layer: 32 q / 8 KV heads, bf16):
   transformers' layout ([B, 32, 1, D] with enable_gqa) vs query heads as rows of their KV head
   ([B, 8, 4, D]), so the decode layout is chosen from a measurement.
Prints one line per check; exits 1 when a check fails.
"""

from __future__ import annotations

import functools
import sys
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import duocal_runtime as dr


def small_model(dtype) -> LlamaForCausalLM:
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1000,
        max_position_embeddings=8192,
        initializer_range=0.2,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to("cuda", dtype).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model


def padded_prompts(lengths, vocab=1000):
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    g = torch.Generator().manual_seed(1)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids.cuda(), mask.cuda()


def greedy(model, ids, mask, cache=None, steps=24):
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, cache=cache)


def check_all_full_bf16() -> bool:
    model = small_model(torch.bfloat16)
    ids, mask = padded_prompts([1500, 900])
    want = greedy(model, ids, mask)
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        got = greedy(model, ids, mask, runtime.new_cache())
    return torch.equal(got, want)


def check_compiled_static_mixed() -> bool:
    model = small_model(torch.float32)
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(shape, [[dr.SinkWindow(16, 200), dr.Full()], [dr.H2O(100, 120), dr.SinkH2O(8, 90, 100)]])
    ids, mask = padded_prompts([3000, 2100])  # long enough for FlexAttention in both prefills
    with dr.apply(model, plan) as runtime:
        want = greedy(model, ids, mask, runtime.new_cache())
        got = greedy(model, ids, mask, runtime.new_cache(max_length=ids.shape[1] + 24))
    return torch.equal(got, want) and hasattr(model, "_compiled_call")


def time_call(fn, repeats=50) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def decode_layouts() -> str:
    lines = []
    for keys in (32768, 131072):
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, keys, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        hf = time_call(functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True))
        rows = time_call(functools.partial(F.scaled_dot_product_attention, q.view(1, 8, 4, 128), k, v))
        lines.append(f"decode layout @ {keys}: enable_gqa {hf:.3f} ms, rows-of-kv-head {rows:.3f} ms")
    return "; ".join(lines)


def main() -> int:
    if not torch.cuda.is_available():
        print("error: no CUDA device; this check is for a GPU machine", file=sys.stderr)
        return 1
    ok = True
    for name, check in (
        ("all-full bf16 = transformers", check_all_full_bf16),
        ("static compiled mixed = dynamic", check_compiled_static_mixed),
    ):
        start = time.perf_counter()
        passed = check()
        ok &= passed
        print(f"{'PASS' if passed else 'FAIL'} {name} ({time.perf_counter() - start:.1f} s)", flush=True)
    print(decode_layouts(), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
