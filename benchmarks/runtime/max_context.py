"""The longest context one sequence's KV cache fits in, by KV bits and sparsity (analytic: `Plan.max_context`).

    python -m benchmarks.runtime.max_context --shape llama3-8b --kv-memory 24GB,63.9GB,72GB,125GB

Full heads store 16, 8 or 4 bits per value (KIVI codes: a bf16 scale and zero point per 32
values, the newest 128 tokens in bf16); bounded heads are sink 64 + recent 256 in bf16. Which
heads are bounded does not change the count, only how many. Each cell is the longest context and
its ratio to plain 16-bit attention in the same memory.
"""

from __future__ import annotations

import argparse

from transformers import LlamaConfig

import duocal_runtime as dr
from benchmarks.runtime.pool_requests import synthetic_profile
from benchmarks.runtime.shapes import SHAPES
from duocal_runtime.planning.budget import Budget


def table(shape: dr.ModelShape, memories: list[str], sparsities: list[float], bits: list[int], dtype: str) -> list:
    """Rows (bits, sparsity, [(context, ratio to 16-bit full) per memory])."""
    profile = synthetic_profile(shape)
    plain = dr.plan(profile, sparsity=0.0)
    base = [plain.max_context(memory, dtype=dtype) for memory in memories]
    rows = []
    for kv_bits in bits:
        for sparsity in sparsities:
            made = dr.plan(profile, sparsity=sparsity, sink=64, recent=256, kv_bits=kv_bits)
            cells = [made.max_context(memory, dtype=dtype) for memory in memories]
            rows.append((kv_bits, sparsity, [(c, c / b) for c, b in zip(cells, base, strict=True)]))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--kv-memory", default="24GB,63.9GB,72GB,125GB", help="memory left for the KV cache")
    ap.add_argument("--sparsity", default="0,0.5,0.75")
    ap.add_argument("--kv-bits", default="16,8,4")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    memories = args.kv_memory.split(",")
    for memory in memories:
        Budget.parse(memory)
    shape = dr.shape_of_config(LlamaConfig(**SHAPES[args.shape]))
    rows = table(
        shape,
        memories,
        [float(s) for s in args.sparsity.split(",")],
        [int(b) for b in args.kv_bits.split(",")],
        args.dtype,
    )
    print(f"{args.shape}: longest context of one sequence whose KV cache fits (x: against 16-bit full attention)")
    print("KV bits | bounded heads | " + " | ".join(f"{m} of KV" for m in memories))
    for kv_bits, sparsity, cells in rows:
        print(f"{kv_bits} | {sparsity:.0%} | " + " | ".join(f"{c / 1e6:.2f}M ({r:.1f}x)" for c, r in cells))


if __name__ == "__main__":
    main()
