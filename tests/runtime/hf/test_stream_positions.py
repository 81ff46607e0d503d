"""Sink-window heads that see positions within their cache (`SinkWindow(positions="cache")`, StreamingLLM's rule).

The oracle: with every head a sink window, a token's logits depend only on the sink tokens and the last
layers x recent tokens before it. So the same tokens give the same logits deep into a stream (past many
times the trained length) as fed fresh after the same sinks, if and only if the heads see positions within
their cache; with original positions the sinks sit ever further away and the logits change. The tiny models
here are trained (configured) for 64 positions, so a stream crosses that length every pass and the
position base moves all the time.
"""

import pytest
import torch

import duocal_runtime as dr

from helpers.models import left_padded_batch, tiny_model

TRAINED = 64
SINK, RECENT = 4, 28
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def streaming_model(family="llama", layers=2, dtype=torch.float32, **config):
    """A tiny random model of `family` trained (configured) for TRAINED positions; `config` overrides."""
    return tiny_model(family, layers=layers, dtype=dtype, **{"max_position_embeddings": TRAINED, **config})


def every_head(model, positions="cache", sink=SINK, recent=RECENT) -> dr.Plan:
    return dr.uniform_plan(dr.shape_of_config(model.config), dr.SinkWindow(sink, recent, positions=positions))


def tokens(n, seed):
    return torch.randint(1, 97, (1, n), generator=torch.Generator().manual_seed(seed))


class Stream:
    """Sinks, a filler of `length` tokens fed in passes, then `context` and `probe` through one cache."""

    def __init__(self, model, length, pass_tokens=1024, layers=2):
        self.model, self.length, self.pass_tokens = model, length, pass_tokens
        self.sinks, self.probe = tokens(SINK, 1), tokens(40, 2)
        self.context = tokens(layers * RECENT + 8, 3)  # every token a probe's logits can depend on

    def far_logits(self, runtime, jump=0):
        cache = runtime.new_cache()
        with torch.no_grad():
            self.model(input_ids=self.sinks, cache=cache)
            done = 0
            while done < self.length:
                n = min(self.pass_tokens, self.length - done)
                self.model(input_ids=tokens(n, 100 + done), cache=cache, logits_to_keep=1)
                done += n
            if jump:
                jump_stream(cache, jump)
            self.model(input_ids=self.context, cache=cache, logits_to_keep=1)
            return self.model(input_ids=self.probe, cache=cache).logits, cache

    def fresh_logits(self, runtime):
        ids = torch.cat([self.sinks, self.context, self.probe], dim=1)
        with torch.no_grad():
            return self.model(input_ids=ids, cache=runtime.new_cache()).logits[:, -self.probe.shape[1] :]


def jump_stream(cache, tokens_passed: int) -> None:
    """The state a stream `tokens_passed` tokens longer leaves, its window holding the same keys: ranks and
    counters move on, and so does the position base (the keys stay where the model put them)."""
    for layer in cache.layers:
        layer.seen += tokens_passed
        layer.real += tokens_passed
        layer.position_base += tokens_passed
        for group in layer.groups:
            group.rank = torch.where(group.rank >= group.policy.sink, group.rank + tokens_passed, group.rank)


@pytest.mark.parametrize(
    "family, config",
    [("llama", {"rope_parameters": LLAMA3_ROPE}), ("mistral", {}), ("qwen2", {}), ("qwen3", {})],
    ids=["llama-llama3-rope", "mistral", "qwen2", "qwen3"],
)
def test_deep_in_a_stream_the_logits_are_those_of_the_same_tokens_fed_fresh(family, config):
    model = streaming_model(family, **config)
    stream = Stream(model, length=20 * TRAINED, pass_tokens=100)
    with dr.apply(model, every_head(model)) as runtime:
        far, cache = stream.far_logits(runtime)
        fresh = stream.fresh_logits(runtime)
    assert int(cache.layers[0].position_base) > 0, "the stream never moved its position base"
    torch.testing.assert_close(far, fresh, rtol=0, atol=1e-4)


