"""The distillation loss of a hard plan (some heads full, the rest streaming) on held-out samples.

Used by `ranking` to compare candidate plans. Collective: every rank calls it with the same
plan; each measures its share of the samples (or of the tokens, under sequence parallelism)
and the sum is all-reduced. The teacher pass of every micro-batch is computed once and reused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from duocal.calibrate.batches import StepData, make_generator
from duocal.calibrate.engine import Distributed
from duocal.calibrate.gated_attention import Gating
from duocal.calibrate.objective import distill_sum


class PlanLoss:
    def __init__(self, recipe, objective, tokenizer, pad: int, where: Distributed):
        r, world, split = recipe.ranking, where.world, where.sequence_parallel
        samples = max(r.samples, 1 if split else world)
        samples += (-samples) % (1 if split else world)
        data = StepData(make_generator(recipe.data, tokenizer, seed=r.seed), pad, samples, 1, world, split)
        self.objective = objective
        weight = self.objective.gates.weight
        self.shape = tuple(getattr(weight, "ds_shape", weight.shape))  # ZeRO-3 keeps a [0] placeholder
        self.device = where.device
        self.batches = [m.to(where.device) for m in data.micro_batches(0, where.rank)]
        self.norm = world * data.accumulation
        self.teachers: list[tuple[torch.Tensor, dict]] = []
        g = self.objective.gating
        with torch.no_grad():
            for m in self.batches:
                gating = Gating(g.sink, g.recent, g.block, sequence_parallel=g.sequence_parallel)
                hidden = self.objective.hidden(m.input_ids, m.position_ids, gating)
                self.teachers.append((hidden, gating))

    @torch.no_grad()
    def __call__(self, full_heads: list[int], num_heads: int) -> float:
        gates = torch.zeros(num_heads)
        gates[list(full_heads)] = 1.0
        gates = gates.view(self.shape).to(self.device)
        total = torch.zeros((), dtype=torch.float64)
        for m, (teacher, gating) in zip(self.batches, self.teachers, strict=True):
            student = self.objective.hidden(m.input_ids, m.position_ids, gating.student(gates))
            total += float(distill_sum(teacher, student, m.positions)) * m.scale / self.norm
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return float(total)
