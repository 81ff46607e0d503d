"""Timing and memory of one benchmark row: a real prefill, then decode steps on a filled cache."""

from __future__ import annotations

import resource
import time

import torch

from . import rows as R


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float:
    """Peak GPU memory allocated since `reset_peak` (weights included), or this process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_prefill(model, cache, context: int) -> float:
    device = model.device
    ids = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    with torch.inference_mode():
        synchronize(device)
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, logits_to_keep=1)
        synchronize(device)
    return time.perf_counter() - start


def decode_step(model, compiled: bool):
    """The forward a decode step runs: compiled like transformers' generate() does for static
    caches (CUDA graphs on CUDA), or eager."""
    if not compiled:
        return model.forward
    mode = "reduce-overhead" if model.device.type == "cuda" else "default"
    return torch.compile(model.forward, mode=mode, fullgraph=False, dynamic=False)  # as generate() compiles


def time_decode(model, cache, context: int, steps: int, compiled: bool, warmup: int) -> tuple[float, float]:
    """(tokens per second, seconds spent before timing: warm-up and compilation)."""
    device, forward = model.device, decode_step(model, compiled)
    token = torch.ones(1, 1, dtype=torch.long, device=device)
    position = torch.full((1, 1), context, dtype=torch.long, device=device)
    with torch.inference_mode():
        start = time.perf_counter()
        for _ in range(warmup):
            forward(input_ids=token, position_ids=position, cache=cache, logits_to_keep=1)
            position += 1
        synchronize(device)
        timed = time.perf_counter()
        for _ in range(steps):
            forward(input_ids=token, position_ids=position, cache=cache, logits_to_keep=1)
            position += 1
        synchronize(device)
    return steps / (time.perf_counter() - timed), timed - start


def max_length_for(context: int, steps: int, warmup: int) -> int:
    return context + steps + warmup


def fresh_cache(row, model, runtime, context, steps, warmup):
    return R.new_cache(row, model, runtime, max_length_for(context, steps, warmup))