def test_at_32k_tokens_cache_positions_hold_and_original_positions_do_not():
    """4x SmolLM2's trained length (512x the tiny model's): the mutation that gives the heads their original
    positions back fails the same comparison."""
    model = streaming_model()
    stream = Stream(model, length=32_768)
    with dr.apply(model, every_head(model)) as runtime:
        far, _ = stream.far_logits(runtime)
        fresh = stream.fresh_logits(runtime)
    torch.testing.assert_close(far, fresh, rtol=0, atol=1e-4)
    with dr.apply(model, every_head(model, positions="original")) as runtime:
        far, _ = stream.far_logits(runtime)
        fresh = stream.fresh_logits(runtime)
    assert (far - fresh).abs().max() > 0.1


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, None)], ids=["fp32", "bf16"])
def test_at_stream_offset_4m_the_logits_are_those_at_offset_0(dtype, atol):
    """Float32 RoPE angles at position 4,000,000 are off by a tenth of a radian: the model is never given
    such a position, and the rotations the heads make are by whole, small numbers of positions. bf16: the
    difference is within twice bf16's own (the same fresh tokens in bf16 against float32)."""
    model = streaming_model(dtype=dtype)
    stream = Stream(model, length=3 * TRAINED, pass_tokens=50)
    with dr.apply(model, every_head(model)) as runtime:
        far, cache = stream.far_logits(runtime, jump=4_000_000)
        fresh = stream.fresh_logits(runtime)
    assert int(cache.layers[0].real) > 4_000_000
    if atol is None:
        exact = streaming_model()
        with dr.apply(exact, every_head(exact)) as runtime:
            reference = Stream(exact, length=0).fresh_logits(runtime)
        atol = 2 * (fresh.float() - reference).abs().max().item()
    torch.testing.assert_close(far.float(), fresh.float(), rtol=0, atol=atol)


def test_the_model_never_gets_a_position_past_its_trained_length_and_sinks_never_move():
    model = streaming_model()
    given = []
    rotary = model.model.rotary_emb
    hook = rotary.register_forward_hook(
        lambda module, args, kwargs, out: given.append(int(kwargs["position_ids"].max())), with_kwargs=True
    )
    pass_tokens = 8  # a cache of 8 and passes of 8: the base moves at the trained length (64)
    with dr.apply(model, every_head(model, recent=4)) as runtime:
        cache = runtime.new_cache()
        with torch.no_grad():
            model(input_ids=tokens(SINK + 4, 1), cache=cache)
            first_sinks = cache.layers[1].groups[0].k[:, :, :SINK].clone()
            for seed in range(200):
                model(input_ids=tokens(pass_tokens, seed), cache=cache, logits_to_keep=1)
    hook.remove()
    assert max(given) < TRAINED + pass_tokens
    assert torch.equal(cache.layers[1].groups[0].k[:, :, :SINK], first_sinks)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_left_padded_batch_generates_past_the_trained_length_as_each_row_alone(family):
    model = streaming_model(family)
    ids, mask = left_padded_batch([150, 90, 40])
    with dr.apply(model, every_head(model, recent=12)), torch.no_grad():
        batch = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=60, do_sample=False)
        for row, n in enumerate([150, 90, 40]):
            alone = model.generate(input_ids=ids[row : row + 1, -n:], max_new_tokens=60, do_sample=False)
            assert torch.equal(alone[0, -60:], batch[row, -60:]), f"row {row}"


def test_sampling_and_a_cache_reused_across_turns():
    model = streaming_model()
    turn1, turn2 = tokens(70, 5), tokens(50, 6)
    with dr.apply(model, every_head(model, recent=12)) as runtime, torch.no_grad():
        sampled = []
        for _ in range(2):
            torch.manual_seed(7)
            sampled.append(model.generate(input_ids=turn1, max_new_tokens=90, do_sample=True))
        cache = runtime.new_cache()
        answer = model.generate(input_ids=turn1, max_new_tokens=30, do_sample=False, cache=cache)
        conversation = torch.cat([answer, turn2], dim=1)
        mask = torch.ones_like(conversation)  # the random model may answer token 0, its pad token
        continued = model.generate(
            input_ids=conversation, attention_mask=mask, max_new_tokens=30, do_sample=False, cache=cache
        )
        from_scratch = model.generate(input_ids=conversation, attention_mask=mask, max_new_tokens=30, do_sample=False)
    assert torch.equal(sampled[0], sampled[1])
    assert torch.equal(continued, from_scratch)


