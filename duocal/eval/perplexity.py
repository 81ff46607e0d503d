"""Perplexity of a long natural text under each plan, through the per-head KV cache.

Each text window of `context` tokens runs the way a policy really runs: the first `context -
scored` tokens are one prefill, then the scored tokens go through the cache in chunks of
`chunk` tokens, each attending only to what the cache still holds (H2O evicts after every
chunk; `chunk=1` is token-by-token decoding). The loss of every scored token (predicted from the
tokens before it) is averaged over text windows; ppl = exp(mean loss). Rows are the evaluation rows of
row_kinds.py (full, duo, streaming, h2o, random, mix), on the same text windows, and `baselines`:
transformers' `QuantizedCache` (duocal_runtime.quant.hf_baselines: quanto4, hqq8, hqq4) on the model
without duocal, its KV bytes measured from the cache after the last text window.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

import duocal_runtime as dr
from duocal.eval.row_kinds import (
    RowInputs,
    RowPlans,
    build_rows,
    check_kv_bits,
    check_rows,
    default_rows,
    refuse_rows_beyond_positions,
    require_profile,
    row_sink_window,
)
from duocal.measure.limits import Progress, model_positions
from duocal.measure.text_windows import TEXT_CHUNK, plan_ppl, text_window_losses, text_windows
from duocal_runtime.quant import hf_baselines as H


@dataclass(frozen=True)
class PerplexityConfig:
    """What to evaluate. Sizes are tokens; `scored` defaults to half of each text window."""

    rows: tuple[str, ...] = default_rows(has_profile=True)
    sparsities: tuple[float, ...] = (0.5,)
    context: int = 2048
    scored: int | None = None
    chunk: int = TEXT_CHUNK
    text_windows: int = 4
    sink: int | None = None
    recent: int | None = None
    positions: str | None = None  # what sink windows of duo and random see (None: the profile's, else original)
    random_seeds: int = 3
    kv_bits: tuple[int, ...] = (16,)  # widths of full heads' keys and values, one row each (16, 8, 4)
    baselines: tuple[str, ...] = ()  # transformers' QuantizedCache rows (hf_quantized.HF_QUANTIZED)

    def __post_init__(self):
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "baselines", tuple(self.baselines))
        H.check_rows(self.baselines)
        object.__setattr__(self, "sparsities", tuple(float(s) for s in self.sparsities))
        object.__setattr__(self, "kv_bits", tuple(self.kv_bits))
        check_rows(self.rows, self.sparsities)
        check_kv_bits(self.kv_bits)
        for name in ("context", "chunk", "text_windows", "random_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 1 <= self.scored_tokens < self.context:
            raise ValueError(f"scored must be between 1 and context - 1 ({self.context - 1}), got {self.scored}")

    @property
    def scored_tokens(self) -> int:
        return self.context // 2 if self.scored is None else self.scored

    def sink_window(self, profile: dr.Profile | None) -> dr.SinkWindow:
        return row_sink_window(profile, self.sink, self.recent, self.positions)


@dataclass
class PerplexityRow:
    row: str
    sparsity: float
    context: int
    tokens_scored: int  # per plan: text windows x scored tokens
    ppl: float  # mean over seeds for random
    kv_bytes: int  # analytic at `context`, batch 1, model dtype
    fraction_of_full: float
    seconds: float
    per_seed: list[float] | None = None
    kv_bits: int = 16
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        return {**data, **self.extra}


def check_text_window_fits(config: PerplexityConfig, model_config, profile: dr.Profile | None = None) -> None:
    """What the model's config alone can refuse, before the weights load: a text window beyond its
    positions, a row that needs a profile without one, a profile of another model."""
    limit = model_positions(model_config)
    rows = (*config.rows, *config.baselines)
    refuse_rows_beyond_positions([config.context], model_config, f"use --context {limit} or less", rows=rows)
    require_profile(config.rows, profile, model_config)


def plain_bytes(shape: dr.ModelShape, context: int, dtype) -> int:
    """KV bytes of one sequence of `context` tokens with every head full, in the model's dtype."""
    return dr.uniform_plan(shape, dr.Full()).kv_bytes(context, 1, dtype)


