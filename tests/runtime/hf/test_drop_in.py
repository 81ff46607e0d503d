"""Drop-in generation: callers that never pass a cache (pipelines, plain generate(), forward) run under
the applied plan, with the same tokens as an explicit runtime.new_cache(); remove() gives the model back."""

import pytest
import torch
from transformers import GenerationConfig, pipeline

import duocal_runtime as dr
from duocal.models import ModelRef

from helpers.models import left_padded_batch

PLAN = [[dr.SinkWindow(2, 6), dr.H2O(3, 4)], [dr.Full(), dr.SinkH2O(2, 3, 4)]]


def run(model, **kw):
    ids, mask = left_padded_batch([30, 19])
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **kw)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_generate_without_a_cache_equals_an_explicit_one(tiny_llama, static):
    plain = run(tiny_llama)
    with dr.apply(tiny_llama, dr.Plan(dr.shape_of_config(tiny_llama.config), PLAN)) as runtime:
        explicit = run(tiny_llama, cache=runtime.new_cache(max_length=38) if static else runtime.new_cache())
        implicit = run(tiny_llama, cache_implementation="static") if static else run(tiny_llama)
        config = GenerationConfig(max_new_tokens=8, do_sample=False, cache_implementation="static" if static else None)
        from_config = run(tiny_llama, generation_config=config)
    assert torch.equal(implicit, explicit) and torch.equal(from_config, explicit)
    assert not torch.equal(explicit, plain)  # the plan really applied
    assert torch.equal(run(tiny_llama), plain)  # and remove() took it away
    assert "generate" not in vars(tiny_llama) and "forward" not in vars(tiny_llama)


def test_forward_without_a_cache_makes_one_of_the_runtime(tiny_llama):
    ids, mask = left_padded_batch([25])
    with dr.apply(tiny_llama, dr.Plan(dr.shape_of_config(tiny_llama.config), PLAN)) as runtime:
        out = tiny_llama(input_ids=ids, attention_mask=mask)
        assert isinstance(out.past_key_values, dr.DuoCache) and out.past_key_values.get_seq_length() == 25
        explicit = tiny_llama(input_ids=ids, attention_mask=mask, cache=runtime.new_cache())
        torch.testing.assert_close(out.logits, explicit.logits, rtol=0, atol=0)
        with pytest.raises(ValueError, match="cache_implementation='offloaded'"):
            run(tiny_llama, cache_implementation="offloaded")


def test_a_pipeline_generates_under_the_plan():
    ref = ModelRef.resolve(None)
    lm, tok = ref.load_model(), ref.load_tokenizer()
    plan = dr.plan(dr.load_profile(ref.default_profile), sparsity=0.5)
    texts = ["the passkey is 12345. the passkey is", "abc abc abc abc"]
    with dr.apply(lm, plan) as runtime:
        pipe = pipeline("text-generation", model=lm, tokenizer=tok)
        got = [r[0]["generated_text"] for r in pipe(texts, max_new_tokens=8, do_sample=False)]
        want = []
        for text in texts:
            ids = tok(text, return_tensors="pt")
            out = lm.generate(**ids, max_new_tokens=8, do_sample=False, cache=runtime.new_cache())
            want.append(tok.decode(out[0], skip_special_tokens=True))
    assert got == want
