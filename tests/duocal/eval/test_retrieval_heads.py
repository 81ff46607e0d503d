"""Retrieval heads from attention mass on the needle; on the demo model, keeping only them full
retrieves like full attention and streaming only them destroys retrieval."""

import pytest
import torch

import duocal_runtime as dr
from duocal import models
from duocal.demo import DEMO_MODEL_DIR
from duocal.eval import passkey_retrieval as pk
from duocal.eval.passkey_retrieval import PasskeyEvalConfig
from duocal.eval.retrieval_heads import flat_indices, needle_attention, needle_mass, top_heads


def test_needle_mass_sums_each_group():
    probs = torch.zeros(4, 6, 6)  # [H, T, T]; 2 KV heads x 2 query heads
    probs[0, 4, 1:3] = 0.5  # head 0 looks at the needle (keys 1, 2) with all its mass from row 4
    probs[1, 4, 2] = 0.25
    probs[3, 5, 1] = 1.0  # head 3 only from row 5
    mass = needle_mass(probs, rows=[4, 5], start=1, end=3, group=2)
    assert mass.tolist() == pytest.approx([(1.0 + 0.0) / 2 + 0.25 / 2, 0.0 + 1.0 / 2])


def test_top_heads_orders_and_cuts():
    mass = [[0.01, 0.7], [0.99, 0.2]]
    assert top_heads(mass, share=0.25) == [(1, 0), (0, 1)]
    assert top_heads(mass, share=0.1) == [(1, 0), (0, 1), (1, 1)]
    assert flat_indices([(1, 0), (0, 1)], num_kv_heads=2) == {2, 1}
    with pytest.raises(ValueError):
        top_heads(mass, share=0)


def test_needle_attention_shape_and_bounds(tiny_llama_folder):
    model, tokenizer = models.load_model(tiny_llama_folder), models.load_tokenizer(tiny_llama_folder)
    before = model.config._attn_implementation
    samples = pk.make_samples(tokenizer, 512, PasskeyEvalConfig(format="digits", samples=2))
    mass = needle_attention(model, samples)
    assert mass.shape == (2, 2)  # [layers, KV heads]
    assert ((mass >= 0) & (mass <= 2 + 1e-5)).all()  # 2 query heads per KV head
    assert model.config._attn_implementation == before


def test_demo_retrieval_heads_carry_retrieval():
    """Find the heads from attention mass, then: keep only them full (13 of 16 heads streaming on
    the shipped model, whose retrieval sits in layer-1 KV heads 3, 1 and 0), or only the top two
    (14 of 16 streaming) -> near full accuracy;
    stream only them -> retrieval collapses to what StreamingLLM on every head gets."""
    model, tokenizer = models.load_model(DEMO_MODEL_DIR), models.load_tokenizer(DEMO_MODEL_DIR)
    probe = pk.make_samples(tokenizer, 512, PasskeyEvalConfig(samples=8, seed=31))
    mass = needle_attention(model, probe)
    heads = top_heads(mass)
    shape = dr.shape_of_config(model.config)
    assert 1 <= len(heads) <= 4, mass  # retrieval is carried by a few heads
    chosen = flat_indices(heads, shape.num_key_value_heads)
    rest = [m for i, m in enumerate(mass.flatten().tolist()) if i not in chosen]
    assert mass.max() > 4 * max(rest), mass  # and they stand apart from the others

    everything = set(range(shape.num_kv_heads_total))
    sink_window = dr.SinkWindow(sink=16, recent=64)
    top_two = flat_indices(heads[:2], shape.num_key_value_heads)  # the "14/16 streaming heads"
    plans = {
        "keep": dr.plan_from_bounded_set(shape, everything - chosen, sink_window),
        "keep_top2": dr.plan_from_bounded_set(shape, everything - top_two, sink_window),
        "inverse": dr.plan_from_bounded_set(shape, chosen, sink_window),
    }
    config = PasskeyEvalConfig(
        rows=("full", "streaming"), contexts=(1024,), samples=24, sink=16, recent=64, batch_size=12
    )
    rows = {r.row: r for r in pk.evaluate_passkey(model, tokenizer, config, plans=plans)}
    assert rows["full"].exact_match >= 0.9
    assert rows["keep"].exact_match >= rows["full"].exact_match - 0.15
    assert rows["keep_top2"].bounded_heads == 14
    assert rows["keep_top2"].exact_match >= rows["full"].exact_match - 0.15
    assert rows["inverse"].exact_match <= 0.3 and rows["streaming"].exact_match <= 0.3
    assert rows["keep"].kv_bytes < 0.5 * rows["full"].kv_bytes
