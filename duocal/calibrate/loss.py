"""Calibration losses (DuoAttention, arXiv 2410.10819 §3.2, eq. 2-3).

distill: squared distance between the teacher's and the student's final hidden states, averaged
over the hidden dimension, summed over the positions that predict answer tokens and divided by
their number in the whole global batch (upstream divides by the global label count the same way,
so data-parallel, gradient-accumulated and sequence-parallel runs give the same gradient).
reg: mean |gate| (upstream `l1_loss`), weighted by `reg` in the total.
"""

from __future__ import annotations

import torch


def distill_sum(teacher: torch.Tensor, student: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """teacher/student [B, T, E], positions [B, T] bool -> sum over positions of mean_E (t - s)^2 (fp32)."""
    diff = teacher[positions].float() - student[positions].float()  # [N, E]
    return diff.pow(2).mean(-1).sum()


def l1_mean(gates: torch.Tensor) -> torch.Tensor:
    return gates.float().abs().mean()
