"""Block-sparse kernels: block maps equal the dense mask reduced per block, FlexAttention equals
masked attention, H2O's attention mass without a probability matrix equals the dense sum, and
long prompts through the runtime (the FlexAttention path) equal the dense per-head reference."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

import duocal_runtime as dr
from duocal_runtime.attention import block_sparse as BS
from duocal_runtime.attention import dense as DA
from duocal_runtime.attention import ranks as R
from duocal_runtime.attention import scored as scored_attention
from duocal_runtime.attention import sink_window_attention as sink_window_kernels
from duocal_runtime.policies import heavy_hitters

from helpers.models import left_padded_batch
from helpers.reference_attention import NAME, DenseReference, runtime_kept_ranks


def sink_window_mask(q_rank, k_rank, sink, recent):
    """The StreamingLLM rule written out independently of the policy: [B, T, S]."""
    qr, kr = q_rank[..., :, None], k_rank[..., None, :]
    return (kr >= 0) & (qr >= 0) & (kr <= qr) & ((kr < sink) | (kr > qr - recent))


def ranks_with_padding(batch: int, t: int, pads: list[int], before: int = 0) -> torch.Tensor:
    valid = torch.ones(batch, t, dtype=torch.bool)
    for row, p in enumerate(pads):
        valid[row, :p] = False
    return R.ranks_of_new_tokens(valid, torch.full((batch,), before))


def stored_ranks(batch: int, slots: int, below: int, seed: int, heads: int | None = None) -> torch.Tensor:
    """Unordered stored slots with distinct ranks < `below` (some empty: -1)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch,) if heads is None else (batch, heads)
    out = torch.stack([torch.randperm(below, generator=g)[:slots] for _ in range(torch.Size(shape).numel())])
    out[:, ::5] = -1
    return out.reshape(*shape, slots)


@pytest.mark.parametrize(
    "sink,recent", [(4, 16), (130, 200), (BS.NO_SINK, None)], ids=["sink-window", "wide", "causal"]
)
def test_block_maps_are_the_dense_mask_reduced_per_block(sink, recent):
    q_rank = ranks_with_padding(2, 384, [0, 150], before=200)
    k_rank = torch.cat([stored_ranks(2, 128, 200, seed=1), q_rank], 1)
    partial, full = BS.visible_blocks(q_rank, k_rank, sink, recent)
    if recent is None:
        dense = R.causal_rank_mask(q_rank, k_rank)
    else:
        dense = sink_window_mask(q_rank, k_rank, sink, recent)
    blocks = dense.unflatten(1, (-1, BS.BLOCK)).unflatten(3, (-1, BS.BLOCK))  # [B, nq, 128, nk, 128]
    any_visible, all_visible = blocks.any(2).any(-1), blocks.all(2).all(-1)
    assert torch.equal(full, all_visible)
    assert not (any_visible & ~(partial | full)).any()  # no visible pair is ever skipped
    assert not (partial & full).any()


def test_visited_blocks_grow_linearly_with_length():
    """sink 64 + recent 256: each query block visits the sink block and at most 4 recent blocks."""
    for n in (4096, 16384):
        ranks = torch.arange(n)[None]
        partial, full = BS.visible_blocks(ranks, ranks, 64, 256)
        per_query_block = (partial | full).sum(-1)
        assert int(per_query_block.max()) <= 5
        assert int(full.sum()) > 0  # blocks inside the sink window skip the mask function


def test_padded_lengths_are_few_and_tight():
    lengths = [BS.padded_length(n) for n in range(1, 131073)]
    assert all(p >= n and p % BS.BLOCK == 0 for n, p in zip(range(1, 131073), lengths, strict=True))
    assert all(p <= 1.25 * n for n, p in zip(range(1, 131073), lengths, strict=True) if n > 8 * BS.BLOCK)
    assert len(set(lengths)) <= 8 + 4 * 7  # 8 shapes up to 1k tokens, then 4 per doubling


