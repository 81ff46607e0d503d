"""`duocal eval stream`: one long stream of text through one cache per row, scored in buckets.

StreamingLLM's measurement (Xiao et al., ICLR 2024, fig. 3): feed the tokens a chunk at a time, every
token predicted from all the row's cache holds before it; per bucket of tokens the perplexity, the KV
bytes held, the process's resident memory and the tokens per second. Rows:

- `full`: the model without duocal (transformers' DynamicCache): it shows where attention past the
  trained length breaks, and stops before its cache passes `full_kv_limit` bytes, saying so;
- `streaming-original`: every head a sink window with original positions (DuoAttention's rule);
- `streaming`: every head a sink window that sees positions within its cache (StreamingLLM's rule);
- `duo`: the profile's plan at `sparsity`, streaming heads with original positions unless asked
  (its full heads grow: it stops as `full` does).

With `fresh_checks`, buckets spread over the stream are fed again to the `streaming` row from position 0,
after a warm-up of the sink + recent tokens before them: a stream that really does not end scores them
as a fresh stream does.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

import duocal_runtime as dr
from duocal.eval.stream_text import TokenTape
from duocal.measure.limits import Progress
from duocal_runtime.quant.hf_baselines import cache_bytes as transformers_cache_bytes

STREAM_ROWS = ("full", "streaming-original", "streaming", "duo")
DEFAULT_SINK, DEFAULT_RECENT = 4, 1020  # StreamingLLM's 4 sinks; a 1k cache


@dataclass(frozen=True)
class StreamConfig:
    """What to stream. Sizes are tokens; `bucket` is a multiple of `chunk`."""

    tokens: int
    bucket: int
    chunk: int = 1024
    rows: tuple[str, ...] = ("full", "streaming-original", "streaming")
    sink: int = DEFAULT_SINK
    recent: int = DEFAULT_RECENT
    sparsity: float | None = None  # duo: the profile's deploy sparsity
    duo_positions: str = "original"
    full_kv_limit: int = 1 << 30
    fresh_checks: int = 0
    broken_ratio: float = 0.0  # a row whose distances grow stops once two points pass this times its best (0: never)
    resolution: int | None = None  # tokens per point of the plot (default: the chunk); a multiple of `chunk`
    time_limit: float | None = None  # seconds: a row with full heads stops before it runs longer (None: no limit)

    def __post_init__(self):
        for name in ("tokens", "bucket", "chunk", "sink", "recent", "full_kv_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number of tokens, got {value!r}")
        if self.bucket % self.chunk:
            raise ValueError(f"--bucket ({self.bucket}) must be a multiple of --chunk ({self.chunk})")
        if self.resolution is not None and (self.resolution < 1 or self.resolution % self.chunk):
            raise ValueError(f"--resolution ({self.resolution}) must be a positive multiple of --chunk ({self.chunk})")
        if self.tokens < self.bucket:
            raise ValueError(f"--tokens ({self.tokens}) is less than one bucket ({self.bucket}); stream more")
        unknown = [r for r in self.rows if r not in STREAM_ROWS]
        if unknown or not self.rows:
            raise ValueError(f"unknown row(s) {unknown}; choose from {', '.join(STREAM_ROWS)}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"--time-limit must be a positive number of seconds, got {self.time_limit}")
        if not (self.broken_ratio == 0 or self.broken_ratio > 1):
            raise ValueError(f"--broken-ratio must be 0 (never stop) or above 1, got {self.broken_ratio}")
        if not 0 <= self.fresh_checks <= self.tokens // self.bucket - 1:
            raise ValueError(
                f"--fresh-checks must be between 0 and the buckets after the first ({self.tokens // self.bucket - 1})"
            )


@dataclass
class Bucket:
    start: int
    end: int
    ppl: float
    tokens_per_s: float
    kv_bytes: int
    rss_bytes: int
    fresh_ppl: float | None = None  # the same tokens fed fresh from position 0 (streaming row, fresh checks)


@dataclass
class StreamRow:
    name: str
    plan: str
    buckets: list[Bucket] = field(default_factory=list)
    stopped: str | None = None  # why the row ended before the stream did
    points: list[tuple[int, float]] = field(default_factory=list)  # (tokens, perplexity) every `resolution` tokens

    @property
    def peak_rss_bytes(self) -> int:
        return max((b.rss_bytes for b in self.buckets), default=0)

    def to_dict(self) -> dict:
        return {**asdict(self), "peak_rss_bytes": self.peak_rss_bytes}


def resident_bytes() -> int:
    """This process's resident memory now (Linux /proc; else the peak so far)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cache_bytes(cache) -> int:
    """KV bytes a row's cache holds: a DuoCache's own count, or transformers' cache's tensors."""
    return cache.kv_bytes() if hasattr(cache, "kv_bytes") else transformers_cache_bytes(cache)


