"""When the question is asked: with the context (query-aware) or after it (query-agnostic).

`query-aware` prefills context + question together, as most KV-cache evaluations do; it favours
policies that choose what to keep by the question (SnapKV, H2O). `query-agnostic` prefills the
context alone through the cache, so its policies evict knowing nothing of the question, then asks
the question as a follow-up on a copy of that compressed cache (each question on its own copy), as a
served long document or chat is asked. DuoAttention's head split does not depend on the query.
"""

from __future__ import annotations

import copy

import torch

from duocal.data import PasskeySample
from duocal.data.passkey import TokenKind

PROTOCOLS = ("query-aware", "query-agnostic")
CHOICES = (*PROTOCOLS, "both")


def protocols_of(choice: str) -> tuple[str, ...]:
    if choice not in CHOICES:
        raise ValueError(f"unknown protocol {choice!r}; choose one of {', '.join(CHOICES)}")
    return PROTOCOLS if choice == "both" else (choice,)


def question_start(sample: PasskeySample) -> int:
    """The first token of the question: everything before it is the context."""
    return next(i for i, kind in enumerate(sample.kinds) if kind == TokenKind.QUESTION)


@torch.no_grad()
def answer_after_the_context(model, runtime, prompt: tuple[int, ...], context: int, new: int):
    """Prefill `prompt[:context]` alone, then generate `new` tokens for the whole prompt on a copy of
    that cache (the question's tokens are its first pass). Returns (new tokens, the copy's bytes,
    the tokens the context's cache had seen)."""
    device = next(model.parameters()).device
    cache = runtime.new_cache()
    model(input_ids=torch.tensor([prompt[:context]], device=device), cache=cache, logits_to_keep=1)
    seen = int(cache.get_seq_length())
    asked = copy.deepcopy(cache)  # each question gets its own copy of the compressed context
    out = model.generate(
        input_ids=torch.tensor([prompt], device=device), cache=asked, max_new_tokens=new, do_sample=False
    )
    return tuple(out[0, len(prompt) :].tolist()), asked.kv_bytes(), seen
