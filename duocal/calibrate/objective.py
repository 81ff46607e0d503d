"""The module DeepSpeed wraps: frozen model + gates, forward = teacher pass, student pass, loss.

Losses (DuoAttention, arXiv 2410.10819 §3.2, eq. 2-3): distill is the squared distance between
the teacher's and the student's final hidden states, averaged over the hidden dimension, summed
over the positions that predict answer tokens and divided by their number in the whole global
batch (upstream divides by the global label count the same way, so data-parallel,
gradient-accumulated and sequence-parallel runs give the same gradient); reg is mean |gate|
(upstream `l1_loss`), weighted by `reg` in the total.

Everything that touches the gates happens inside `forward` (reading them, the L1 term): under
ZeRO-3 a gate-dependent term computed outside the engine's forward fails in backward
("AbsBackward0 returned an invalid gradient"), see shared/platform-facts.md.
"""

from __future__ import annotations

import torch
from torch import nn

from duocal.calibrate.gated_attention import GATING_KWARG, Gating
from duocal.calibrate.gates import Gates


def distill_sum(teacher: torch.Tensor, student: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """teacher/student [B, T, E], positions [B, T] bool -> sum over positions of mean_E (t - s)^2 (fp32)."""
    diff = teacher[positions].float() - student[positions].float()  # [N, E]
    return diff.pow(2).mean(-1).sum()


def l1_mean(gates: torch.Tensor) -> torch.Tensor:
    return gates.float().abs().mean()


class GateObjective(nn.Module):
    """forward(input_ids [B,T], position_ids [B,T], positions [B,T] bool, scale) -> (loss, distill, reg).

    `scale` turns the summed squared distance into this micro-batch's share of the global-batch
    mean (see `duocal.calibrate.batches`). `decoder` is the model without its LM head
    (`model.model`): the loss is on final hidden states, logits are never computed.
    """

    def __init__(self, decoder: nn.Module, gates: Gates, gating: Gating, reg: float, checkpointing: bool = False):
        super().__init__()
        self.decoder, self.gates, self.gating, self.reg = decoder, gates, gating, reg
        self.checkpointing = checkpointing
        for p in self.decoder.parameters():
            p.requires_grad_(False)
        if checkpointing:
            # transformers recomputes a layer only in training mode; the supported families have
            # no dropout outside attention, and the calibration attention applies none.
            decoder.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})

    def train(self, mode: bool = True):
        super().train(mode)
        self.decoder.train(mode and self.checkpointing)  # frozen: eval (no dropout) unless recomputing layers
        return self

    def hidden(self, input_ids, position_ids, gating: Gating) -> torch.Tensor:
        return self.decoder(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **{GATING_KWARG: gating}
        ).last_hidden_state

    def forward(self, input_ids, position_ids, positions, scale, gates_override: torch.Tensor | None = None):
        teacher_gating = Gating(
            self.gating.sink, self.gating.recent, self.gating.block, sequence_parallel=self.gating.sequence_parallel
        )
        with torch.no_grad():
            teacher = self.hidden(input_ids, position_ids, teacher_gating)
        gates = self.gates() if gates_override is None else gates_override
        student = self.hidden(input_ids, position_ids, teacher_gating.student(gates))
        distill = distill_sum(teacher, student, positions) * scale
        reg = l1_mean(self.gates())
        return distill + self.reg * reg, distill.detach(), reg.detach()
