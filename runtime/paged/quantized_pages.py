"""Where quantized full heads (`full(kv_bits=8|4)`) live in a full-head page, and how their codes are read and written.

A page holds `page_size` tokens of every layer (pages.py). For each quantized group of a layer it also
holds, row for row with the page's tokens, the key and value codes and the values' scales and zero
points (one per token and group of channels), and the keys' scales and zero points once per group
of `group` tokens (so a page size must be a multiple of the group). Tokens still in the
full-precision residual have their rows allocated but quantized only when their group is due; the
residual itself is a ring of `residual + group` slots among the request's bounded slots, as the
static quantized group keeps it (`ring_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

import torch

from ..errors import PlanError
from ..quant import codes as Q

# byte alignment of the pool's blocks and of the fields inside them
ALIGN = 128  # bytes: every block and field starts on it


def aligned(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def page_size_for(plan, least: int = 16) -> int:
    """The smallest multiple of `least` tokens that holds whole groups of the plan's quantized full heads."""
    return lcm(least, *(p.group for p in quantized_policies(plan)))


def check_page_holds_groups(policy, page: int) -> None:
    if page % policy.group:
        raise PlanError(
            f"a page of {page} tokens does not hold whole groups of {policy.group} tokens of the quantized full heads "
            f"({policy.label}); set the page size (page_size / --page-size) to a multiple of {policy.group}"
        )


def quantized_policies(plan) -> list:
    return [p for row in plan.policies for p in row if not p.bounded and p.quantized]


def ring_key(group: int) -> str:
    """The bounded-slot key (beside the layer) of a quantized group's residual ring."""
    return f"ring{group}"


def ring_state(policy, heads: int, head_dim: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One request's residual ring of a quantized group: keys and values of `residual + group` slots."""
    ring = torch.zeros(1, heads, policy.residual + policy.group, head_dim, dtype=dtype)
    return {"k": ring, "v": ring.clone()}


@dataclass(frozen=True)
class PageField:
    """One part of one quantized group inside every page: `rows` rows of [heads, width] at `offset` bytes."""

    layer: int
    group: int
    name: str  # k_codes, k_scale, k_zero, v_codes, v_scale, v_zero
    rows: int  # per page: its tokens, or its groups of tokens (key scales)
    heads: int
    width: int
    dtype: torch.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return aligned(self.rows * self.heads * self.width * self.dtype.itemsize)


def quantized_page_fields(quantized: list[list[tuple]], head_dim: int, dtype: torch.dtype, page: int, start: int):
    """Fields of every layer's quantized groups (`quantized[l]` = [(policy, KV heads)]) from byte `start` of a
    page: (fields, the byte where they end)."""
    fields, offset = [], start
    for layer, groups in enumerate(quantized):
        for g, (policy, heads) in enumerate(groups):
            check_page_holds_groups(policy, page)
            packed = head_dim * policy.kv_bits // 8
            for name, rows, width, part_dtype in (
                ("k_codes", page, packed, torch.uint8),
                ("k_scale", page // policy.group, head_dim, dtype),
                ("k_zero", page // policy.group, head_dim, dtype),
                ("v_codes", page, packed, torch.uint8),
                ("v_scale", page, head_dim // policy.group, dtype),
                ("v_zero", page, head_dim // policy.group, dtype),
            ):
                field = PageField(layer, g, name, rows, len(heads), width, part_dtype, offset)
                fields.append(field)
                offset += field.nbytes
    return fields, offset


def page_views(fields: list[PageField], cache_tensor: torch.Tensor, block_bytes: int) -> dict:
    """(layer, group) -> {name: view [blocks, rows, heads, width]} over the pool's bytes."""
    blocks, views = cache_tensor.numel() // block_bytes, {}
    for f in fields:
        size = f.dtype.itemsize
        view = cache_tensor.view(f.dtype).as_strided(
            (blocks, f.rows, f.heads, f.width), (block_bytes // size, f.heads * f.width, f.width, 1), f.offset // size
        )
        views.setdefault((f.layer, f.group), {})[f.name] = view
    return views


class PagedCodes:
    """A quantized group's codes in the pool: read and written by the rows of their tokens."""

    def __init__(self, views: dict[str, torch.Tensor], page: int, group: int):
        self.views, self.page, self.group = views, page, group

    def _places(self, rows: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """name -> (block, row in its field) of tokens at pool rows [B, N] (whole groups: key scales
        take one row per group, from its first token)."""
        per_token = (rows // self.page, rows % self.page)
        firsts = rows[:, :: self.group]
        per_group = (firsts // self.page, (firsts % self.page) // self.group)
        return {name: per_group if name in ("k_scale", "k_zero") else per_token for name in self.views}

    def read(self, rows: torch.Tensor) -> tuple[Q.QuantizedKV, Q.QuantizedKV]:
        """rows [B, N] (N whole groups of tokens, from the first of a group) -> (keys, values) [B, heads, N, ...]."""
        parts = {
            name: self.views[name][block, row].transpose(1, 2) for name, (block, row) in self._places(rows).items()
        }
        keys = Q.QuantizedKV(parts["k_codes"], parts["k_scale"], parts["k_zero"])
        return keys, Q.QuantizedKV(parts["v_codes"], parts["v_scale"], parts["v_zero"])

    def write(self, rows: torch.Tensor, keys: Q.QuantizedKV, values: Q.QuantizedKV) -> None:
        """Codes of the tokens at rows [B, N] (whole groups) from (keys, values) [B, heads, N, ...]."""
        parts = {"k_codes": keys.codes, "k_scale": keys.scale, "k_zero": keys.zero}
        parts |= {"v_codes": values.codes, "v_scale": values.scale, "v_zero": values.zero}
        for name, (block, row) in self._places(rows).items():
            self.views[name][block.flatten(), row.flatten()] = parts[name].transpose(1, 2).flatten(0, 1)
