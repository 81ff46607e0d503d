"""Passkey retrieval through the per-head KV cache, for several policies at matching KV budgets.

Every row is greedy exact match: the model generates as many tokens as the answer has, under
`model.generate()` with a `DuoCache` from `duocal_runtime.apply`, so evicted tokens are really gone
(not masked). All rows see the same samples (one generator per context, same seed); the rows (full,
duo, streaming, h2o, random, mix) are described in row_kinds.py. KV bytes are analytic (`Plan.kv_bytes`
at the context length, one sequence, the model's dtype) and measured (`DuoCache.kv_bytes()` at the
end of generation, per sequence, including the slack of growing full-head buffers and left padding).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import duocal_runtime as dr
from duocal.data import FORMATS, PasskeyGenerator, PasskeySample
from duocal.data.chat_prompts import CHAT_DEPTHS
from duocal.data.padding import pad_token_id
from duocal.data.passkey_formats import DEMO_PASSKEY_FORMAT
from duocal.eval.row_kinds import (
    MIX_POLICIES,
    RowInputs,
    RowPlans,
    build_rows,
    check_kv_bits,
    check_mix_policies,
    check_rows,
    default_rows,
    head_policy,
    refuse_rows_beyond_positions,
    require_profile,
    row_sink_window,
)
from duocal.measure.chat_answer import check_chat
from duocal.measure.limits import Progress
from duocal_runtime.compat import check_model_supported

from .chat_passkey import ChatWork, chat_work, run_chat_row
from .protocols import ASK_AFTER, Work, greedy_answers, make_batches, protocols_of

# Not among the demo recipe's data seeds (0-5, 1000-1005, 424242, 424243): held out.
EVAL_SEED = 7777


@dataclass(frozen=True)
class PasskeyEvalConfig:
    """What to evaluate. Sizes are tokens; `sink` / `recent` default to the profile's deploy sizes
    (else 64 / 256, upstream DuoAttention's deployment sink window)."""

    rows: tuple[str, ...] = default_rows(has_profile=True)  # row kinds (row_kinds.py)
    sparsities: tuple[float, ...] = (0.25, 0.5, 0.75)
    contexts: tuple[int, ...] = (512, 1024)
    samples: int = 40
    seed: int = EVAL_SEED
    sink: int | None = None
    recent: int | None = None
    positions: str | None = None  # what sink windows of duo and random see (None: the profile's, else original)
    random_seeds: int = 3
    batch_size: int = 8
    format: str = DEMO_PASSKEY_FORMAT
    num_passkeys: int | tuple[int, int] = (1, 6)
    haystack: Any = "synthetic"
    protocol: str = "query-aware"  # or query-agnostic / multi-turn (the questions after the context), both, all
    questions: str = "one"  # "one" of each sample's passkeys, or "all" of them, one after another
    kv_bits: tuple[int, ...] = (16,)  # widths of full heads' keys and values, one row each (16, 8, 4)
    mix_policies: tuple[str, ...] = MIX_POLICIES  # what the mix row chooses among
    depths: tuple[float, ...] = CHAT_DEPTHS  # chat format: where the key sits in the haystack, in turn
    answer_tokens: int = 16  # chat format: the free answer's most new tokens

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("rows", tuple(self.rows))
        set_("sparsities", tuple(float(s) for s in self.sparsities))
        set_("contexts", tuple(int(c) for c in self.contexts))
        set_("kv_bits", tuple(self.kv_bits))
        set_("mix_policies", tuple(self.mix_policies))
        set_("depths", tuple(float(d) for d in self.depths))
        check_rows(self.rows, self.sparsities)
        check_mix_policies(self.mix_policies)
        check_kv_bits(self.kv_bits)
        if self.questions not in ("one", "all"):
            raise ValueError(f"questions must be 'one' or 'all', got {self.questions!r}")
        if "multi-turn" in protocols_of(self.protocol) and self.questions == "one":
            raise ValueError("the multi-turn protocol asks several questions in sequence: add questions='all'")
        if not self.contexts or any(c < 1 for c in self.contexts):
            raise ValueError(f"contexts must be positive token counts, got {list(self.contexts)}")
        if isinstance(self.format, str) and self.format not in (*FORMATS, "chat"):
            raise ValueError(
                f"unknown passkey format {self.format!r}; choose one of chat, {', '.join(sorted(FORMATS))}"
            )
        if self.format == "chat":
            check_chat(self.depths, self.answer_tokens, self.protocol, self.questions, self.haystack)
        for name in ("samples", "random_seeds", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("sink", "recent"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive number of tokens, got {value}")

    def sink_window(self, profile: dr.Profile | None) -> dr.SinkWindow:
        return row_sink_window(profile, self.sink, self.recent, self.positions)


@dataclass
class PasskeyRow:
    """One (row, context, sparsity): exact match and KV bytes per sequence."""

    row: str
    context: int
    sparsity: float  # requested fraction of bounded KV heads (0 for full, 1 for streaming)
    exact_match: float  # mean over questions (and seeds, for random)
    kv_bytes: int  # analytic, at `context` tokens, batch 1, model dtype (mean over seeds for random)
    kv_bytes_measured: int  # held by the cache at the end of generation, per sequence
    kv_bytes_full: int
    fraction_of_full: float
    samples: int
    bounded_heads: int
    num_heads: int
    head_policy: dict[str, Any] | None  # the bounded heads' policy and its sizes
    seconds: float
    protocol: str = "query-aware"
    kv_bits: int = 16  # how full heads stored keys and values
    questions: int | None = None  # questions asked in all (several per sample with questions="all")
    seeds: list[int] | None = None  # random only
    per_seed: list[float] | None = None
    min: float | None = None
    max: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        return {**data, **self.extra}


# --- checks ---------------------------------------------------------------------------------
def check_eval(config: PasskeyEvalConfig, model_config: Any, profile: dr.Profile | None = None, tokenizer=None) -> None:
    """Raise `ValueError` if the options do not fit this model (and, given its tokenizer, if the
    passkeys do not fit every context): cheap, so it can run before the weights are loaded."""
    check_model_supported(model_config)
    advice = "evaluate at most that many tokens"
    refuse_rows_beyond_positions(config.contexts, model_config, advice, rows=config.rows)
    require_profile(config.rows, profile, model_config)
    if config.format == "chat":
        refuse_rows_beyond_positions(config.contexts, model_config, advice, config.answer_tokens, rows=config.rows)
    if tokenizer is not None and config.format == "chat":
        for context in config.contexts:
            chat_work(tokenizer, context, config.samples, config.depths, config.haystack, config.seed)
    elif tokenizer is not None:
        for context in config.contexts:
            passkey_generator(tokenizer, context, config)  # checks the largest sample fits


# --- data -----------------------------------------------------------------------------------
def passkey_generator(tokenizer, context: int, config: PasskeyEvalConfig) -> PasskeyGenerator:
    """Samples of exactly `context` tokens with one question each (the demo recipe's final eval)."""
    return PasskeyGenerator(
        tokenizer,
        context_length=context,
        num_passkeys=config.num_passkeys,
        questions=config.questions,
        haystack=config.haystack,
        format=config.format,
        seed=config.seed,
    )


def make_samples(tokenizer, context: int, config: PasskeyEvalConfig) -> list[PasskeySample]:
    return list(passkey_generator(tokenizer, context, config).samples(config.samples))


def make_work(tokenizer, context: int, config: PasskeyEvalConfig, pad_id: int) -> Work | ChatWork:
    if config.format == "chat":
        return chat_work(tokenizer, context, config.samples, config.depths, config.haystack, config.seed)
    samples = tuple(make_samples(tokenizer, context, config))
    return Work(samples, tuple(make_batches(samples, config.batch_size, pad_id)))


# --- running --------------------------------------------------------------------------------
def run_plan(
    model,
    plan: dr.Plan,
    work: Work,
    pad_id: int,
    tick: Callable[[int], None] = lambda n: None,
    protocol: str = "query-aware",
) -> tuple[list[bool], int]:
    """Exact match per question, and the most KV bytes one sequence held (measured)."""
    hits: list[bool] = []
    measured = 0
    with dr.apply(model, plan) as runtime:
        if protocol == "query-aware":
            for batch in work.batches:
                answers, nbytes = greedy_answers(model, runtime, batch, pad_id)
                hits += [got == want for got, want in zip(answers, batch.answers, strict=True)]
                measured = max(measured, nbytes // len(batch.answers))
                tick(len(batch.answers))
        else:
            for sample in work.samples:
                asked = ASK_AFTER[protocol](model, runtime, sample)
                hits += [got == want.ids for got, want in zip(asked.answers, sample.answers, strict=True)]
                measured = max(measured, asked.kv_bytes)
                tick(len(sample.answers))
    return hits, measured


def passkey_row(
    row: RowPlans,
    context: int,
    results: list[tuple[list[bool], int]],
    dtype: Any,
    seconds: float,
    protocol: str,
    work: Work | ChatWork,
) -> PasskeyRow:
    plans = row.plans
    full_bytes = dr.uniform_plan(plans[0].shape, dr.Full()).kv_bytes(context, 1, dtype)
    kv_bytes = round(sum(p.kv_bytes(context, 1, dtype) for p in plans) / len(plans))
    accuracies = [sum(hits) / len(hits) for hits, _ in results]
    out = PasskeyRow(
        row=row.row,
        context=context,
        sparsity=row.sparsity,
        exact_match=sum(accuracies) / len(accuracies),
        kv_bytes=kv_bytes,
        kv_bytes_measured=max(m for _, m in results),
        kv_bytes_full=full_bytes,
        fraction_of_full=kv_bytes / full_bytes,
        samples=len(work.samples),
        bounded_heads=plans[0].num_bounded,
        num_heads=plans[0].num_heads,
        head_policy=head_policy(plans[0]),
        seconds=round(seconds, 2),
        protocol=protocol,
        kv_bits=row.kv_bits,
        questions=work.questions if work.questions != len(work.samples) else None,
    )
    if row.seeds is not None:
        out.seeds, out.per_seed = list(row.seeds), accuracies
        out.min, out.max = min(accuracies), max(accuracies)
    return out


def evaluate_passkey(
    model,
    tokenizer,
    config: PasskeyEvalConfig = PasskeyEvalConfig(),
    *,
    profile: dr.Profile | None = None,
    plans: Mapping[str, dr.Plan] | None = None,
    progress: Progress | None = None,
) -> list[PasskeyRow]:
    """Exact-match passkey retrieval for each row x context x sparsity (plus hand-made `plans`,
    one row each per context, named by their key). Checks everything and builds every sample and
    plan before the first generation."""
    check_eval(config, model.config, profile)
    model.eval()
    shape = dr.shape_of_config(model.config)
    sink_window = config.sink_window(profile)
    dtype = next(model.parameters()).dtype
    pad_id = pad_token_id(tokenizer, model.config)
    work = []
    for context in config.contexts:
        asked = make_work(tokenizer, context, config, pad_id)
        inputs = RowInputs(shape, context, sink_window, profile, config.random_seeds, config.mix_policies)
        work += [(context, r, asked) for r in build_rows(config.rows, config.sparsities, inputs, plans, config.kv_bits)]
    protocols = protocols_of(config.protocol)
    total = sum(len(v.plans) * w.questions for _, v, w in work) * len(protocols)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total, label)

    rows = []
    for (context, row, asked), protocol in ((w, p) for w in work for p in protocols):
        label = f"{row.label}, {context} tokens, {protocol}"
        tick(0)
        started = time.perf_counter()
        if isinstance(asked, ChatWork):
            results, extra = run_chat_row(
                model, tokenizer, row.plans, asked, config.answer_tokens, tick, config.batch_size
            )
        else:
            results, extra = [run_plan(model, plan, asked, pad_id, tick, protocol) for plan in row.plans], {}
        rows.append(passkey_row(row, context, results, dtype, time.perf_counter() - started, protocol, asked))
        rows[-1].extra.update(extra)
        if hasattr(progress, "row"):  # the CLI's progress prints each row as it finishes
            r = rows[-1]
            clean = f", clean {r.extra['clean']:.3f}" if "clean" in r.extra else ""
            progress.row(
                f"{label}: exact match {r.exact_match:.3f}{clean}, KV {r.fraction_of_full:.0%} of full"
                f" ({r.seconds:.0f} s)"
            )
    return rows
