"""Padding token sequences into one batch tensor: the one helper every batch builder uses."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_batch(
    rows: Sequence[Sequence[int]], value: int, left: bool = False, multiple: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] tensor of `rows` padded with `value` (on the left for generation prompts, else on the
    right; T the longest row rounded up to `multiple`), and the [B, T] bool mask of real tokens."""
    width = -(-max((len(r) for r in rows), default=0) // multiple) * multiple
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            span = slice(width - len(row), width) if left else slice(0, len(row))
            ids[i, span], mask[i, span] = torch.tensor(list(row)), True
    return ids, mask


def pad_token_id(tokenizer, model_config=None) -> int:
    """The id to pad with: the tokenizer's pad token, else the model's, else end-of-sequence, else 0."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(model_config, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if isinstance(candidate, int):
            return candidate
    return 0
