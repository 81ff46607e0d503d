"""KIVI's KV quantization (Liu et al. 2024, arXiv 2402.02750): the codes, their scales, their bytes.

Keys are quantized per channel over groups of `group` tokens (keys have outlier channels: a scale
per channel keeps them apart); values per token over groups of `group` channels. Both are
asymmetric: x ≈ code × scale + zero, with `scale = (max − min) / (2^bits − 1)` and `zero = min` over
the group, so a value is off by at most scale / 2. 4-bit codes are packed two per byte; scales and
zero points are kept in the cache's dtype. The newest tokens stay in full precision (the residual)
until a whole group of tokens can be quantized: a head holding n tokens keeps
`quantized_tokens(n)` of them as codes and the rest in full precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import PlanError

BITS = (16, 8, 4)  # 16: the cache's own dtype (not quantized)
GROUP = 32  # tokens (keys) or channels (values) per scale and zero point: KIVI's default
RESIDUAL = 128  # the newest tokens kept in full precision: KIVI's default


def default_group(head_dim: int) -> int:
    """The group a plan takes when it names none: GROUP, or the largest divisor of `head_dim` below it."""
    return math.gcd(GROUP, head_dim)


@dataclass(frozen=True)
class QuantizedKV:
    """Keys or values of G heads, N tokens (N a multiple of the key group), D channels, as codes."""

    codes: torch.Tensor  # uint8 [B, G, N, D * bits / 8]
    scale: torch.Tensor  # keys [B, G, N / group, D]; values [B, G, N, D / group] (cache dtype)
    zero: torch.Tensor  # as scale

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.zero.nbytes


def quantized_tokens(n: int, group: int, residual: int) -> int:
    """Tokens of n held as codes: whole groups, leaving at least `residual` (and fewer than
    residual + group) of the newest tokens in full precision."""
    return max(0, n - residual) // group * group


def plain_bytes(n: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one KV head holds for n tokens in the cache's own dtype (keys and values): every storage
    kind's full-precision part, and a plain model's whole cache."""
    return 2 * n * head_dim * dtype_bytes


