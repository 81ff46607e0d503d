"""Which of a profile's middle heads breaks README's prompt: from the plan at `--high` (its full heads hold the
answers), add the heads the plan at `--low` keeps full, one at a time in score order, and answer README's prompt
with 8 keys never used (greedy, exact and clean) after each; full attention and the profile's own plans first.

    OMP_NUM_THREADS=2 python benchmarks/head_ablation.py --profile smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import random

import duocal_runtime as dr
from duocal.data.chat_prompts import ChatPrompt
from duocal.eval.chat_passkey import answer_all, readme_prompt
from duocal.models import ModelRef


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--profile", default="smollm2-135m-instruct")
    parser.add_argument("--high", type=float, default=0.875)
    parser.add_argument("--low", type=float, default=0.75)
    args = parser.parse_args()
    ref = ModelRef.resolve(args.model)
    tokenizer, model = ref.load_tokenizer(), ref.load_model()
    profile = dr.load_profile(args.profile)
    draw = random.Random("ablate-readme")
    prompts = [ChatPrompt(k, 0.5, readme_prompt(k), "readme") for k in (draw.randint(10000, 99999) for _ in range(8))]
    every = {
        (layer, head)
        for layer in range(profile.shape.num_hidden_layers)
        for head in range(profile.shape.num_key_value_heads)
    }

    def right(plan: dr.Plan, label: str) -> None:
        answers, _ = answer_all(model, tokenizer, plan, prompts)
        print(f"{label}: {sum(a.right for a in answers)}/8 right", flush=True)

    def with_full(full: set) -> dr.Plan:
        sink_window = profile.deploy.sink_window
        shape = profile.shape
        rows = [
            tuple(dr.Full() if (layer, head) in full else sink_window for head in range(shape.num_key_value_heads))
            for layer in range(shape.num_hidden_layers)
        ]
        return dr.Plan(shape, tuple(rows))

    right(with_full(every), "full attention")
    plans = {s: dr.plan(profile, sparsity=s) for s in (0.5, 0.625, 0.75, 0.875)}
    for sparsity, plan in plans.items():
        right(plan, f"the profile at {sparsity:g}")
    high, low = full_heads(dr.plan(profile, sparsity=args.high)), full_heads(dr.plan(profile, sparsity=args.low))
    added = sorted(low - high, key=lambda h: -profile.scores[h[0]][h[1]])
    for count in range(1, len(added) + 1):
        layer, head = added[count - 1]
        label = f"{args.high:g}'s heads + {count} (layer {layer} head {head}, score {profile.scores[layer][head]:.3f})"
        right(with_full(high | set(added[:count])), label)


def full_heads(plan: dr.Plan) -> set[tuple[int, int]]:
    return {(layer, head) for layer, row in enumerate(plan.policies) for head, p in enumerate(row) if not p.bounded}


if __name__ == "__main__":
    main()
