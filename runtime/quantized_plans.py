"""Plans whose full heads store KIVI codes (kv_quant.py) instead of the cache's dtype."""

from __future__ import annotations

import math
from dataclasses import replace

from .planning import Plan
from .policies import Full


def with_kv_bits(plan: Plan, kv_bits: int, group: int | None = None) -> Plan:
    """`plan` with its 16-bit full heads storing `kv_bits` (16, 8, 4), in groups of `group` tokens
    (keys) and channels (values); default gcd(32, head_dim). Bounded heads are unchanged."""
    full = Full.storing(kv_bits, group or math.gcd(32, plan.shape.head_dim))
    return replace(plan, policies=[[full if p == Full() else p for p in row] for row in plan.policies])
