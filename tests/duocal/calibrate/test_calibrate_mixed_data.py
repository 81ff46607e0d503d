"""`data.format: mixed` in a calibration recipe: every kind of passkey prompt (number, word and UUID values; the
chat template and plain text; both haystacks), each followed by its answer, and the answer's tokens, and only they,
carry the distillation loss; a tiny model with SmolLM2's tokenizer calibrates on them end to end."""

import json

import pytest
import transformers as tf
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.calibrate.batches import StepData, make_generator
from duocal.calibrate.nested_ranking import HAYSTACKS, prompt_kinds
from duocal.calibrate.recipe import DataSection, load_recipe
from duocal.cli.app import app
from duocal.data.needle_values import kind_of

MIXED = {"format": "mixed", "haystack": "repeated,text", "context": [500, 700], "num_passkeys": 1, "seed": 3}


def test_mixed_samples_hold_every_kind_and_only_the_answer_is_scored(smollm2_tokenizer):
    generator = make_generator(DataSection(**MIXED), smollm2_tokenizer)
    samples = generator.samples(12)
    assert generator.samples(2, start=5) == samples[5:7]  # sample i is always the same
    assert len({s.kind for s in samples}) == 12  # 3 values x 2 framings x 2 haystacks
    for sample in samples:
        assert 400 <= len(sample) <= 700
        answer = smollm2_tokenizer.decode([sample.input_ids[p + 1] for p in sample.predict_positions])
        assert answer == smollm2_tokenizer.decode(sample.input_ids[sample.prompt_end :])  # every answer token
        assert answer.strip().removeprefix("The pass key is ").rstrip(".") in sample_text(smollm2_tokenizer, sample)
        assert kind_of(answer.strip().removeprefix("The pass key is ").rstrip(".")) == sample.kind.split()[0]
    step = StepData(generator, 0, batch_size=2, micro_batch_size=1)
    for batch, sample in zip(step.micro_batches(0, 0), step.samples(0), strict=True):
        assert batch.positions[0].nonzero().flatten().tolist() == list(sample.predict_positions)


def sample_text(tokenizer, sample) -> str:
    return tokenizer.decode(sample.input_ids[: sample.prompt_end])


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"format": "digits", "values": ["uuid"]}, "data.values chooses mixed samples: set data.format: mixed"),
        ({**MIXED, "num_passkeys": [1, 2]}, "mixed samples hide one key each"),
        ({**MIXED, "values": ["emoji"]}, "data.values takes number, word, uuid"),
        ({**MIXED, "haystack": "synthetic"}, "data.haystack takes repeated, text"),
    ],
)
def test_bad_mixed_settings_are_refused(smollm2_tokenizer, settings, message):
    with pytest.raises(ValueError, match=message):
        make_generator(DataSection(**settings), smollm2_tokenizer)


def tiny_model_folder(tokenizer, folder, layers: int = 2):
    """A random-weight Llama of `layers` x 2 KV heads with `tokenizer`, saved in `folder`."""
    config = tf.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=2048,
    )  # fmt: skip
    tf.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_tiny_model_calibrates_on_mixed_samples(smollm2_tokenizer, tmp_path):
    folder = tiny_model_folder(smollm2_tokenizer, tmp_path / "model")
    overrides = [f"model.name_or_path={folder}", "data.format=mixed", "data.haystack=repeated,text"]
    overrides += ["data.context=[500,600]", "data.num_passkeys=1", "data.depth=[0.1,0.9]"]
    recipe = load_recipe(None, overrides)
    assert recipe.data.values == ["number", "word", "uuid"] and recipe.data.framings == ["chat", "plain"]
    out = tmp_path / "run"
    overrides += ["attention.sink=4", "attention.recent=16", "attention.block=16", "ranking.method=gates"]
    result = CliRunner().invoke(
        app, ["calibrate", *overrides, "train.steps=2", "train.batch_size=2", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2] and lines[0]["distill_loss"] == 0.0  # gates start at 1
    assert lines[1]["distill_loss"] > 0 and lines[1]["reg_loss"] < 1.0  # the gates moved: the answer's loss
    assert json.loads((out / "profile.json").read_text())["source"]["recipe"]["data"]["format"] == "mixed"


def test_a_nested_ranking_orders_the_calibrated_heads_sparsest_plan_first(smollm2_tokenizer, tmp_path):
    """`ranking.nested`: after the training, each tier of the plans at 0.9375 ... 0.5 (8 heads: 1, 2, 3, 4 full)
    holds the heads before it, measured on prompts of every kind; the profile records the tiers."""
    folder = tiny_model_folder(smollm2_tokenizer, tmp_path / "model", layers=4)
    overrides = [f"model.name_or_path={folder}", "attention.sink=4", "attention.recent=16", "attention.block=16"]
    overrides += ["data.format=digits", "data.haystack=repeated", "data.num_passkeys=1", "data.context=[200,300]"]
    overrides += ["ranking.method=gates", "ranking.nested=true", "deploy.sink=4"]
    overrides += ["deploy.recent=16", "ranking.nested_samples=3", "ranking.nested_context=400", "train.steps=2"]
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["calibrate", *overrides, "--output", str(out)])
    assert result.exit_code == 0, result.output
    profile = dr.load_profile(out / "profile.json")
    tiers = profile.source["ranking"]["nested"]
    assert [(t["sparsity"], len(t["added"])) for t in tiers] == [(0.875, 1), (0.75, 1), (0.625, 1), (0.5, 1)]
    assert profile.source["ranking"]["samples"] == 3
    flat = [s for row in profile.scores for s in row]
    assert len(set(flat)) == 8  # a strict order
    full_before = set()
    for tier in tiers:
        full_before |= {tuple(h) for h in tier["added"]}
        plan = dr.plan(profile, sparsity=tier["sparsity"])
        full = {(layer, h) for layer, row in enumerate(plan.policies) for h, p in enumerate(row) if p.name == "full"}
        assert full_before <= full and len(full) == 8 - round(tier["sparsity"] * 8)


def test_the_nested_ranking_asks_every_kind_the_tokenizer_can_frame(smollm2_tokenizer):
    plain_only = type("NoTemplate", (), {"chat_template": None})()
    digits = load_recipe(None, [])
    assert prompt_kinds(digits, smollm2_tokenizer) == (("number", "word", "uuid"), ("chat", "plain"), HAYSTACKS)
    assert prompt_kinds(digits, plain_only)[1] == ("plain",)
    mixed = load_recipe(None, ["data.format=mixed", "data.haystack=text", "data.num_passkeys=1", "data.values=[uuid]"])
    assert prompt_kinds(mixed, smollm2_tokenizer) == (("uuid",), ("chat", "plain"), ("text",))
