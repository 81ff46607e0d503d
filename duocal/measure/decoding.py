"""Asking a model under a plan: a prompt prefilled through a plan's cache, greedy tokens after it, full attention's
own answer to a prompt, and where a passkey sample's question starts (everything before it is the context)."""

from __future__ import annotations

import torch

from duocal.data import PasskeySample
from duocal.data.passkey import TokenKind
from duocal.measure.chat_answer import NEW_TOKENS, ChatAnswer


def question_start(sample: PasskeySample) -> int:
    """The first token of the first question: everything before it is the context."""
    return next(i for i, kind in enumerate(sample.kinds) if kind == TokenKind.QUESTION)


def prefill(model, runtime, ids) -> object:
    cache = runtime.new_cache()
    model(input_ids=torch.tensor([list(ids)], device=next(model.parameters()).device), cache=cache, logits_to_keep=1)
    return cache


def greedy(model, ids, cache, new: int) -> tuple[int, ...]:
    """`new` greedy tokens after `ids` on `cache` (which has seen a prefix of `ids`)."""
    out = model.generate(
        input_ids=torch.tensor([list(ids)], device=next(model.parameters()).device),
        cache=cache,
        max_new_tokens=new,
        do_sample=False,
    )
    return tuple(out[0, len(ids) :].tolist())


@torch.no_grad()
def own_answer(model, ids: list[int], prompt_end: int, eos: int | None, cache=None) -> tuple[list[int], list[int]]:
    """(the prompt and full attention's greedy answer to it, the rows that predict that answer's tokens): the
    loss score then ranks the heads that keep what the model itself says, not a written answer it would not
    give ("The pass key is K." where SmolLM2 says "The pass key mentioned in the text is K."). `cache`: a
    `DynamicCache` of a pass over `ids` (or its start), cut back here so that decoding feeds the prompt's last
    token; without it, generate prefills the prompt."""
    device = next(model.parameters()).device
    prompt = torch.tensor([ids[:prompt_end]], device=device)
    if cache is not None:
        cache.crop(-(cache.get_seq_length() - (prompt_end - 1)))  # a negative count: transformers 5 crops by it
    new_tokens = max(NEW_TOKENS, len(ids) - prompt_end + 4)  # 4 more than the written answer (a UUID's: ~40)
    said = model.generate(prompt, cache=cache, max_new_tokens=new_tokens, do_sample=False, eos_token_id=eos)
    said = said[0].tolist()
    return said, list(range(prompt_end - 1, len(said) - 1))


def right_answer(model, tokenizer, ids: list[int], prompt_end: int, key, cache=None) -> tuple[tuple, bool]:
    """((token ids, the rows that predict the answer), whether that is the written answer): full attention's own
    greedy answer where it is right (`ChatAnswer.right`), else the answer written in `ids` after `prompt_end`."""
    said, rows = own_answer(model, ids, prompt_end, tokenizer.eos_token_id, cache)
    if ChatAnswer("right", key, tokenizer.decode(said[prompt_end:], skip_special_tokens=True)).right:
        return (said, rows), False
    return (ids, list(range(prompt_end - 1, len(ids) - 1))), True