@pytest.mark.parametrize(
    "heads,kv,t,stored,pads", [(4, 2, 300, 0, [0, 37]), (8, 2, 520, 60, [130, 0]), (4, 4, 700, 0, [0])]
)
def test_flex_sink_window_equals_masked_attention(monkeypatch, heads, kv, t, stored, pads):
    monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", 0)
    g = torch.Generator().manual_seed(0)
    b = len(pads)
    q = torch.randn(b, heads, t, 16, generator=g)
    k, v = torch.randn(b, kv, stored + t, 16, generator=g), torch.randn(b, kv, stored + t, 16, generator=g)
    q_rank = ranks_with_padding(b, t, pads, before=stored + 10)
    k_rank = torch.cat([stored_ranks(b, stored, stored + 10, seed=2), q_rank], 1)
    out = sink_window_kernels.sink_window_attention(q, k, v, q_rank, k_rank, dr.SinkWindow(7, 100), 0.25)
    mask = sink_window_mask(q_rank, k_rank, 7, 100)[:, None]
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | ~mask.any(-1, keepdim=True), scale=0.25, enable_gqa=True
    )
    real = (q_rank >= 0)[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], want[real], rtol=0, atol=2e-6)


@pytest.mark.parametrize("route", ["blocked", "flex"])
def test_attention_mass_without_a_probability_matrix_equals_the_dense_sum(monkeypatch, route):
    """The flex route (outputs + lse, then the swapped call) runs uncompiled here: compiled
    FlexAttention has no `return_lse` on CPU. On CUDA the same code runs compiled."""
    torch._dynamo.reset()
    monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", 0)
    monkeypatch.setattr(scored_attention, "BLOCK_ELEMENTS", 4096)
    if route == "flex":
        monkeypatch.setattr(scored_attention, "flex_route", lambda device: True)
        monkeypatch.setattr(BS, "_compiled_flex_attention", lambda: flex_attention)
    g = torch.Generator().manual_seed(0)
    b, heads, kv, t, stored = 2, 4, 2, 301, 20
    q = torch.randn(b, heads, t, 16, generator=g)
    k, v = torch.randn(b, kv, stored + t, 16, generator=g), torch.randn(b, kv, stored + t, 16, generator=g)
    q_rank = ranks_with_padding(b, t, [0, 37], before=stored + 30)
    k_rank = torch.cat([stored_ranks(b, stored, stored + 30, seed=3, heads=kv), q_rank[:, None].expand(b, kv, t)], 2)
    out, mass = scored_attention.attention_with_mass(q, k, v, q_rank, k_rank, 0.25)
    logits = (DA.gqa_queries(q, kv) @ k.transpose(-1, -2)).double() * 0.25  # [B, G, R*T, S]
    visible = DA.expand_mask_over_heads(R.causal_rank_mask(q_rank[:, None], k_rank), heads // kv)
    probs = logits.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0.0)
    torch.testing.assert_close(mass.double(), probs.sum(2), rtol=0, atol=2e-5)
    want = DA.gqa_outputs((probs @ v.double()).float(), heads)
    real = (q_rank >= 0)[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], want[real], rtol=0, atol=2e-6)


@pytest.mark.parametrize("dense_limit", [0, None])  # several blocks of queries; one block
def test_a_first_pass_masked_by_one_triangle_equals_the_rank_masked_route_bit_for_bit(monkeypatch, dense_limit):
    if dense_limit is not None:
        monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", dense_limit)
        monkeypatch.setattr(scored_attention, "BLOCK_ELEMENTS", 301 * 6 * 10)  # 10 queries a block: 31 blocks
    g = torch.Generator().manual_seed(1)
    b, heads, kv, t = 1, 6, 2, 301
    q, k, v = (torch.randn(b, h, t, 16, generator=g) for h in (heads, kv, kv))
    q_rank = torch.arange(t)[None]
    k_rank = q_rank[:, None].expand(b, kv, t)
    masked = scored_attention.attention_with_mass(q, k, v, q_rank, k_rank, 0.3)
    own = scored_attention.attention_with_mass(q, k, v, q_rank, k_rank, 0.3, first_pass=True)
    assert torch.equal(own[0], masked[0]) and torch.equal(own[1], masked[1])
    probs = (
        (DA.gqa_queries(q, kv).double() @ k.double().transpose(-1, -2) * 0.3)
        .masked_fill(
            ~DA.expand_mask_over_heads(torch.ones(t, t, dtype=torch.bool).tril()[None, None], heads // kv),
            float("-inf"),
        )
        .softmax(-1)
    )
    torch.testing.assert_close(own[1].double(), probs.sum(2), rtol=0, atol=2e-5)


def test_h2o_prefill_takes_the_triangle_route_only_for_an_unpadded_first_pass(monkeypatch, tiny_llama):
    routes = []
    original = scored_attention.attention_with_mass

    def recording(*args, **kwargs):
        routes.append(args[6] if len(args) > 6 else kwargs.get("first_pass", False))
        return original(*args, **kwargs)

    monkeypatch.setattr(heavy_hitters, "attention_with_mass", recording)
    model = tiny_llama
    runtime = dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.H2O(8, 8)))
    with torch.no_grad():
        cache = runtime.new_cache()
        model(input_ids=torch.arange(1, 41)[None], cache=cache)  # first pass, no padding
        model(input_ids=torch.arange(1, 6)[None], cache=cache)  # later pass over kept slots
        ids, mask = left_padded_batch([30, 20])
        model(input_ids=ids, attention_mask=mask, cache=runtime.new_cache())  # first pass, padded
    layers = model.config.num_hidden_layers
    assert routes == [True] * layers + [False] * layers + [False] * layers
    runtime.remove()