def row_plan(name: str, config: StreamConfig, shape: dr.ModelShape, profile: dr.Profile | None) -> dr.Plan | None:
    """The row's plan (None: the model without duocal)."""
    if name == "full":
        return None
    if name == "duo":
        if profile is None:
            raise ValueError("row 'duo' needs a profile of this model: pass --profile, or leave duo out of --rows")
        return dr.plan(profile, sparsity=config.sparsity, sink=config.sink, recent=config.recent,
                       positions=config.duo_positions)  # fmt: skip
    positions = "cache" if name == "streaming" else "original"
    return dr.uniform_plan(shape, dr.SinkWindow(config.sink, config.recent, positions=positions))


def plan_description(plan: dr.Plan | None) -> str:
    return (
        "dense attention (no duocal)"
        if plan is None
        else ", ".join(f"{label} {n}" for label, n in plan.policy_counts().items())
    )


class RowStream:
    """One row fed one chunk at a time through one cache, its loss summed per bucket."""

    def __init__(self, model, plan: dr.Plan | None, config: StreamConfig):
        self.model, self.plan, self.config = model, plan, config
        self.runtime = dr.apply(model, plan) if plan is not None else None
        self.cache = self.runtime.new_cache() if self.runtime else _dynamic_cache(model)
        self.last_logits: torch.Tensor | None = None
        self.seen = 0

    def feed(self, ids: list[int], scored: bool = True) -> tuple[float, int]:
        """Feed `ids`; the summed loss of those predicted here (all but a stream's first token)."""
        device = next(self.model.parameters()).device
        tensor = torch.tensor([ids], device=device)
        with torch.no_grad():
            logits = self.model(input_ids=tensor, cache=self.cache, use_cache=True).logits[0].float()
        if self.last_logits is not None:
            logits = torch.cat([self.last_logits[None], logits])
            targets = tensor[0]
        else:
            targets = tensor[0, 1:]
        self.last_logits = logits[-1]
        self.seen += len(ids)
        if not scored:
            return 0.0, 0
        loss = torch.nn.functional.cross_entropy(logits[: len(targets)], targets, reduction="sum")
        return float(loss), len(targets)

    def grows_past(self, limit: int) -> bool:
        """Whether the next chunk would take the cache past `limit` bytes (rows with full heads)."""
        held = cache_bytes(self.cache)
        return self.seen > 0 and held + held / self.seen * self.config.chunk > limit

    def past_limits(self, started: float) -> str | None:
        """Why a row with full heads stops before its next chunk (its KV bytes, its time), or None."""
        config = self.config
        if self.grows_past(config.full_kv_limit):
            limit = f"{config.full_kv_limit / 2**30:g} GiB"
            return f"stopped at {self.seen:,} tokens: its KV cache would pass --full-kv-limit ({limit})"
        if config.time_limit and self.seen and time.perf_counter() - started > config.time_limit:
            return f"stopped at {self.seen:,} tokens: it ran past --time-limit ({config.time_limit:g} s)"
        return None

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.remove()


def _dynamic_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def stream_row(
    model, name: str, plan: dr.Plan | None, tape: TokenTape, config: StreamConfig, progress: Progress, keep=()
) -> tuple[StreamRow, dict[int, list[int]]]:
    """Stream the tape through `plan`; also returns the tokens of buckets `keep` (with their warm-ups)."""
    row, stream = StreamRow(name, plan_description(plan)), RowStream(model, plan, config)
    bounded = plan is not None and all(p.bounded for r in plan.policies for p in r)
    can_break = plan is None or not plan.distances_bounded  # distances past the trained length: it may break
    tape.rewind()
    kept, warm, before = {}, config.sink + config.recent, []  # `before`: the last `warm` tokens read
    started = time.perf_counter()
    point = Points(row.points, config.resolution or config.chunk)
    try:
        for start in range(0, config.tokens, config.bucket):
            loss, count, began = 0.0, 0, time.perf_counter()
            index, bucket_ids = start // config.bucket, list(before) if start // config.bucket in keep else None
            while stream.seen < start + config.bucket:
                row.stopped = None if bounded else stream.past_limits(started)
                if row.stopped:
                    return row, kept
                ids = tape.take(config.chunk)
                if not ids:
                    row.stopped = f"the text ended at {stream.seen:,} tokens"
                    return row, kept
                chunk_loss, chunk_count = stream.feed(ids)
                loss, count = loss + chunk_loss, count + chunk_count
                completed = point.add(stream.seen, chunk_loss, chunk_count)
                if completed and can_break and broken(row.points, config.broken_ratio):
                    row.stopped = (
                        f"stopped at {stream.seen:,} tokens: two points past {config.broken_ratio:g}x its best"
                    )
                    return row, kept
                before = (before + ids)[-warm:] if keep else before
                if bucket_ids is not None:
                    bucket_ids += ids
                progress(stream.seen, config.tokens, f"{name}: {stream.seen:,} tokens")
            if bucket_ids is not None:
                kept[index] = bucket_ids
            elapsed = time.perf_counter() - began
            row.buckets.append(
                Bucket(
                    start,
                    stream.seen,
                    math.exp(loss / max(count, 1)),
                    (stream.seen - start) / elapsed,
                    cache_bytes(stream.cache),
                    resident_bytes(),
                )
            )
    finally:
        stream.close()
    return row, kept


