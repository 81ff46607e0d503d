"""Calibration batches: which passkey samples each process sees at each step, as tensors.

Step s uses samples s*batch_size ... s*batch_size + batch_size - 1 of one deterministic
`PasskeyGenerator`, so a resumed run, or a run on another number of processes, sees the same
data. Data parallel: process r takes its contiguous share of the step's samples, in
micro-batches. Sequence parallel (Ulysses): every process takes every sample and keeps its
contiguous 1/P of the tokens (positions are the original ones).

The loss of a micro-batch is `sum of squared distances * scale`, scale = P * accumulation /
(answer positions in the whole step), which makes DeepSpeed's mean over processes and
micro-batches the exact global-batch mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from duocal.data import PasskeyGenerator, PasskeySample, SyntheticFiller
from duocal.data.mixed_samples import MixedGenerator, MixedSample
from duocal.data.padding import pad_batch


@dataclass(frozen=True)
class MicroBatch:
    input_ids: torch.Tensor  # [b, t] (t: this process's tokens)
    position_ids: torch.Tensor  # [b, t]
    positions: torch.Tensor  # [b, t] bool: hidden states that predict an answer token
    scale: float
    tokens: int  # real (unpadded) tokens in this micro-batch on this process

    def to(self, device) -> MicroBatch:
        return MicroBatch(
            self.input_ids.to(device), self.position_ids.to(device), self.positions.to(device), self.scale, self.tokens
        )


def make_haystack(spec: Any, text_field: str = "text"):
    """The recipe's `data.haystack`: 'synthetic', a file, or {dataset: ..., ...} for datasets.load_dataset."""
    if isinstance(spec, dict):
        if "filler" in spec:
            return SyntheticFiller(**spec["filler"])
        spec = dict(spec)
        name = spec.pop("dataset", None)
        if name is None:
            raise ValueError(
                "data.haystack as a mapping needs 'dataset' (datasets.load_dataset's first argument) or 'filler'"
            )
        import datasets

        split = spec.pop("split", "train")
        return datasets.load_dataset(name, split=split, **spec)
    return spec


def make_generator(data, tokenizer, seed: int | None = None) -> PasskeyGenerator | MixedGenerator:
    """The recipe's `data` section as a generator (raises ValueError when passkeys do not fit)."""
    pair = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v  # noqa: E731
    if data.format == "mixed":
        if not isinstance(data.haystack, str):
            raise ValueError("data.haystack of mixed samples is repeated, text or both (repeated,text)")
        return MixedGenerator(
            tokenizer,
            context_length=pair(data.context),
            values=tuple(data.values),
            framings=tuple(data.framings),
            haystacks=tuple(h.strip() for h in data.haystack.split(",")),
            depth=tuple(data.depth) if isinstance(data.depth, (list, tuple)) else (data.depth, data.depth),
            seed=data.seed if seed is None else seed,
        )
    return PasskeyGenerator(
        tokenizer,
        context_length=pair(data.context),
        num_passkeys=pair(data.num_passkeys),
        depth=tuple(data.depth) if isinstance(data.depth, (list, tuple)) else (data.depth, data.depth),
        questions=data.questions,
        haystack=make_haystack(data.haystack, data.text_field),
        format=data.format,
        seed=data.seed if seed is None else seed,
        text_field=data.text_field,
    )


def answer_positions(sample: PasskeySample | MixedSample) -> list[int]:
    return list(sample.predict_positions)


def tensors(samples: list[PasskeySample], pad_id: int, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input_ids [b, T] (T a multiple of `multiple`) and the answer-position mask [b, T]."""
    ids, _ = pad_batch([s.input_ids for s in samples], pad_id, multiple=multiple)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, s in enumerate(samples):
        mask[row, answer_positions(s)] = True
    return ids, mask


@dataclass
class StepData:
    """Builds every process's micro-batches of a step."""

    generator: PasskeyGenerator | MixedGenerator
    pad_id: int
    batch_size: int
    micro_batch_size: int
    world_size: int = 1
    sequence_parallel: bool = False

    def __post_init__(self):
        per_process = self.batch_size if self.sequence_parallel else self.batch_size // self.world_size
        if per_process * (1 if self.sequence_parallel else self.world_size) != self.batch_size or per_process < 1:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be a multiple of the number of processes "
                f"({self.world_size})"
            )
        if per_process % self.micro_batch_size:
            raise ValueError(
                f"each process gets {per_process} samples per step, not a multiple of train.micro_batch_size "
                f"({self.micro_batch_size})"
            )
        self.per_process = per_process

    @property
    def accumulation(self) -> int:
        """Micro-batches per process per step (DeepSpeed's gradient_accumulation_steps)."""
        return self.per_process // self.micro_batch_size

    def samples(self, step: int) -> list[PasskeySample]:
        return list(self.generator.samples(self.batch_size, start=step * self.batch_size))

    def micro_batches(self, step: int, rank: int) -> list[MicroBatch]:
        samples = self.samples(step)
        total = sum(len(answer_positions(s)) for s in samples)
        scale = self.world_size * self.accumulation / max(1, total)
        mine = samples if self.sequence_parallel else samples[rank * self.per_process : (rank + 1) * self.per_process]
        out = []
        for i in range(0, len(mine), self.micro_batch_size):
            chunk = mine[i : i + self.micro_batch_size]
            multiple = self.world_size if self.sequence_parallel else 1
            ids, mask = tensors(chunk, self.pad_id, multiple)
            pos = torch.arange(ids.shape[1]).expand_as(ids)
            real = torch.zeros_like(mask)
            for row, s in enumerate(chunk):
                real[row, : len(s)] = True
            if self.sequence_parallel:
                part = ids.shape[1] // self.world_size
                cut = slice(rank * part, (rank + 1) * part)
                ids, mask, pos, real = ids[:, cut], mask[:, cut], pos[:, cut], real[:, cut]
            out.append(MicroBatch(ids, pos.contiguous(), mask, scale, int(real.sum())))
        return out
