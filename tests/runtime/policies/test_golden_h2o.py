"""The `h2o` policy against the official H2O code (FMInference/H2O `utils_real_drop`).

`tests/data/golden-h2o` holds that code's token-by-token output on a tiny multi-head Llama
(hh_size 8, recent 16): generated tokens, logits, and per step, layer and head the kept
positions and their accumulated scores. We must reproduce every token and every kept set.
"""

import json

import pytest
import torch
from transformers import LlamaForCausalLM

import duocal_runtime as dr

from helpers.paths import GOLDEN_H2O


@pytest.fixture(scope="module")
def golden():
    data = json.loads((GOLDEN_H2O / "golden.json").read_text())
    model = LlamaForCausalLM.from_pretrained(GOLDEN_H2O, dtype=torch.float32).eval()
    return data, model


def generate(model, run, cache):
    ids = torch.tensor([run["prompt_ids"]])
    # an explicit all-ones mask: the prompt contains token 0, which generate would otherwise take for padding
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=run["num_generated"],
        do_sample=False,
        cache=cache,
        eos_token_id=None,
        pad_token_id=0,
    )


def h2o_state(cache: dr.DuoCache, layer: int, head: int):
    (group,) = cache.head_groups(layer)
    order = group.rank[0, head].argsort()
    return group.rank[0, head][order].tolist(), group.score[0, head][order]


@pytest.mark.parametrize("run_index", [0, 1])
def test_h2o_reproduces_the_reference_token_by_token(golden, run_index):
    data, model = golden
    run = data["runs"][run_index]
    settings = data["h2o"]
    plan = dr.uniform_plan(
        dr.shape_of_config(model.config), dr.H2O(heavy=settings["hh_size"], recent=settings["recent_size"])
    )
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        ids = torch.tensor([run["prompt_ids"]])
        generated = []
        for k, step in enumerate(run["h2o"]["steps"]):
            positions = torch.tensor([step["input_positions"]])
            logits = model(input_ids=ids, position_ids=positions, cache=cache).logits[0, -1]
            torch.testing.assert_close(logits, torch.tensor(step["logits"]), rtol=0, atol=1e-4)
            token = int(logits.argmax())
            assert token == step["next_token"], f"{run['name']} step {k}"
            generated.append(token)
            for layer, heads in enumerate(step["kept_positions"]):
                for head, kept in enumerate(heads):
                    ranks, scores = h2o_state(cache, layer, head)
                    assert ranks == kept, f"{run['name']} step {k} layer {layer} head {head}"
                    want = torch.tensor(step["kept_scores"][layer][head])
                    torch.testing.assert_close(scores, want, rtol=0, atol=1e-4)
            ids = torch.tensor([[token]])
    assert generated == run["h2o"]["generated_ids"]


@pytest.mark.parametrize("run_index", [0, 1])
def test_all_full_plan_reproduces_the_reference_full_cache(golden, run_index):
    data, model = golden
    run = data["runs"][run_index]
    plan = dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())
    with dr.apply(model, plan) as runtime:
        out = generate(model, run, runtime.new_cache())
    assert out[0, run["prompt_len"] :].tolist() == run["full_cache"]["generated_ids"]


@pytest.mark.parametrize("run_index", [0, 1])
def test_generate_reproduces_the_reference_tokens(golden, run_index):
    data, model = golden
    run = data["runs"][run_index]
    plan = dr.uniform_plan(dr.shape_of_config(model.config), dr.H2O(heavy=8, recent=16))
    with dr.apply(model, plan) as runtime:
        out = generate(model, run, runtime.new_cache())
    assert out[0, run["prompt_len"] :].tolist() == run["h2o"]["generated_ids"]
