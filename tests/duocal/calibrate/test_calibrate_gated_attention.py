"""Gated attention of calibration: blocked streaming attention vs a dense reference, and the
teacher / student passes through the registered-attention mechanism for every supported family."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from duocal.calibrate import key_blocks
from duocal.calibrate.gated_attention import ATTENTION_NAME, Gating, install, mix, uninstall
from duocal.calibrate.key_blocks import blocked_sink_window_attention, dense_sink_window_attention
from duocal_runtime import compat

from helpers.models import tiny_model

CASES = [  # T, sink, recent, block, query heads, KV heads
    (100, 4, 8, 8, 4, 2),
    (300, 16, 64, 32, 8, 4),
    (257, 0, 1, 16, 2, 2),
    (50, 64, 64, 16, 2, 1),  # window covers everything: plain causal
    (129, 5, 7, 128, 6, 3),  # one block larger than the window
    (77, 3, 20, 5, 4, 1),  # recent not a multiple of the block
    (513, 128, 256, 64, 4, 4),
]


@pytest.mark.parametrize("t,sink,recent,block,h,g", CASES)
def test_blocked_streaming_matches_dense_reference(t, sink, recent, block, h, g):
    torch.manual_seed(t)
    q = torch.randn(2, h, t, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, g, t, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, g, t, 8, dtype=torch.float64, requires_grad=True)
    got = blocked_sink_window_attention(q, k, v, sink, recent, 0.3, block)
    want = dense_sink_window_attention(q, k, v, sink, recent, 0.3)
    assert got.shape == want.shape == (2, h, t, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    upstream = torch.randn_like(got)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), upstream), torch.autograd.grad(want, (q, k, v), upstream), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_blocked_streaming_never_builds_a_full_mask(monkeypatch):
    """Each attention call sees at most sink + recent + 2 * block keys, whatever T is."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((q.shape[-2], k.shape[-2], None if attn_mask is None else attn_mask.numel()))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(key_blocks.F, "scaled_dot_product_attention", spy)
    sink, recent, block, r = 16, 48, 32, 2
    for t in (200, 4000):
        seen.clear()
        q, k = torch.randn(1, 2 * r, t, 8), torch.randn(1, 2, t, 8)
        blocked_sink_window_attention(q, k, k, sink, recent, 0.3, block)
        ((rows, keys, mask_elems),) = seen
        assert keys <= sink + recent + 2 * block
        assert rows == r * block
        assert mask_elems <= (t // block + 1) * rows * keys  # linear in T, not T^2


def test_mix_follows_gqa_grouping():
    full, stream = torch.ones(1, 6, 3, 2), torch.zeros(1, 6, 3, 2)  # 3 KV heads x 2 query heads
    out = mix(torch.tensor([1.0, 0.0, 0.25]), full, stream)
    assert out[0, :, 0, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.25, 0.25]


def _dense_streaming(sink, recent):
    def fn(module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kw):
        return dense_sink_window_attention(q, k, v, sink, recent, scaling).transpose(1, 2), None

    return fn


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_teacher_and_student_passes(family):
    model = tiny_model(family, layers=3)
    ids = torch.randint(0, 97, (2, 90))
    sink, recent = 4, 16
    with torch.no_grad():
        reference = model.model(input_ids=ids).last_hidden_state  # the model's own sdpa attention
    previous = install(model)
    try:
        gating = Gating(sink, recent, block=8)
        with torch.no_grad():
            teacher = model.model(input_ids=ids, use_cache=False, duocal_gating=gating).last_hidden_state
        torch.testing.assert_close(teacher, reference, rtol=1e-5, atol=1e-5)
        assert sorted(gating.teacher) == [0, 1, 2]

        layers, kv = 3, 2
        ones = torch.ones(layers, kv)
        student = model.model(input_ids=ids, use_cache=False, duocal_gating=gating.student(ones)).last_hidden_state
        torch.testing.assert_close(student, teacher, rtol=1e-5, atol=1e-5)

        zeros = torch.zeros(layers, kv)
        student = model.model(input_ids=ids, use_cache=False, duocal_gating=gating.student(zeros)).last_hidden_state
        compat.register("duocal_test_dense_streaming", _dense_streaming(sink, recent))
        model.set_attn_implementation("duocal_test_dense_streaming")
        with torch.no_grad():
            streamed = model.model(input_ids=ids, use_cache=False).last_hidden_state
        compat.unregister("duocal_test_dense_streaming")
        model.set_attn_implementation(ATTENTION_NAME)
        torch.testing.assert_close(student, streamed, rtol=1e-5, atol=1e-5)

        gates = torch.full((layers, kv), 0.5, requires_grad=True)
        for p in model.parameters():
            p.requires_grad_(False)
        out = model.model(input_ids=ids, use_cache=False, duocal_gating=gating.student(gates)).last_hidden_state
        (out - teacher).pow(2).mean().backward()
        assert gates.grad is not None and gates.grad.shape == (layers, kv)
        assert torch.isfinite(gates.grad).all() and (gates.grad != 0).all()
    finally:
        uninstall(model, previous)
    assert compat.attention_implementation(model) == previous


def test_missing_gating_is_a_clear_error():
    model = tiny_model("llama", layers=3)
    previous = install(model)
    try:
        with pytest.raises(RuntimeError, match="duocal_gating"):
            model.model(input_ids=torch.randint(0, 97, (1, 8)), use_cache=False)
    finally:
        uninstall(model, previous)
