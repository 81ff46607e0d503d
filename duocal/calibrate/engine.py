"""DeepSpeed set-up for calibration: process group, config, engine, teardown.

CPU facts this relies on (shared/platform-facts.md, DeepSpeed 0.19.8): gloo is picked
automatically; a first `init_distributed` JIT-builds a shared-memory op (54 s) unless
`deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"]` is False; a DeepSpeed-config Adam
JIT-builds fused_adam (~80 s), a client `torch.optim.AdamW` does not; one process without a
launcher needs RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; gloo teardown aborts
now and then without `barrier()` + `destroy_process_group()`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ENV_DEFAULTS = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}


@dataclass(frozen=True)
class Distributed:
    """Where this process runs in a calibration: its rank among `world` processes, its device, and
    whether the ranks split each sequence (Ulysses) instead of the batch."""

    rank: int = 0
    world: int = 1
    sequence_parallel: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process_group():
    """Join the launcher's process group, or create a one-process gloo group. Yields (rank, world).

    Without a launcher (no RANK in the environment) the variables DeepSpeed needs are set for the
    duration of the run only (with a fresh port), so a later run or a child launcher starts clean.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
    import deepspeed
    import torch.distributed as dist

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    saved = {k: os.environ.get(k) for k in (*ENV_DEFAULTS, "MASTER_PORT")}
    launched = "RANK" in os.environ
    if not launched:
        os.environ.update(ENV_DEFAULTS)
        os.environ["MASTER_PORT"] = str(free_port())
    try:
        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", verbose=False)
        yield dist.get_rank(), dist.get_world_size()
    finally:
        shutdown()
        if not launched:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def shutdown() -> None:
    """barrier + destroy, through deepspeed.comm so DeepSpeed forgets its cached groups too
    (a second run in the same process would otherwise use the destroyed ones)."""
    import deepspeed.comm as ds_comm
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        ds_comm.destroy_process_group()


def deepspeed_config(
    section, micro_batch: int, accumulation: int, world: int, dtype: str, gates: int
) -> dict[str, Any]:
    """The recipe's DeepSpeed config (file, if any) with batch sizes and ZeRO stage set from the recipe."""
    config: dict[str, Any] = {}
    if section.config:
        path = Path(section.config)
        if not path.is_file():
            raise ValueError(f"deepspeed.config {path} does not exist")
        config = json.loads(path.read_text())
    config["train_micro_batch_size_per_gpu"] = micro_batch
    config["gradient_accumulation_steps"] = accumulation
    config["train_batch_size"] = micro_batch * accumulation * world
    config.pop("optimizer", None)  # the client torch AdamW (no fused_adam build)
    config.pop("scheduler", None)  # run.lr_factor sets the lr every step
    zero = dict(config.get("zero_optimization") or {})
    zero["stage"] = section.zero_stage
    if section.zero_stage == 3:
        # Gates must stay whole on every rank: they are read in every attention call.
        zero["stage3_param_persistence_threshold"] = max(int(zero.get("stage3_param_persistence_threshold", 0)), gates)
    config["zero_optimization"] = zero
    # Gates train in fp32; frozen weights keep the model's dtype (bf16 on GPUs). Mixed-precision
    # engines would cast the gates too, so their precision settings are left off.
    config.pop("fp16", None)
    config.pop("bf16", None)
    config.setdefault("steps_per_print", 10**9)
    config.setdefault("wall_clock_breakdown", False)
    return config


def initialize(objective: torch.nn.Module, config: dict[str, Any], lr: float, betas) -> Any:
    """A DeepSpeed engine over `objective` with a client AdamW (no weight decay, upstream) on the gates."""
    import deepspeed

    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=objective, optimizer=optimizer, model_parameters=params, config=config)
    return engine


def set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def read_gates(engine) -> torch.Tensor:
    """The gate values [layers, KV heads] on every rank (gathered under ZeRO-3)."""
    import deepspeed

    weight = engine.module.gates.weight
    with deepspeed.zero.GatheredParameters([weight], modifier_rank=None, enabled=hasattr(weight, "ds_id")):
        return weight.detach().clone().float().cpu()
