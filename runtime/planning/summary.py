"""Plans for people: heads per policy, a few lines of summary, a one-line repr."""

from __future__ import annotations

from typing import Any

from .sizes import bytes_with_count


def policy_counts(plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in plan.policies:
        for p in row:
            label = p.name + (f"({', '.join(f'{k}={v}' for k, v in p.sizes().items())})" if p.sizes() else "")
            counts[label] = counts.get(label, 0) + 1
    return counts


def summary(plan, context: int = 4096, dtype: Any = None) -> str:
    memory = plan.memory_report(context, 1, dtype or plan.budget_dtype or "bfloat16")
    return "\n".join(
        (
            f"plan for {plan.model_name or 'an unnamed model'}: {plan.shape.describe()}",
            "KV heads: " + ", ".join(f"{label} {n}" for label, n in policy_counts(plan).items()),
            "full heads per layer: " + " ".join(map(str, plan.retrieval_heads_per_layer)),
            f"KV cache at {context} tokens, batch 1, {memory['dtype']}: {bytes_with_count(memory['kv_bytes_plan'])} "
            f"({memory['fraction_of_full']:.0%} of full attention)",
        )
    )


def one_line(plan) -> str:
    counts = ", ".join(f"{label} {n}" for label, n in policy_counts(plan).items())
    fraction = plan.memory_report(4096, 1, plan.budget_dtype or "bfloat16")["fraction_of_full"]
    return f"Plan({plan.model_name or 'unnamed'}: {counts}; {fraction:.0%} of full KV at 4096 tokens)"