class Points:
    """Perplexity every `every` tokens, into `out` (the plot's resolution, finer than buckets)."""

    def __init__(self, out: list, every: int):
        self.out, self.every, self.loss, self.count = out, every, 0.0, 0

    def add(self, seen: int, loss: float, count: int) -> bool:
        """Add a chunk's loss; True when it completed a point."""
        self.loss, self.count = self.loss + loss, self.count + count
        if seen % self.every or not self.count:
            return False
        self.out.append((seen, math.exp(self.loss / self.count)))
        self.loss, self.count = 0.0, 0
        return True


def broken(points: list[tuple[int, float]], ratio: float) -> bool:
    """Whether the last two points passed `ratio` times the best perplexity before them."""
    if not ratio or len(points) < 3:
        return False
    best = min(ppl for _, ppl in points[:-2])
    return all(ppl > ratio * best for _, ppl in points[-2:])


def fresh_ppl(model, plan: dr.Plan, ids: list[int], warm: int, chunk: int) -> float:
    """Perplexity of `ids[warm:]` fed from position 0 after `ids[:warm]` (unscored)."""
    stream = RowStream(model, plan, None)
    try:
        stream.feed(ids[:warm], scored=False)
        loss, count = 0.0, 0
        for start in range(warm, len(ids), chunk):
            chunk_loss, chunk_count = stream.feed(ids[start : start + chunk])
            loss, count = loss + chunk_loss, count + chunk_count
    finally:
        stream.close()
    return math.exp(loss / max(count, 1))


def checked_buckets(config: StreamConfig) -> list[int]:
    """`fresh_checks` bucket indices spread evenly over the buckets after the first."""
    last = config.tokens // config.bucket - 1
    if config.fresh_checks == 0:
        return []
    if config.fresh_checks == 1:
        return [last]
    step = (last - 1) / (config.fresh_checks - 1)
    return sorted({round(1 + i * step) for i in range(config.fresh_checks)})


def offset_progress(progress: Progress, before: int, total: int) -> Progress:
    """A row's progress as a share of every row's tokens (rows that stop early leave the ETA high)."""
    return lambda done, _, what: progress(before + done, total, what)


def stream_plans(config: StreamConfig, model_config, profile: dr.Profile | None) -> dict[str, dr.Plan | None]:
    """Every row's plan, from the model's config alone (what a row cannot run is refused before any work)."""
    if profile is not None:
        profile.check_compatible(model_config)
    shape = dr.shape_of_config(model_config)
    return {name: row_plan(name, config, shape, profile) for name in config.rows}


def evaluate_stream(
    model, tape: TokenTape, config: StreamConfig, profile: dr.Profile | None = None, progress: Progress | None = None
) -> list[StreamRow]:
    """Every row of `config` over the same tokens (see the module)."""
    progress = progress or (lambda done, total, what: None)
    plans = stream_plans(config, model.config, profile)
    rows = []
    for index, name in enumerate(config.rows):
        keep = checked_buckets(config) if name == "streaming" else []
        row_progress = offset_progress(progress, index * config.tokens, len(config.rows) * config.tokens)
        row, kept = stream_row(model, name, plans[name], tape, config, row_progress, keep)
        for number, ids in kept.items():
            bucket = row.buckets[number]
            row_progress(bucket.end, 0, f"{name}: bucket {number} fed fresh from position 0")
            bucket.fresh_ppl = fresh_ppl(model, plans[name], ids, len(ids) - (bucket.end - bucket.start), config.chunk)
        rows.append(row)
        if hasattr(progress, "row"):
            progress.row(f"{name}: {len(row.buckets)} buckets" + (f"; {row.stopped}" if row.stopped else ""))
    return rows


def rows_to_dict(rows: Sequence[StreamRow], config: StreamConfig, trained: int | None) -> dict:
    return {"config": asdict(config), "trained_length": trained, "rows": [r.to_dict() for r in rows]}
