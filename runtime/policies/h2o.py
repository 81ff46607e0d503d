"""`h2o`: a head keeps the last `recent` tokens and the `heavy` earlier ones with the most attention.

Heavy-hitter oracle (Zhang et al., NeurIPS 2023, arXiv 2306.14048), reproducing the official code
(FMInference/H2O `utils_real_drop`) token by token. Per head: the last `recent` real tokens, plus
(for `sink_h2o`, see sink_h2o.py) the first `sink`, plus the `heavy` others with the largest
attention mass accumulated over every query so far, summed over the query heads of the KV group
(the slots, scores and eviction: heavy_hitters.py).

`kv_bits` 8 or 4 stores each slot's keys and values as codes of that token alone (per token over
groups of `group` channels, quant/codes.py `encode_tokens`): a slot is evicted and refilled on its
own, so KIVI's keys per channel over groups of tokens have no place here. A decode step reads the
stored codes as they are (quant/attention.py `token_key_scores` / `weighted_values`), a prefill pass
decodes them (at most `capacity` per head); a pass's own tokens are attended in full precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quant import attention as QA
from ..quant import codes as Q
from .base import register_policy
from .heavy_hitters import H2OGroup, HeavyHitterPolicy, StaticH2OGroup


class QuantizedHeavyHitterPolicy(HeavyHitterPolicy):
    """`h2o` and `sink_h2o`: the rule, and slots stored in `kv_bits` (16, 8, 4) with codes in groups of
    `group` channels (fields each declares after its sizes, so positional sizes stay as they were)."""

    def __post_init__(self):
        super().__post_init__()
        Q.check_code_sizes(self.name, self.kv_bits, {"group": self.group}, {"group": 32})

    @property
    def capacity(self) -> int:
        return self.sinks_kept + self.heavy + self.recent

    @property
    def quantized(self) -> bool:
        return self.kv_bits < 16

    @property
    def label(self) -> str:
        return f"{self.name}-kv{self.kv_bits}" if self.quantized else self.name

    def sizes(self) -> dict[str, int]:
        sizes = super().sizes()
        return sizes if self.quantized else {k: v for k, v in sizes.items() if k not in ("kv_bits", "group")}

    def kv_bytes(self, seq_len: int, head_dim: int, dtype_bytes: int) -> int:
        return Q.token_quantized_bytes(self.tokens_kept(seq_len), head_dim, self.kv_bits, self.group, dtype_bytes)

    def check_head_dim(self, head_dim: int) -> None:
        Q.check_code_head_dim(self.name, self.kv_bits, self.group, head_dim)

    def make_group(self, kv_heads, rep, max_length=None):
        if not self.quantized:
            return super().make_group(kv_heads, rep, max_length)
        return (QuantizedH2OGroup if max_length is None else StaticQuantizedH2OGroup)(self, kv_heads, rep)


@register_policy
@dataclass(frozen=True)
class H2O(QuantizedHeavyHitterPolicy):
    name = "h2o"
    heavy: int = 128
    recent: int = 128
    kv_bits: int = 16
    group: int = Q.GROUP

    @classmethod
    def halves(cls, capacity: int, **sizes) -> H2O:
        """H2O keeping `capacity` tokens per head: half heavy hitters, half recent, as in the H2O paper
        (an odd token goes to the heavy hitters). Every row and measurement "at duo's bytes" uses it."""
        recent = capacity // 2
        return cls(heavy=capacity - recent, recent=recent, **sizes)


class QuantizedH2OGroup(H2OGroup):
    """Slots as rows of codes: `self.k` / `self.v` uint8 [B, G, S, token_code_bytes] (kv_quant.encode_tokens,
    the scale and zero point packed beside each token's codes), so every slot operation above (append,
    gather on eviction, a decode step's scatter, beam reordering, static buffers) moves a row as it is."""

    stores_codes = True

    def _stored_form(self, x: torch.Tensor) -> torch.Tensor:
        return Q.encode_tokens(x, self.policy.kv_bits, self.policy.group)

    def _readable(self, stored: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return Q.decode_tokens(stored, self.policy.kv_bits, self.policy.group, like.shape[-1], like.dtype)

    def _codes(self, stored: torch.Tensor, like: torch.Tensor) -> Q.QuantizedKV:
        return Q.token_rows(stored, self.policy.kv_bits, self.policy.group, like.shape[-1], like.dtype)

    def _stored_scores(self, qg, like):  # a decode step reads the codes as they are (quant/attention.py)
        return QA.token_key_scores(qg, self._codes(self.k, like), self.policy.kv_bits, self.policy.group)

    def _stored_output(self, p, like):
        values = self._codes(self.v, like)
        return QA.weighted_values(p, values, self.policy.kv_bits, self.policy.group).to(like.dtype)


class StaticQuantizedH2OGroup(QuantizedH2OGroup, StaticH2OGroup):
    """`capacity` fixed rows of codes per head (the h2o static group's slots)."""
