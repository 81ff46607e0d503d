"""How dynamic full-head buffers grow: exact on the first pass, then by ~1.6% at a time."""

from __future__ import annotations

import math

FULL_SLACK = 1 / 64
FULL_ALIGN = 8


def full_capacity(needed: int, first: bool) -> int:
    """Slots a dynamic full group allocates to hold `needed` tokens (exact on the first pass)."""
    return needed if first else needed + max(FULL_ALIGN, math.ceil(needed * FULL_SLACK))