def baseline_row(
    model, name: str, text_windows: Sequence[torch.Tensor], config: PerplexityConfig, tick
) -> PerplexityRow:
    """A `QuantizedCache` row on the model as it is; KV bytes as its cache holds them after a text window."""
    started, losses, held = time.perf_counter(), [], 0
    for text_window in text_windows:
        cache = H.quantized_cache(name, model.config)
        losses.append(text_window_losses(model, cache, text_window, config.scored_tokens, config.chunk))
        held = max(held, H.cache_bytes(cache))
        tick()
    full_bytes = plain_bytes(dr.shape_of_config(model.config), config.context, next(model.parameters()).dtype)
    return PerplexityRow(
        row=name,
        sparsity=0.0,
        context=config.context,
        tokens_scored=len(text_windows) * config.scored_tokens,
        ppl=math.exp(float(torch.cat(losses).mean())),
        kv_bytes=held,
        fraction_of_full=held / full_bytes,
        seconds=round(time.perf_counter() - started, 2),
        kv_bits=H.bits_of(name),
    )


def planned_row(
    model, row: RowPlans, text_windows: Sequence[torch.Tensor], config: PerplexityConfig, tick
) -> PerplexityRow:
    started = time.perf_counter()
    ppls = [plan_ppl(model, plan, text_windows, config.scored_tokens, config.chunk, tick) for plan in row.plans]
    dtype = next(model.parameters()).dtype
    return perplexity_row(row, config, ppls, len(text_windows), dtype, time.perf_counter() - started)


def perplexity_row(
    row: RowPlans, config: PerplexityConfig, ppls: list[float], text_window_count: int, dtype, seconds: float
) -> PerplexityRow:
    plans = row.plans
    full_bytes = plain_bytes(plans[0].shape, config.context, dtype)
    kv_bytes = round(sum(p.kv_bytes(config.context, 1, dtype) for p in plans) / len(plans))
    return PerplexityRow(
        row=row.row,
        sparsity=row.sparsity,
        context=config.context,
        tokens_scored=text_window_count * config.scored_tokens,
        ppl=sum(ppls) / len(ppls),
        kv_bytes=kv_bytes,
        fraction_of_full=kv_bytes / full_bytes,
        seconds=round(seconds, 2),
        per_seed=ppls if row.seeds is not None else None,
        kv_bits=row.kv_bits,
    )


def evaluate_perplexity(
    model,
    tokenizer,
    text: str,
    config: PerplexityConfig = PerplexityConfig(),
    *,
    profile: dr.Profile | None = None,
    progress: Progress | None = None,
) -> list[PerplexityRow]:
    """Perplexity of `text` for each row kind x sparsity, every plan on the same text windows."""
    require_profile(config.rows, profile, model.config)
    model.eval()
    shape = dr.shape_of_config(model.config)
    text_window_ids = text_windows(tokenizer, text, config.context, config.text_windows)
    inputs = RowInputs(shape, config.context, config.sink_window(profile), profile, config.random_seeds)
    planned = build_rows(config.rows, config.sparsities, inputs, kv_bits=config.kv_bits)
    jobs = [(row.label, functools.partial(planned_row, model, row, text_window_ids, config)) for row in planned]
    jobs += [
        (f"{name} (transformers QuantizedCache)", functools.partial(baseline_row, model, name, text_window_ids, config))
        for name in config.baselines
    ]
    total, done = (sum(len(r.plans) for r in planned) + len(config.baselines)) * len(text_window_ids), 0
    rows = []

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    for label, run in jobs:
        rows.append(run(functools.partial(tick, label)))
        if hasattr(progress, "row"):  # the CLI's progress prints each row as it finishes
            r = rows[-1]
            progress.row(f"{label}: ppl {r.ppl:.3f}, KV {r.fraction_of_full:.0%} of full ({r.seconds:.0f} s)")
    return rows