def quantized_bytes(n: int, head_dim: int, bits: int, group: int, residual: int, dtype_bytes: int) -> int:
    """Bytes one KV head holds for n tokens: codes, scales and zero points of the quantized part,
    plus the full-precision residual (keys and values)."""
    if bits == 16:
        return plain_bytes(n, head_dim, dtype_bytes)
    q = quantized_tokens(n, group, residual)
    codes = 2 * q * head_dim * bits // 8
    key_params = 2 * (q // group) * head_dim * dtype_bytes
    value_params = 2 * q * (head_dim // group) * dtype_bytes
    return codes + key_params + value_params + plain_bytes(n - q, head_dim, dtype_bytes)


def _codes(x: torch.Tensor, low: torch.Tensor, high: torch.Tensor, bits: int):
    levels = (1 << bits) - 1
    scale = (high - low).clamp_min(torch.finfo(torch.float32).tiny) / levels
    codes = torch.round((x - low) / scale).clamp_(0, levels).to(torch.uint8)
    return codes, scale, low


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [..., D] -> [..., D * bits / 8]. 4 bits: two per byte, channel i in the low
    nibble and channel i + D/2 in the high one, so each nibble is a run of channels (code_runs)."""
    if bits == 8:
        return codes
    half = codes.shape[-1] // 2
    return codes[..., :half] | (codes[..., half:] << 4)


def code_runs(packed: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """The codes as fp32 runs of consecutive channels (8 bits: one run; 4 bits: the two halves),
    unpacked without interleaving."""
    if bits == 8:
        return [packed.float()]
    return [(packed & 0x0F).float(), (packed >> 4).float()]


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return packed
    return torch.cat((packed & 0x0F, packed >> 4), dim=-1)


def quantize_keys(k: torch.Tensor, bits: int, group: int, valid: torch.Tensor | None = None) -> QuantizedKV:
    """k [B, G, N, D] (N a multiple of group): one scale and zero per channel and group of tokens.
    `valid` [B, N] (False: padding) keeps padded slots out of the scales (they are quantized, clamped)."""
    b, g, n, d = k.shape
    x = k.float().reshape(b, g, n // group, group, d)
    if valid is None:
        low, high = x.amin(3, keepdim=True), x.amax(3, keepdim=True)
    else:
        real = valid.reshape(b, 1, n // group, group, 1)
        low = x.masked_fill(~real, float("inf")).amin(3, keepdim=True)
        high = x.masked_fill(~real, float("-inf")).amax(3, keepdim=True)
        empty = ~real.any(3, keepdim=True)  # a group of padding only
        low, high = low.masked_fill(empty, 0.0), high.masked_fill(empty, 0.0)
    codes, scale, zero = _codes(x, low, high, bits)
    return QuantizedKV(
        pack_codes(codes.reshape(b, g, n, d), bits), scale.squeeze(3).to(k.dtype), zero.squeeze(3).to(k.dtype)
    )


def quantize_values(v: torch.Tensor, bits: int, group: int) -> QuantizedKV:
    """v [B, G, N, D] (D a multiple of group): one scale and zero per token and group of channels."""
    b, g, n, d = v.shape
    x = v.float().reshape(b, g, n, d // group, group)
    codes, scale, zero = _codes(x, x.amin(4, keepdim=True), x.amax(4, keepdim=True), bits)
    return QuantizedKV(
        pack_codes(codes.reshape(b, g, n, d), bits), scale.squeeze(4).to(v.dtype), zero.squeeze(4).to(v.dtype)
    )


def dequantize_keys(q: QuantizedKV, bits: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    codes = unpack_codes(q.codes, bits).float()
    b, g, n, d = codes.shape
    grouped = codes.reshape(b, g, n // group, group, d)
    x = torch.addcmul(q.zero.float()[:, :, :, None], grouped, q.scale.float()[:, :, :, None])  # code × scale + zero
    return x.reshape(b, g, n, d).to(dtype)


def dequantize_values(q: QuantizedKV, bits: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    codes = unpack_codes(q.codes, bits).float()
    b, g, n, d = codes.shape
    grouped = codes.reshape(b, g, n, d // group, group)
    x = torch.addcmul(q.zero.float()[..., None], grouped, q.scale.float()[..., None])
    return x.reshape(b, g, n, d).to(dtype)


def token_slice(q: QuantizedKV, start: int, stop: int, group: int, keys: bool) -> QuantizedKV:
    """Tokens [start, stop) (multiples of `group` for keys) of quantized keys or values."""
    if keys:
        return QuantizedKV(
            q.codes[:, :, start:stop],
            q.scale[:, :, start // group : stop // group],
            q.zero[:, :, start // group : stop // group],
        )
    return QuantizedKV(q.codes[:, :, start:stop], q.scale[:, :, start:stop], q.zero[:, :, start:stop])


def concat(a: QuantizedKV | None, b: QuantizedKV) -> QuantizedKV:
    if a is None:
        return b
    return QuantizedKV(
        *(torch.cat((x, y), dim=2) for x, y in ((a.codes, b.codes), (a.scale, b.scale), (a.zero, b.zero)))
    )


def check_code_sizes(policy: str, kv_bits: int, sizes: dict[str, int], defaults: dict[str, int]) -> None:
    """`PlanError` unless kv_bits is a known width; a 16-bit head takes no code sizes (`sizes` vs `defaults`)."""
    if kv_bits not in BITS:
        raise PlanError(f"{policy}: kv_bits must be one of {', '.join(map(str, BITS))}, got {kv_bits}")
    if kv_bits == 16 and sizes != defaults:
        names = " and ".join(defaults)
        raise PlanError(f"{policy}: {names} size the codes of kv_bits 8 or 4; a 16-bit head has none")


def check_code_head_dim(policy: str, kv_bits: int, group: int, head_dim: int) -> None:
    """`PlanError` unless codes of `kv_bits` in groups of `group` channels fit heads of `head_dim`."""
    if kv_bits == 4 and head_dim % 2:
        raise PlanError(f"{policy}: 4-bit codes pack two channels per byte; head_dim {head_dim} is odd: use kv_bits=8")
    if kv_bits < 16 and head_dim % group:
        divisor = next(g for g in (128, 64, 32, 16, 8, 4, 2, 1) if head_dim % g == 0)
        raise PlanError(
            f"{policy}: group {group} does not divide head_dim {head_dim} (values are quantized over groups "
            f"of channels); use a divisor such as {divisor}"
        )


def token_code_bytes(head_dim: int, bits: int, group: int, dtype_bytes: int) -> int:
    """Bytes of one token's keys or values quantized on their own (codes, a scale and zero per group of channels)."""
    return head_dim * bits // 8 + 2 * (head_dim // group) * dtype_bytes


def token_quantized_bytes(n: int, head_dim: int, bits: int, group: int, dtype_bytes: int) -> int:
    """Bytes one KV head holds for n tokens each quantized on its own (keys and values; 16 bits: plain)."""
    if bits == 16:
        return plain_bytes(n, head_dim, dtype_bytes)
    return 2 * n * token_code_bytes(head_dim, bits, group, dtype_bytes)


def encode_tokens(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """x [B, G, N, D] -> uint8 [B, G, N, token_code_bytes]: each token's codes, scales and zero points
    (per token over groups of `group` channels, as values are) packed in one byte row, so a slot
    moves, gathers and scatters as one row (what policies that evict single tokens need)."""
    q = quantize_values(x, bits, group)
    return torch.cat((q.codes, q.scale.contiguous().view(torch.uint8), q.zero.contiguous().view(torch.uint8)), dim=-1)


def token_rows(rows: torch.Tensor, bits: int, group: int, head_dim: int, dtype: torch.dtype) -> QuantizedKV:
    """`encode_tokens`' byte rows [B, G, N, W] as codes, scales and zero points (per token, as values)."""
    width, params = head_dim * bits // 8, (head_dim // group) * torch.empty((), dtype=dtype).element_size()
    scale = rows[..., width : width + params].contiguous().view(dtype)
    zero = rows[..., width + params :].contiguous().view(dtype)
    return QuantizedKV(rows[..., :width], scale, zero)


def decode_tokens(rows: torch.Tensor, bits: int, group: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of `encode_tokens`: uint8 [B, G, N, W] -> [B, G, N, head_dim] in `dtype`."""
    return dequantize_values(token_rows(rows, bits, group, head_dim, dtype), bits, group, dtype)
