"""Where each KV head's cache layer goes (vllm_plugin/cache_layout.py), checked against vLLM's own grouping
(`_get_kv_cache_groups_uniform_page_size`, no engine): every call's heads are consecutive layers of one KV cache
group, the spares fill exactly the rows vLLM pads, and real plans need at most two calls per layer. Plans: the
shipped SmolLM2 profile, and upstream DuoAttention's Llama-3.1-8B and Mistral-7B patterns (profiles/duo-attention)."""

from pathlib import Path

import pytest
import torch
from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size
from vllm.v1.kv_cache_interface import FullAttentionSpec

import duocal_runtime as dr
from duocal_vllm.cache_layout import SPARE, CacheLayout, cache_layout, group_size, whole_packing
from duocal_vllm.sink_window_spec import SinkWindowSpec

from helpers.vllm_engines import PROFILE, REPO

UPSTREAM = REPO / "profiles" / "duo-attention"
PROFILES = {"smollm2": PROFILE, "llama-3.1-8b": UPSTREAM / "Meta-Llama-3.1-8B-Instruct",
            "mistral-7b": UPSTREAM / "Mistral-7B-Instruct-v0.2"}  # fmt: skip
PAGE = dict(block_size=64, num_kv_heads=1, head_size=64, dtype=torch.float32)


def rows_of(profile: Path, sparsity: float) -> list[list]:
    plan = dr.plan(dr.load_profile(profile), sparsity=sparsity, sink=64, recent=256)
    return [["full" if p.name == "full" else (p.sink, p.recent) for p in row] for row in plan.policies]


def name(slot, spares: dict) -> str:
    if slot.head is SPARE:
        spares[slot.layer] = spares.get(slot.layer, 0) + 1
        return f"model.layers.{slot.layer}.attn.spare{'x' * spares[slot.layer]}"
    return f"model.layers.{slot.layer}.attn.kv{'x' * (slot.head + 1)}"


def vllm_groups(layout: CacheLayout) -> list[list[str]]:
    """vLLM's KV cache groups of the cache layers, built in the layout's order."""
    specs, spares = {}, {}
    for slot in layout.build_order:
        full = slot.key == "full"
        spec = (
            FullAttentionSpec(**PAGE) if full else SinkWindowSpec(sink=slot.key[0], sliding_window=slot.key[1], **PAGE)
        )
        specs[name(slot, spares)] = spec
    return [group.layer_names for group in _get_kv_cache_groups_uniform_page_size(specs)]


def check_against_vllm(layout: CacheLayout) -> None:
    groups = vllm_groups(layout)
    where = {layer: (g, i) for g, names in enumerate(groups) for i, layer in enumerate(names)}
    for index, calls in enumerate(layout.calls):
        for call in calls:
            places = [where[f"model.layers.{index}.attn.kv{'x' * (h + 1)}"] for h in call.heads]
            assert len({g for g, _ in places}) == 1, (index, call, places)
            assert [i for _, i in places] == list(range(places[0][1], places[0][1] + len(places))), (index, call)
    assert len({len(names) for names in groups}) == 1  # the spares fill vLLM's padding rows: no padding left


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.75, 0.875])
def test_real_plans_take_at_most_two_calls_per_layer_and_vllm_groups_them_as_planned(profile, sparsity):
    layout = cache_layout(rows_of(PROFILES[profile], sparsity))
    check_against_vllm(layout)
    assert max(layout.calls_per_layer) <= 2


def test_two_streaming_shapes_make_three_buckets():
    """Full 4, (64, 256) 5, (32, 128) 3: groups of 3, two of them for the full heads and two for (64, 256)."""
    a, b = (64, 256), (32, 128)
    layout = cache_layout([["full", a, b, "full"], [a, a, a, "full"], [b, "full", b, a]])
    check_against_vllm(layout)
    assert layout.calls_per_layer == [3, 2, 3]  # one call per policy present in the layer


def test_segments_that_no_packing_keeps_whole_are_split_and_counted():
    """Streaming segments of 4, 3, 3 and 2 heads in three groups of 4 (4 full heads set the group size)."""
    s = (64, 256)
    rows = [[s] * 4, [s, s, "full", "full"], [s, s, s, "full"], [s, s, "full", s]]
    layout = cache_layout(rows)
    check_against_vllm(layout)
    assert layout.calls_per_layer == [1, 3, 2, 2]
    assert sorted(len(call.heads) for call in layout.calls[1] if call.key == s) == [1, 1]


def test_the_search_finds_packings_best_fit_misses():
    """Best fit, largest first: 4 | 4 -> 4+4, 3+3+2 | 2 left over; the search: 4+3+2 | 4+3+2."""
    placed = whole_packing([4, 4, 3, 3, 2, 2], 2, 9)
    assert placed is not None and sorted(placed) == [0, 0, 0, 1, 1, 1]
    assert whole_packing([4, 3, 3, 2], 3, 4) is None


def test_vllms_group_size_rule():
    assert group_size([45, 45]) == 45
    assert group_size([22, 68]) == 22
    assert group_size([12, 13]) == 13  # within 1.5x: the larger count, fewer groups
