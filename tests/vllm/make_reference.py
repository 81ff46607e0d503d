"""Writes data/reference_tokens.json: greedy tokens of duocal's own runtime, the oracle of test_duo_llama.py.

Run in the main .venv (transformers 5.24), not in .venv-vllm:

    OMP_NUM_THREADS=2 .venv/bin/python tests/vllm/make_reference.py

SmolLM2-135M-Instruct (the folder `duocal models fetch smollm2-135m-instruct` caches), float32, batch 1,
no chat template; for each prompt, 16 greedy tokens with plain transformers ("full") and under
`dr.apply(model, dr.plan(profile, sparsity=0.5))` with the shipped profile ("duo": 45 full and 45
sink_window(sink=64, recent=512) KV heads), and ("duo_small") every KV head sink_window with sink 32 and recent 128
(sparsity 1), where eviction changes the answers. Prompts are stored as token ids, so both runtimes see the same.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import duocal_runtime as dr
from duocal.models import fetch_model

REPO = Path(__file__).resolve().parents[2]
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    f"There is important info hidden in this text. {FILLER * 10}The pass key is 71432. Remember it. "
    f"{FILLER * 30}What is the pass key? The pass key is",
    f"Alice has 3 apples and Bob has 5 pears. {FILLER * 45}Question: how many apples does Alice have? Answer:",
]
NEW_TOKENS = 16
SMALL = {"sink": 32, "recent": 128}  # at sparsity 1


def greedy(model, ids: list[int], runtime=None) -> list[int]:
    inputs = torch.tensor([ids])
    kwargs = {"cache": runtime.new_cache()} if runtime is not None else {}
    out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=NEW_TOKENS, do_sample=False,
                         **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()


def main(path: Path = REPO / "tests" / "vllm" / "data" / "reference_tokens.json") -> None:
    folder = fetch_model("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    profile = dr.load_profile(REPO / "profiles" / "smollm2-135m-instruct.json")
    plans = {"duo": dr.plan(profile, sparsity=0.5), "duo_small": dr.plan(profile, sparsity=1.0, **SMALL)}
    cases = []
    for text in PROMPTS:
        ids = tokenizer(text)["input_ids"]
        full = greedy(model, ids)
        case = {"prompt_ids": ids, "full": full}
        for name, plan in plans.items():
            with dr.apply(model, plan) as runtime:
                case[name] = greedy(model, ids, runtime)
        cases.append(case)
        print(
            len(ids),
            full == case["duo"],
            full == case["duo_small"],
            tokenizer.decode(case["duo_small"]),
            file=sys.stderr,
        )
    note = (
        "made by tests/vllm/make_reference.py in the main .venv (transformers 5.24, torch 2.13 CPU): "
        "SmolLM2-135M-Instruct fp32, batch 1, 16 greedy tokens; full = plain transformers, "
        "duo = duocal runtime with profiles/smollm2-135m-instruct.json at sparsity 0.5"
    )
    data = {
        "note": note,
        "profile": "profiles/smollm2-135m-instruct.json",
        "sparsity": 0.5,
        "small": SMALL,
        "cases": cases,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
