"""transformers' QuantizedCache baseline rows: made as named, their bytes counted exactly, refused clearly."""

import importlib.util

import pytest
import torch

from duocal_runtime.quant import hf_baselines as H


@pytest.mark.parametrize("row, bits", [("hqq8", 8), ("hqq4", 4)])
def test_hqq_rows_code_the_history_and_their_bytes_are_codes_scales_and_zero_points(tiny_llama, row, bits):
    config = tiny_llama.config
    tokens, extra = 400, 20  # the prompt is quantized whole (beyond the residual); 20 decoded tokens stay in fp32
    ids = torch.randint(0, config.vocab_size, (1, tokens + extra))
    cache = H.quantized_cache(row, config)
    with torch.no_grad():
        tiny_llama(input_ids=ids[:, :tokens], cache=cache)
        for i in range(tokens, tokens + extra):
            logits = tiny_llama(input_ids=ids[:, i : i + 1], cache=cache).logits
        plain = tiny_llama(input_ids=ids).logits[:, -1:]
    layer = cache.layers[0]
    assert (
        type(layer).__name__ == "HQQQuantizedLayer" and layer.nbits == bits and layer.axis_key == layer.axis_value == 1
    )
    head_dim = config.hidden_size // config.num_attention_heads
    values = config.num_key_value_heads * head_dim  # per token, per layer, keys or values
    quantized = tokens * values * bits // 8 + 2 * (tokens * values // H.GROUP) * 4  # codes + fp32 scale and zero
    residual = extra * values * 4
    assert H.cache_bytes(cache) == config.num_hidden_layers * 2 * (quantized + residual)
    error = (logits - plain).abs().max().item()
    scale = plain.abs().max().item()
    assert 0 < error < (0.03 if bits == 8 else 0.3) * scale  # quantized, and close to the model without codes


def test_unknown_rows_and_missing_backends_are_refused(tiny_llama, monkeypatch):
    with pytest.raises(ValueError, match="unknown QuantizedCache row 'quanto8'; choose from quanto4, hqq8, hqq4"):
        H.check_rows(["quanto8"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("hqq") else real(name))
    with pytest.raises(ValueError, match=r"row hqq4 needs the hqq package: pip install -c constraints.txt"):
        H.quantized_cache("hqq4", tiny_llama.config)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("optimum") else real(name))
    with pytest.raises(ValueError, match="row quanto4 needs the optimum-quanto package"):
        H.check_rows(["hqq8", "quanto4"])
