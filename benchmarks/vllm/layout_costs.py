"""What the per-head cache layout costs, on paper (no engine): per profile and sparsity, the plan's full + streaming
KV heads, vLLM's KV cache groups after the plugin's group fitting (group_fit.py), the padding rows vLLM allocates
(cache_layout.py fills them with spare cache layers: memory that is spent either way), and the attention kernel
calls per step (cache_layout.py) against two per layer. Prints a markdown table:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm/layout_costs.py [--max-model-len 8192] [--block 64]

Profiles: the shipped SmolLM2-135M profile and upstream DuoAttention's patterns of Llama-3.1-8B, Llama-3-8B-1048k
and Mistral-7B (tests/data), planned with sink 64 + recent 256 (512 for SmolLM2: its shipped deploy sizes), each
request's prefill chunk capped at the window (`duocal serve --engine vllm`'s default).
"""

import argparse
import math
from pathlib import Path

import duocal_runtime as dr
from duocal_vllm.cache_layout import cache_layout, group_size
from duocal_vllm.group_fit import fitted_streaming_count, group_slots

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "profiles" / "duo-attention"
PROFILES = {
    "SmolLM2-135M (shipped)": (REPO / "profiles" / "smollm2-135m-instruct.json", 512),
    "Llama-3.1-8B (upstream)": (UPSTREAM / "Meta-Llama-3.1-8B-Instruct", 256),
    "Llama-3-8B-1048k (upstream)": (UPSTREAM / "Llama-3-8B-Instruct-Gradient-1048k", 256),
    "Mistral-7B-v0.2 (upstream)": (UPSTREAM / "Mistral-7B-Instruct-v0.2", 256),
}
SINK = 64


def fitted_rows(profile, sparsity: float, recent: int, length: int, block: int) -> list[list]:
    """The plan's policy keys per layer after group fitting (the best-scored streaming heads made full)."""
    total = sum(len(row) for row in profile.scores)
    plan = dr.plan(profile, sparsity=sparsity, sink=SINK, recent=recent)
    streaming = sum(p.name != "full" for row in plan.policies for p in row)
    reserved = math.ceil(SINK / block) + math.ceil((recent + recent) / block) + 1  # sink + window + chunk
    kept = fitted_streaming_count(total - streaming, streaming, math.ceil(length / block), reserved)
    if kept != streaming:
        plan = dr.plan(profile, sparsity=kept / total, sink=SINK, recent=recent)
    return [["full" if p.name == "full" else (p.sink, p.recent) for p in row] for row in plan.policies]


def row_of(name: str, sparsity: float, rows: list[list], planned: int) -> str:
    full = sum(key == "full" for row in rows for key in row)
    streaming = sum(len(row) for row in rows) - full
    size = group_size([n for n in (full, streaming) if n])
    slots = sum(group_slots(full, streaming))
    layout = cache_layout(rows)
    calls, layers = layout.calls_per_layer, len(rows)
    padding = slots - full - streaming
    return (
        f"| {name} | {sparsity} | {full} + {streaming} (planned {planned} streaming) | "
        f"{slots // size} x {size} | {padding} ({padding / (full + streaming):.1%}) | "
        f"{sum(calls)} / {2 * layers} | {max(calls)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--sparsities", default="0.5,0.75")
    args = parser.parse_args()
    print("| profile | sparsity | KV heads full + streaming | groups x layers | padding rows (of the heads) "
          "| kernel calls per step / 2 x layers | most calls in a layer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, (path, recent) in PROFILES.items():
        profile = dr.load_profile(path)
        for sparsity in map(float, args.sparsities.split(",")):
            planned = sum(
                p.name != "full" for row in dr.plan(profile, sparsity=sparsity).policies for p in row
            )  # fmt: skip
            rows = fitted_rows(profile, sparsity, recent, args.max_model_len, args.block)
            print(row_of(name, sparsity, rows, planned))


if __name__ == "__main__":
    main()
