"""`ranking.nested: true`: after training, the heads ordered sparsest plan first by the answer loss.

The gates rank each head alone, trained with every other gate near its own value; a plan at 0.75 or 0.875 keeps
most heads streaming, and a head whose gate is high can move the answer the other way there (measure/nested_order.py).
Here the gates' own sparsest plan (the heads full at 0.9375, in the measured order of `rank_heads`) comes first,
then each of 0.875, 0.75, 0.625 and 0.5 adds the heads whose answer-loss gain, measured at the plan so far, is
largest. The prompts are every kind of passkey prompt (`data.values`, `data.framings` and `data.haystack` of a
`mixed` recipe, else every value, both framings and both haystacks; plain text only for a tokenizer without a chat
template), each scored on full attention's own answer where it is right, else the written one, and the plans
are those the profile deploys (`deploy.sink` + `deploy.recent`). On the main process, with the calibration's
model, after the training; one backward pass per prompt and tier.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import duocal_runtime as dr
from duocal.data.chat_answers import answered_chat
from duocal.data.chat_prompts import FRAMINGS
from duocal.data.needle_values import VALUE_KINDS
from duocal.data.prompt_kinds import mixed_prompts, prompt_mix
from duocal.measure.decoding import right_answer
from duocal.measure.nested_order import nested_order, sparsest_plan_heads

HAYSTACKS = ("repeated", "text")


def prompt_kinds(recipe, tokenizer) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(values, framings, haystacks) the order is measured on."""
    data = recipe.data
    if data.format == "mixed":
        return tuple(data.values), tuple(data.framings), tuple(h.strip() for h in str(data.haystack).split(","))
    framings = FRAMINGS if getattr(tokenizer, "chat_template", None) else ("plain",)
    return VALUE_KINDS, framings, HAYSTACKS


def answered_pairs(model, tokenizer, recipe) -> list[tuple[list[int], list[int]]]:
    """(token ids, the rows that predict the right answer) of each prompt."""
    r = recipe.ranking
    mix = prompt_mix(*prompt_kinds(recipe, tokenizer))
    pairs = []
    for prompt in mixed_prompts(tokenizer, r.nested_samples, r.nested_context, f"{r.seed}:nested", mix):
        answered = answered_chat(tokenizer, prompt)
        pair, _ = right_answer(model, tokenizer, answered.ids, answered.prompt_end, prompt.key)
        pairs.append(pair)
    return pairs


def nested_ranking(recipe, model, tokenizer, scores: list[list[float]]) -> tuple[list[list[float]], dict[str, Any]]:
    """(the nested scores [L][G], what the profile's source records), starting from `scores`' sparsest plan."""
    shape = dr.shape_of_config(model.config)
    first = sparsest_plan_heads([s for row in scores for s in row])
    deploy, attention, r = recipe.deploy, recipe.attention, recipe.ranking
    sink_window = dr.SinkWindow(deploy.sink or attention.sink, deploy.recent or attention.recent)
    order = nested_order(model, answered_pairs(model, tokenizer, recipe), sink_window, first)
    info = {**order.source(shape.num_key_value_heads), "samples": r.nested_samples, "context": r.nested_context}
    return order.scores(shape), info


def rerank_file(path, recipe, model, tokenizer) -> None:
    """Rewrite the profile at `path` (written by the training) with the nested order (atomically)."""
    profile = dr.load_profile(path)
    scores, info = nested_ranking(recipe, model, tokenizer, [list(row) for row in profile.scores])
    source = {**profile.source, "ranking": {**profile.source.get("ranking", {}), **info}}
    dr.save_profile(replace(profile, scores=tuple(map(tuple, scores)), source=source), path)
