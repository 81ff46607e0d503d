"""Text windows of a long text and their losses under a plan: the first tokens of a window are one prefill, the
scored tokens then go through the cache in chunks, each attending only to what the cache still holds; ppl is
exp(mean loss)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

import duocal_runtime as dr

TEXT_CHUNK = 64  # scored tokens fed through the cache at once (1: token-by-token decoding)


def text_windows(tokenizer, text: str, context: int, most: int) -> list[torch.Tensor]:
    """Up to `most` consecutive, non-overlapping text windows of `context` token ids."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    count = min(most, len(ids) // context)
    if count == 0:
        raise ValueError(
            f"the text has {len(ids)} tokens, fewer than one text window of {context}; "
            "use a longer text or a shorter --context"
        )
    return [torch.tensor(ids[i * context : (i + 1) * context]) for i in range(count)]


@torch.no_grad()
def text_window_losses(model, cache, text_window: torch.Tensor, scored: int, chunk: int) -> torch.Tensor:
    """Losses (nats) of the last `scored` tokens of one text window, fed through `cache` (fresh)."""
    ids = text_window[None].to(model.device)
    start = ids.shape[1] - scored
    last = model(input_ids=ids[:, :start], cache=cache, logits_to_keep=1).logits  # predicts token `start`
    losses = []
    for i in range(start, ids.shape[1], chunk):
        piece = ids[:, i : i + chunk]
        logits = model(input_ids=piece, cache=cache).logits
        predictions = torch.cat([last, logits[:, :-1]], dim=1)  # [1, len(piece), V]
        losses.append(torch.nn.functional.cross_entropy(predictions[0].float(), piece[0], reduction="none"))
        last = logits[:, -1:]
    return torch.cat(losses)


def plan_ppl(
    model, plan: dr.Plan, text_windows: Sequence[torch.Tensor], scored: int, chunk: int, tick: Callable[[], None]
) -> float:
    """exp(mean loss) of the last `scored` tokens of every text window, fed `chunk` tokens at a time under `plan`."""
    losses = []
    with dr.apply(model, plan) as runtime:
        for text_window in text_windows:
            losses.append(text_window_losses(model, runtime.new_cache(), text_window, scored, chunk))
            tick()
    return math.exp(float(torch.cat(losses).mean()))
