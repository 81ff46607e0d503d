"""The positions a model is given under a plan whose sink-window heads see positions within their cache.

The model is given each token's rank among its row's real tokens, less the row's *position base*
(`DuoCacheLayer.position_base`, 0 at first): queries and the keys a pass caches are rotated in that
frame. A head that sees positions within its cache scores sink keys with the query rotated to its
place in the cache (attention/cache_positions.py); window keys keep their distance to the query.

A plan whose every head sees positions within its cache (`plan.distances_bounded`) streams without
end. Its base moves up whenever a pass would give the model a position past its trained length: the
pass then starts at position `capacity`, and every cached window key is rotated back by the same whole
number of positions. Sink keys never move (cached at their ranks, while the base was 0). So:
- the model never computes a RoPE angle far past its trained length (float32 angles at position
  4,000,000 are off by a tenth of a radian);
- no key is rotated step after step (roundings that add up: +27-49% perplexity was reported in bf16):
  a window key lives `recent` tokens and the base moves once every `trained length - capacity` tokens
  (at least twice a key's life: `move_threshold`), so it is rotated at most once or twice, by angles
  computed in float64.
Plans with full, H2O or SnapKV heads keep base 0: they are bounded by the trained length anyway. The base
moves between passes, never inside one: a first pass longer than the trained length, and the decode steps
a static cache compiles (their positions run up to its `max_length`), give the model those positions as they
are (exact in distance; only float32's angles lose precision far past the trained length).
"""

from __future__ import annotations

import torch

from .cache import check_batch


def place_positions(runtime, cache, args: tuple, kwargs: dict) -> dict:
    """`kwargs` of a forward call with the `position_ids` this stream gives the model (the base moved first
    where it must). Refuses given position_ids that are not the tokens' ranks: the heads count on them."""
    if len(args) > 2:
        raise ValueError(
            "duocal: with positions='cache' pass input_ids, attention_mask and position_ids to the model by keyword"
        )
    tokens = kwargs.get("input_ids", args[0] if args else None)
    tokens = kwargs.get("inputs_embeds") if tokens is None else tokens
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if tokens is None or (mask is not None and mask.ndim != 2):
        return kwargs  # the model refuses these itself
    layer = cache.layers[0] if cache is not None else None
    batch, length = tokens.shape[:2]
    real = layer.real if layer is not None and layer.real is not None else None
    check_batch(real, batch)
    if real is None:
        real = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    valid = new_tokens_valid(mask, layer, batch, length, real.device)
    ranks = real[:, None] + valid.long().cumsum(1) - 1
    if not torch.compiler.is_compiling():
        check_given_positions(kwargs.get("position_ids"), ranks, valid)
        if layer is not None and layer.position_base is not None and runtime.plan.distances_bounded:
            move_base(runtime, cache, ranks, valid, real)
    base = layer.position_base if layer is not None and layer.position_base is not None else torch.zeros_like(real)
    return {**kwargs, "position_ids": torch.where(valid, ranks - base[:, None], 0)}


def new_tokens_valid(mask, layer, batch: int, length: int, device) -> torch.Tensor:
    """[B, T] which of the pass's tokens are real: the mask's columns after the tokens the cache has seen
    (a static cache's mask runs to its max_length)."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    seen = 0 if layer is None else layer.seen
    if isinstance(seen, torch.Tensor):
        columns = seen.to(mask.device) + torch.arange(length, device=mask.device)
        return mask.index_select(1, columns).to(device=device, dtype=torch.bool)
    return mask[:, seen : seen + length].to(device=device, dtype=torch.bool)


def move_threshold(trained: int, capacity: int, pass_tokens: int) -> int:
    """The position past which the base moves: the trained length, unless the cache and the pass are so large
    against it that the base would move more than once in a window key's life (capacity + pass tokens); then
    three times that, so that a key is rotated at most once or twice."""
    return max(trained, 3 * (capacity + pass_tokens))


def check_given_positions(given, ranks: torch.Tensor, valid: torch.Tensor) -> None:
    if given is None:
        return
    given = torch.as_tensor(given, device=ranks.device)
    if given.shape[-1] != ranks.shape[-1] or not bool((given.expand_as(ranks) == ranks)[valid].all()):
        raise ValueError(
            "duocal: under positions='cache' the model is given each token's rank among its row's real tokens "
            "(what generate() passes); these position_ids differ: leave position_ids out"
        )


def move_base(runtime, cache, ranks: torch.Tensor, valid: torch.Tensor, real_before: torch.Tensor) -> None:
    """Move each row's base up where this pass would pass the model's trained length (see the module)."""
    base = cache.layers[0].position_base
    last = torch.where(valid, ranks, -1).amax(1) - base
    target = real_before - runtime.plan_capacity  # the pass's first token then sits at position `capacity`
    move = (last >= move_threshold(runtime.position_limit, runtime.plan_capacity, ranks.shape[1])) & (target > base)
    if bool(move.any()):
        delta = torch.where(move, target - base, 0)
        for layer in cache.layers:
            layer.shift_positions(delta)
