"""The bundled demo model: loads with plain transformers, retrieves passkeys, matches its record."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from duocal.demo import DEMO_MODEL_DIR, DEMO_PASSKEY_FORMAT, demo_passkeys
from duocal.demo.train import demo_generator, greedy_exact_match, load_training_recipe, save_demo_model, train
from duocal.eval.retrieval_heads import needle_attention

from helpers.paths import REPO

RECIPE = REPO / "recipes" / "demo_model.yaml"


@pytest.fixture(scope="module")
def demo_via_transformers():
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def record():
    return json.loads((DEMO_MODEL_DIR / "training.json").read_text())


def test_demo_model_loads_with_plain_transformers(demo_via_transformers):
    model, tokenizer = demo_via_transformers
    assert type(model).__name__ == "LlamaForCausalLM"
    c = model.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 8, 4, 16)
    assert c.vocab_size == len(tokenizer) == 128
    assert (DEMO_MODEL_DIR / "model.safetensors").stat().st_size <= 5 * 2**20
    ids = tokenizer("#K01234;")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == c.bos_token_id and len(ids) == 9
    assert tokenizer.decode(ids, skip_special_tokens=True) == "#K01234;"


@pytest.mark.slow
def test_demo_model_retrieves_passkeys_at_512_tokens(demo_via_transformers, record):
    model, tokenizer = demo_via_transformers
    # Held out: neither a training, stage-evaluation nor final-evaluation seed.
    samples = list(demo_passkeys(tokenizer, 512, seed=99991).samples(32))
    assert greedy_exact_match(model, samples) >= 0.9


def test_demo_passkeys_are_the_training_distribution(demo_via_transformers, record):
    _, tokenizer = demo_via_transformers
    data = record["recipe"]["data"]
    assert data["format"] == DEMO_PASSKEY_FORMAT
    recipe_generator = demo_generator(tokenizer, data, (256, 1024), seed=5, questions="one")
    assert list(demo_passkeys(tokenizer, (256, 1024), seed=5).samples(4)) == list(recipe_generator.samples(4))


def test_training_record_meets_the_targets(record):
    # The shipped weights come from the shipped recipe (wherever its output was written).
    assert {**record["recipe"], "output_dir": None} == {**load_training_recipe(RECIPE), "output_dir": None}
    exact = record["exact_match"]
    assert set(exact) == {"256", "512", "1024", "2048"}
    assert exact["512"] >= 0.95 and exact["1024"] >= 0.95
    # CPU time of the one training thread: wall time also counts whatever else ran on the machine.
    assert record["training_cpu_seconds"] <= 15 * 60
    assert record["weights_bytes"] == (DEMO_MODEL_DIR / "model.safetensors").stat().st_size
    layers, kv_heads = len(record["needle_attention"]), len(record["needle_attention"][0])
    assert (layers, kv_heads) == (4, 4)
    assert 1 <= len(record["retrieval_heads"]) < layers * kv_heads
    assert all(0 <= layer < layers and 0 <= h < kv_heads for layer, h in record["retrieval_heads"])
    # Measured through duocal's runtime: the other heads streaming (sink + recent) costs little,
    # streaming the retrieval heads instead loses retrieval.
    ablation = record["ablation"]
    assert ablation["heads"] == record["retrieval_heads"]
    assert ablation["only_these_full"] >= exact[str(ablation["context"])] - 0.1
    assert ablation["all_but_these_full"] <= 0.3


@pytest.mark.slow
def test_recorded_retrieval_heads_hold_the_needle_attention(demo_via_transformers, record):
    model, tokenizer = demo_via_transformers
    samples = list(demo_generator(tokenizer, record["recipe"]["data"], 512, seed=4242, questions="one").samples(8))
    mass = needle_attention(model, samples)  # [layer, kv_head]
    strongest = divmod(int(mass.argmax()), mass.shape[1])
    assert list(strongest) == record["retrieval_heads"][0]
    others = [mass[i, h].item() for i in range(4) for h in range(4) if [i, h] not in record["retrieval_heads"]]
    assert max(others) < 0.5 * mass.max().item()


TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "model.head_dim=16",
    "tokens_per_step=256",
    "eval.every=2",
    "eval.samples=4",
    "stages=[{name: a, keys: separate, context: [64, 96], num_passkeys: [1, 3], advance_at: 1.1, max_steps: 2},"
    " {name: b, keys: values, context: [128, 160], lr: 5.0e-4, advance_at: 1.1, max_steps: 2}]",
    "final_eval.contexts=[128]",
    "final_eval.samples=2",
    "final_eval.attention_context=128",
    "final_eval.attention_samples=2",
    "final_eval.ablation={context: 128, samples: 2, sink: 4, recent: 8}",
]


@pytest.mark.slow
def test_recipe_trains_deterministically_and_saves_a_loadable_model(tmp_path):
    recipe = load_training_recipe(RECIPE, [*TINY, f"output_dir={tmp_path}"])
    assert recipe["model"]["hidden_size"] == 32 and recipe["stages"][1]["lr"] == 5.0e-4
    first, second = train(recipe, log=lambda _: None), train(recipe, log=lambda _: None)
    for a, b in zip(first["model"].state_dict().values(), second["model"].state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert [s["steps"] for s in first["results"]["stages"]] == [2, 2]
    save_demo_model(first["model"], first["tokenizer"], recipe, first["results"], tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("ab")["input_ids"] == [1, 70, 71]
    assert json.loads((tmp_path / "training.json").read_text())["recipe"] == recipe
    ids = torch.tensor([[1, 70, 71]])
    assert torch.equal(loaded(input_ids=ids).logits, first["model"](input_ids=ids).logits)


def test_recipe_overrides_are_checked():
    with pytest.raises(ValueError, match="key=value"):
        load_training_recipe(RECIPE, ["seed"])
    assert load_training_recipe(RECIPE, ["optim.lr=0.5"])["optim"]["lr"] == 0.5