def test_positions_are_a_choice_of_sink_windows_that_plans_and_profiles_carry(tmp_path):
    from dataclasses import replace

    from helpers.profiles import random_profile

    with pytest.raises(dr.PlanError, match=r"positions must be 'original'.*or 'cache'"):
        dr.SinkWindow(4, 8, positions="nearby")
    profile = random_profile()
    plan = dr.plan(profile, sparsity=1.0, positions="cache")
    assert plan.distances_bounded and plan.cache_positions
    assert "positions=cache" in plan.summary()
    assert dr.Plan.from_dict(plan.to_dict()) == plan
    assert dr.plan(profile, sparsity=1.0).policies == dr.plan(profile, sparsity=1.0, positions="original").policies
    mixed = dr.plan(profile, sparsity=0.5, positions="cache")
    assert mixed.cache_positions and not mixed.distances_bounded  # its full heads see original positions
    with pytest.raises(dr.PlanError, match="h2o heads keep their original positions"):
        dr.plan(profile, sparsity=0.5, policy="h2o", positions="cache")
    deploy = profile.deploy.with_sizes(dr.SinkWindow(4, 1020, positions="cache"))
    saved = dr.save_profile(replace(profile, deploy=deploy), tmp_path / "p.json")
    again = dr.load_profile(saved)
    assert again.deploy.sizes["sink_window"] == {"sink": 4, "recent": 1020, "positions": "cache"}
    assert dr.plan(again, sparsity=1.0).distances_bounded
    assert not dr.plan(again, sparsity=1.0, positions="original").cache_positions


def test_models_whose_rope_does_not_compose_and_foreign_positions_are_refused():
    dynamic = streaming_model(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(dr.PlanError, match="rope_type 'dynamic' changes its frequencies"):
        dr.apply(dynamic, every_head(dynamic))
    dr.apply(dynamic, every_head(dynamic, positions="original")).remove()  # original positions need no rotation
    model = streaming_model()
    ids = tokens(10, 1)
    with dr.apply(model, every_head(model)), torch.no_grad():
        with pytest.raises(ValueError, match="leave position_ids out"):
            model(input_ids=ids, position_ids=torch.arange(10)[None] + 5)
        model(input_ids=ids, position_ids=torch.arange(10)[None])  # the ranks themselves are fine


def duo_plan(model) -> dr.Plan:
    """A DuoAttention plan: one full head and one cache-position sink window per layer."""
    shape = dr.shape_of_config(model.config)
    return dr.Plan(shape, [[dr.Full(), dr.SinkWindow(SINK, 12, positions="cache")]] * shape.num_hidden_layers)


def test_a_duoattention_plan_with_cache_positions_batches_as_each_row_alone_and_static_equals_dynamic():
    model = streaming_model(max_position_embeddings=512)  # full heads: within the trained length
    ids, mask = left_padded_batch([60, 35])
    with dr.apply(model, duo_plan(model)) as runtime, torch.no_grad():
        dynamic = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
        static = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False, cache=runtime.new_cache(100)
        )
        alone = model.generate(input_ids=ids[1:, -35:], max_new_tokens=40, do_sample=False)
    assert torch.equal(static, dynamic)
    assert torch.equal(alone[0, -40:], dynamic[1, -40:])


@pytest.mark.slow
def test_compiled_static_decode_with_cache_positions_gives_the_eager_tokens():
    from helpers.models import cpu_compile_config, greedy_with_logits

    model = streaming_model()
    ids, mask = left_padded_batch([40, 25])
    with dr.apply(model, every_head(model, recent=12)) as runtime:
        want, want_logits = greedy_with_logits(model, ids, mask, runtime.new_cache(), steps=30)
        got, logits = greedy_with_logits(
            model, ids, mask, runtime.new_cache(max_length=70), steps=30, compile_config=cpu_compile_config()
        )
    assert hasattr(model, "_compiled_call"), "generate() did not compile the decode step"
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-4)


def test_the_base_moves_at_the_trained_length_unless_a_key_would_move_more_than_twice_in_its_life():
    from duocal_runtime.hf.stream_positions import move_threshold

    assert move_threshold(8192, 1024, 1024) == 8192  # SmolLM2, sink 4 + recent 1020, passes of 1,024
    assert move_threshold(8192, 1024, 1) == 8192
    assert move_threshold(8192, 8192, 1024) == 3 * (8192 + 1024)  # a cache as long as the trained length
