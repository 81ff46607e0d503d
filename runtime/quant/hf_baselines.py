"""transformers' `QuantizedCache` as a baseline: the rows `quanto4`, `hqq8` and `hqq4`.

transformers' own KV quantization is uniform over heads, keeps the newest `residual_length` tokens
in the model's dtype and dequantizes the whole quantized history at every step. Its backends are
optional packages: optimum-quanto (2 or 4 bits in transformers 5.24) and HQQ (1, 2, 3, 4 or 8);
both install with torch pinned (`pip install -c constraints.txt -e '.[bench]'`). Every row here
takes the same residual (128) and group (32) as duocal's KIVI codes, so a row compares the two at
one width. HQQ rows group along axis 1 (32 neighbouring channels of one token, HQQ's recommended
axis): with transformers' default axis 0 a group is a strided set of elements, and SmolLM2's
perplexity at 4 bits rose 30% instead of 0.6%. quanto keeps transformers' defaults.
"""

from __future__ import annotations

import importlib.util

from .codes import GROUP, RESIDUAL

BACKENDS = {"quanto": ("optimum.quanto", "optimum-quanto"), "hqq": ("hqq", "hqq")}
HF_QUANTIZED = {"quanto4": ("quanto", 4), "hqq8": ("hqq", 8), "hqq4": ("hqq", 4)}  # row -> (backend, bits)
AXES = {"quanto": {}, "hqq": {"axis_key": 1, "axis_value": 1}}


def bits_of(row: str) -> int:
    return HF_QUANTIZED[row][1]


def check_rows(rows) -> None:
    """Raise `ValueError` for a name that is not one of HF_QUANTIZED, or a backend not installed here."""
    unknown = [r for r in rows if r not in HF_QUANTIZED]
    if unknown:
        raise ValueError(
            f"unknown QuantizedCache row {', '.join(map(repr, unknown))}; choose from {', '.join(HF_QUANTIZED)} "
            "(transformers 5.24's quanto backend stores 2 or 4 bits, HQQ 8 too)"
        )
    for row in rows:
        module, package = BACKENDS[HF_QUANTIZED[row][0]]
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            raise ValueError(
                f"row {row} needs the {package} package: pip install -c constraints.txt -e '.[bench]' "
                "(with torch pinned, so that no CUDA build is pulled in)"
            )


def quantized_cache(row: str, model_config):
    """A fresh `QuantizedCache` of the row (checked first: a clear error when its backend is missing)."""
    check_rows([row])
    from transformers import QuantizedCache

    backend, bits = HF_QUANTIZED[row]
    return QuantizedCache(
        config=model_config, backend=backend, nbits=bits, residual_length=RESIDUAL, q_group_size=GROUP, **AXES[backend]
    )


def tensor_bytes(t) -> int:
    """Bytes of a tensor, or of the inner tensors of a subclass (quanto's codes, scales, shifts)."""
    if hasattr(t, "__tensor_flatten__"):
        return sum(tensor_bytes(getattr(t, name)) for name in t.__tensor_flatten__()[0])
    return t.nbytes


def quantized_layer_bytes(layer) -> int:
    """Bytes a layer of a `QuantizedCache` holds in codes: quanto's tensors, or HQQ's codes with their
    metadata (scale and zero point)."""
    total = 0
    for name in ("_quantized_keys", "_quantized_values"):
        quantized = getattr(layer, name, None)
        if quantized is None:
            continue
        if isinstance(quantized, tuple):  # HQQ: (codes, meta)
            codes, meta = quantized
            total += tensor_bytes(codes) + sum(meta[k].nbytes for k in ("scale", "zero") if k in meta)
        else:
            total += tensor_bytes(quantized)
    return total


def cache_bytes(cache) -> int:
    """KV bytes of a transformers cache: codes, their scales and zero points, and what is in full precision."""
    full = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if layer.keys is not None)
    return full + sum(quantized_layer_bytes(layer) for layer in cache.layers)
