"""The trainable part of DuoAttention calibration: one gate per (layer, KV head).

A gate alpha in [0, 1] mixes a head's outputs: alpha * full attention + (1 - alpha) * streaming
attention (arXiv 2410.10819 §3.2). Gates start at `init` (upstream: 1.0) and are projected back
onto [0, 1] before every optimisation step (upstream `train.py`: `clamp_(0, 1)` on the
parameters at the top of each iteration); the forward pass clamps too, so gradients stop at the
bounds only once a gate has crossed them.
"""

from __future__ import annotations

import torch
from torch import nn


class Gates(nn.Module):
    """`weight` [num_layers, num_kv_heads]; `forward()` returns the clamped gates."""

    def __init__(self, num_layers: int, num_kv_heads: int, init: float = 1.0):
        super().__init__()
        if not 0.0 <= init <= 1.0:
            raise ValueError(f"gates.init must be in [0, 1], got {init}")
        self.weight = nn.Parameter(torch.full((num_layers, num_kv_heads), float(init)))

    def forward(self) -> torch.Tensor:
        return self.weight.clamp(0.0, 1.0)


@torch.no_grad()
def clamp_trainable_(engine_or_module, optimizer=None) -> None:
    """Project every trainable tensor onto [0, 1]: the module's gates and the optimiser's copies.

    ZeRO stages 1-3 keep fp32 master partitions that the optimiser updates and copies back into
    the module; clamping only the module's parameter would be undone at the next step. The only
    trainable tensors are gates, so clamping each whole flat master buffer is exact (its
    alignment padding is 0 and stays 0).
    """
    module = getattr(engine_or_module, "module", engine_or_module)
    for p in module.parameters():
        if p.requires_grad and p.numel():
            p.data.clamp_(0.0, 1.0)
    base = _base_optimizer(optimizer if optimizer is not None else getattr(engine_or_module, "optimizer", None))
    if base is None:
        return
    for group in base.param_groups:
        for p in group["params"]:
            if p.numel():
                p.data.clamp_(0.0, 1.0)


def _base_optimizer(optimizer):
    """The torch optimiser at the bottom of DeepSpeed's wrappers (ZeRO keeps it in `.optimizer`)."""
    while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = getattr(optimizer, "optimizer", None)
    return optimizer
