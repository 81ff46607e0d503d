"""transformers' QuantizedCache baseline rows: made as named, their bytes counted exactly, refused clearly."""

import importlib.util

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from duocal_runtime import hf_quantized as H

CONFIG = LlamaConfig(
    num_hidden_layers=2,
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=300,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).eval()


@pytest.mark.parametrize("row, bits", [("hqq8", 8), ("hqq4", 4)])
def test_hqq_rows_code_the_history_and_their_bytes_are_codes_scales_and_zero_points(model, row, bits):
    tokens, extra = 400, 20  # the prompt is coded whole (beyond the residual); 20 decoded tokens stay in fp32
    ids = torch.randint(0, CONFIG.vocab_size, (1, tokens + extra))
    cache = H.quantized_cache(row, CONFIG)
    with torch.no_grad():
        model(input_ids=ids[:, :tokens], cache=cache)
        for i in range(tokens, tokens + extra):
            logits = model(input_ids=ids[:, i : i + 1], cache=cache).logits
        plain = model(input_ids=ids).logits[:, -1:]
    assert type(cache.layers[0]).__name__ == "HQQQuantizedLayer" and cache.layers[0].nbits == bits
    head_dim = CONFIG.hidden_size // CONFIG.num_attention_heads
    values = CONFIG.num_key_value_heads * head_dim  # per token, per layer, keys or values
    coded = tokens * values * bits // 8 + 2 * (tokens * values // H.GROUP) * 4  # codes + fp32 scale and zero
    residual = extra * values * 4
    assert H.cache_bytes(cache) == CONFIG.num_hidden_layers * 2 * (coded + residual)
    error = (logits - plain).abs().max().item()
    assert 0 < error < (0.05 if bits == 8 else 0.5)  # coded, and close to the model without codes


def test_unknown_rows_and_missing_backends_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown QuantizedCache row 'quanto8'; choose from quanto4, hqq8, hqq4"):
        H.check_rows(["quanto8"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("hqq") else real(name))
    with pytest.raises(ValueError, match=r"row hqq4 needs the hqq package: pip install -c constraints.txt"):
        H.quantized_cache("hqq4", CONFIG)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("optimum") else real(name))
    with pytest.raises(ValueError, match="row quanto4 needs the optimum-quanto package"):
        H.check_rows(["hqq8", "quanto4"])
