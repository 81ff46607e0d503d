"""Learning-rate schedule of DuoAttention calibration (upstream `duo_attn/train.py`).

Upstream: `LambdaLR(lambda step: min(1, max((step+1)/(n//5), 0.1), max((n-step)/(n//5), 0.1)))`:
linear warm-up over the first 20% of the n steps, flat, linear decay over the last 20%, never
below 0.1x. Stateless here (a function of the step), so a resumed run gets the same rates.
"""

from __future__ import annotations


def lr_factor(step: int, total: int, warmup: float = 0.2, decay: float = 0.2, floor: float = 0.1) -> float:
    """Multiplier of the base lr at 0-based `step` of `total`."""
    up = max(1, int(total * warmup)) if warmup > 0 else None
    down = max(1, int(total * decay)) if decay > 0 else None
    rise = max((step + 1) / up, floor) if up else 1.0
    fall = max((total - step) / down, floor) if down else 1.0
    return min(1.0, rise, fall)