@pytest.mark.slow
def test_long_prompts_through_the_flex_path_match_the_dense_reference(monkeypatch, tiny_llama):
    monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", 0)
    model = tiny_llama
    plan = dr.Plan(
        dr.shape_of_config(model.config), [[dr.SinkWindow(4, 40), dr.H2O(20, 24)], [dr.Full(), dr.SinkWindow(8, 100)]]
    )
    ids, mask = left_padded_batch([300, 170])
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with DenseReference(plan) as reference:
        model.set_attn_implementation(NAME)
        want = model.generate(**kwargs)
        model.set_attn_implementation("sdpa")
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        got = model.generate(**kwargs, cache=cache)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=0, atol=1e-4)
    assert torch.equal(got.sequences, want.sequences)
    for row in range(2):
        assert runtime_kept_ranks(cache, 0, row, 1) == reference.kept_ranks(0, row, 1)


def test_a_forward_pass_with_gradients_works_above_the_dense_threshold(monkeypatch, tiny_llama):
    """README promises plain forward passes work: with autograd on, CPU takes the differentiable path."""
    monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", 0)  # every pass would take compiled FlexAttention
    model = tiny_llama
    plan = dr.uniform_plan(dr.shape_of_config(model.config), dr.SinkWindow(4, 16))
    ids = torch.randint(1, 97, (1, 300))
    with dr.apply(model, plan):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        with torch.no_grad():
            again = model(input_ids=ids, labels=ids, use_cache=False).loss
    assert torch.isfinite(loss) and model.model.embed_tokens.weight.grad is not None
    torch.testing.assert_close(loss.detach(), again, rtol=0, atol=1e-5)  # the same attention either way
    model.zero_grad()


def test_a_warmup_leaves_no_compile_for_the_next_call_of_that_length(monkeypatch, tiny_llama):
    from torch._dynamo.utils import counters

    monkeypatch.setattr(DA, "DENSE_MAX_ELEMENTS", 0)  # every pass takes the compiled kernel
    model = tiny_llama
    plan = dr.Plan(dr.shape_of_config(model.config), [[dr.SinkWindow(4, 40), dr.Full()], [dr.SinkWindow(8, 100)] * 2])
    ids = torch.randint(1, 97, (1, 333))
    with dr.apply(model, plan, warmup=[333]) as runtime:
        before = dict(counters["stats"])
        model.generate(input_ids=ids, max_new_tokens=2, do_sample=False, cache=runtime.new_cache())
        assert dict(counters["stats"]) == before  # nothing was compiled (or recompiled) by the real call
        assert runtime.warmup([333]) < 30


def test_probabilities_mask_exactly_as_masked_fill_does():
    """The additive mask is exactly 0 / -inf: probabilities equal masked_fill's bit for bit, and a
    row with nothing visible (a padding query) gets all-zero probabilities."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    mask = torch.rand(1, 1, 6, 6, generator=g) > 0.4
    mask[..., 2, :] = False
    bias = DA.additive_mask(mask, torch.float32)
    assert set(bias.unique().tolist()) == {0.0, float("-inf")} and not torch.signbit(bias[mask]).any()
    out, probs = DA.attention(q, k, v, mask, 0.3, want_probs=True)
    logits = (q @ k.transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    expected = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    assert torch.equal(probs, expected) and torch.equal(out, expected @ v)
    assert torch.equal(probs[..., 2, :], torch.zeros(1, 2, 6))
