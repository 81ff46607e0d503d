"""Tiny random-weight models of each supported family, built from configs (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    max_position_embeddings=512,
    initializer_range=0.2,
)

FAMILIES = {  # config builders; keyword arguments override COMMON (e.g. num_hidden_layers)
    "llama": lambda **kw: LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **{**COMMON, **kw}),
    "llama_mha": lambda **kw: LlamaConfig(num_attention_heads=4, num_key_value_heads=4, **{**COMMON, **kw}),
    "mistral": lambda **kw: MistralConfig(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None, **{**COMMON, **kw}
    ),
    "qwen2": lambda **kw: Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **{**COMMON, **kw}),
    "qwen3": lambda **kw: Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=16, **{**COMMON, **kw}),
}


def tiny_model(family: str = "llama", seed: int = 0, dtype=torch.float32, layers: int = 2, **config_overrides):
    """A random model of `family` (see FAMILIES; `config_overrides` on top), in memory, sdpa attention, never
    stopping at an eos token."""
    torch.manual_seed(seed)
    config = FAMILIES[family](num_hidden_layers=layers, **config_overrides)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # random weights: never stop early, rows stay comparable
    model.generation_config.pad_token_id = 0
    return model


def save_tiny_model(path: Path, model_type: str = "llama") -> Path:
    """A random 2-layer Llama (4 query heads, 2 KV heads, head_dim 8) with the demo tokenizer (one token
    per character), saved to `path` for code that takes a model folder; `model_type="gpt2"` saves a
    model of a family duocal does not support."""
    import transformers as tf

    from duocal.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    llama = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    gpt2 = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=len(tokenizer))
    config = tf.GPT2Config(**gpt2) if model_type == "gpt2" else tf.LlamaConfig(**llama)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def left_padded_batch(lengths: list[int], vocab: int = 97, seed: int = 1):
    """input_ids and attention_mask for rows of the given real lengths, left padded."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids, mask


def padded_decode_steps(steps: int, padded: tuple[int, ...], seed: int = 5):
    """Decode inputs for 2 rows where row 1 feeds padding (mask 0) at the given steps."""
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(1, 97, (2, 1), generator=g) for _ in range(steps)]
    new_mask = [torch.tensor([[1], [0]]) if step in padded else torch.tensor([[1], [1]]) for step in range(steps)]
    return tokens, new_mask


def cpu_compile_config():
    """What generate() compiles a static cache's decode step with in tests: fullgraph (a graph break
    fails), on CPU too (transformers compiles on CUDA by default, on CPU only when asked)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, mode="default", dynamic=False)
    config._compile_all_devices = True
    return config


def greedy_with_logits(model, ids, mask, cache=None, steps=12, **kwargs):
    """Greedy tokens [B, prompt + steps] and the logits of every step [steps, B, V]."""
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=steps,
        do_sample=False,
        cache=cache,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.logits)


@torch.no_grad()
def drive_decode(model, ids, mask, cache, tokens, new_mask):
    """Prefill, then feed `tokens` one step at a time with their mask column; last logits per step [B, 1 + steps, V]."""
    m, logits = mask.clone(), [model(input_ids=ids, attention_mask=mask, cache=cache).logits[:, -1]]
    pos = mask.cumsum(1)[:, -1:] - 1
    for token, nm in zip(tokens, new_mask, strict=True):
        m, pos = torch.cat([m, nm], 1), pos + nm
        logits.append(model(input_ids=token, attention_mask=m, cache=cache, position_ids=pos).logits[:, -1])
    return torch.stack(logits, 1)


def answer_pairs(seeds=(3, 4), length: int = 40) -> list[tuple[list[int], list[int]]]:
    """(random token ids, the rows that predict their last 5 tokens) per seed: the answer loss's input."""
    out = []
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        out.append((torch.randint(1, 97, (length,), generator=generator).tolist(), list(range(length - 6, length - 1))))
    return out
