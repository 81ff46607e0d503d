"""KV memory budgets: bytes or (token, KV head) pairs at one context length, and bytes per element."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from ..errors import PlanError
from .sizes import GiB, KiB, MiB, bytes_with_count

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float8": 1, "fp8": 1}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a name ('bfloat16') or a torch.dtype."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    key = str(dtype).removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


_BYTE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": GiB * KiB,
}
_TOKEN_UNITS = {"tok": 1, "tokens": 1, "token": 1, "ktok": 10**3, "k tokens": 10**3}


@dataclass(frozen=True)
class Budget:
    """A KV memory budget at one context length, in bytes or in (token, KV head) pairs."""

    amount: float
    unit: str  # "bytes" or "tokens"

    @classmethod
    def parse(cls, text: str | int | Budget) -> Budget:
        """'12GiB', '500 MB', '3e9B' -> bytes; '2000000 tokens', '2e6tok' or a bare int -> tokens."""
        if isinstance(text, Budget):
            return text
        if isinstance(text, Integral) and not isinstance(text, bool):  # numpy integers too
            return cls(float(text), "tokens")
        m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z ]*)\s*", str(text))
        unit = m.group(2).strip().lower() if m else ""
        try:
            number = float(m.group(1)) if m else float("nan")
        except ValueError:
            number = float("nan")
        if not math.isfinite(number) or number <= 0 or (unit not in _BYTE_UNITS and unit not in _TOKEN_UNITS):
            raise PlanError(f"cannot read budget {text!r}: give bytes ('12GiB', '500MB') or tokens ('2000000 tokens')")
        if unit in _BYTE_UNITS:
            return cls(number * _BYTE_UNITS[unit], "bytes")
        return cls(number * _TOKEN_UNITS[unit], "tokens")

    def describe(self, amount: float | None = None) -> str:
        """`amount` (default: the budget's) in its unit for people: '1.00 GiB (1,073,741,824 bytes)'."""
        n = int(self.amount if amount is None else amount)
        return bytes_with_count(n) if self.unit == "bytes" else f"{n:,} tokens"

    def measure(self, plan, context: int, batch: int, dtype: Any) -> int:
        return plan.kv_bytes(context, batch, dtype) if self.unit == "bytes" else plan.kv_tokens(context, batch)


def max_context(plan, memory: Any, batch: int = 1, dtype: Any = "bfloat16") -> int:
    """The most tokens per sequence whose KV cache (plan.kv_bytes) fits `memory` for `batch` sequences;
    0 when not even one token fits; a plain number is bytes (memory is never tokens). KV bytes never shrink as
    the context grows: a binary search."""
    plain = isinstance(memory, Integral) and not isinstance(memory, bool)
    budget = Budget(float(memory), "bytes") if plain and memory > 0 else Budget.parse(memory)
    if budget.unit != "bytes":
        raise PlanError(f"memory must be bytes ('80GB', '24GiB'), got {memory!r}")
    if plan.kv_bytes(1, batch, dtype) > budget.amount:
        return 0
    lo, hi = 1, 2
    while plan.kv_bytes(hi, batch, dtype) <= budget.amount:
        lo, hi = hi, hi * 2
        if hi > 1 << 50:
            raise PlanError("every context fits this memory: the plan holds a bounded cache on every head")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if plan.kv_bytes(mid, batch, dtype) <= budget.amount else (lo, mid)
    return lo


def budget_dtype_of(budget, dtype) -> str | None:
    """The dtype a budget in bytes was planned in (None for token budgets and no budget)."""
    if budget is None or Budget.parse(budget).unit != "bytes":
        return None
    return str(dtype).removeprefix("torch.")
