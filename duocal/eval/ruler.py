"""RULER through lm-evaluation-harness, with each row's plan applied to an already loaded model.

Tasks (ruler_tasks.py) are built once for every context length: every row and protocol sees the
same prompts, made by lm-eval's generators and scored by lm-eval's metrics. For each context,
row and protocol, one `lm_eval.simple_evaluate` call runs the chosen documents through
`HFLM(pretrained=model)` while `dr.apply(model, plan)` is active: lm-eval calls `model.generate()`
without a cache and duocal's drop-in supplies one, so evicted tokens are really gone.

Protocols (protocols.py): `query-aware` is lm-eval's own run (the question prefilled with the
context). `query-agnostic` prefills each prompt up to its question (RULER puts the question after
the last newline of the prompt) alone through the cache, then generates the answer, question first,
on a copy of that compressed cache: the tokens are the same in both protocols, only what the cache
saw before the question differs. Scores are lm-eval's per-length metric (string match, 0-1).
A row whose every head is 16-bit full or a sink window runs once for both protocols (`both`): such
heads keep what the tokens' positions say, not what the question says, so the question prefilled
with the context or asked after it is the same computation (a prompt split across passes; a test
checks the tokens agree).
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import duocal_runtime as dr
from duocal.eval.row_kinds import (
    MIX_POLICIES,
    Progress,
    RowInputs,
    build_rows,
    check_mix_policies,
    check_rows,
    head_policy,
    refuse_beyond_positions,
    require_profile,
    row_window,
)

from . import ruler_tasks as T
from .protocols import SINGLE_QUESTION, protocols_of

DEFAULT_ROWS = ("full", "duo", "h2o", "snapkv")
POSITION_ONLY = ("full", "sink_window")  # policies whose kept tokens do not depend on the queries
MAX_NEW_TOKENS = 128  # the most any RULER task generates (niah): the room a prompt needs in the model's positions


@dataclass(frozen=True)
class RulerConfig:
    tasks: tuple[str, ...] = T.ALL_TASKS
    rows: tuple[str, ...] = DEFAULT_ROWS
    sparsities: tuple[float, ...] = (0.5,)
    contexts: tuple[int, ...] = (4096,)
    samples: int = 1  # documents per task and context
    sink: int | None = None
    recent: int | None = None
    random_seeds: int = 1
    protocol: str = "both"
    haystack: Path | None = None  # the essay tasks' text (default: duocal's GPL-3.0 text)
    mix_policies: tuple[str, ...] = MIX_POLICIES  # what the mix row chooses among

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("tasks", tuple(self.tasks))
        set_("rows", tuple(self.rows))
        set_("sparsities", tuple(float(s) for s in self.sparsities))
        set_("contexts", tuple(int(c) for c in self.contexts))
        set_("mix_policies", tuple(self.mix_policies))
        check_rows(self.rows, self.sparsities)
        check_mix_policies(self.mix_policies)
        T.check_task_names(self.tasks)
        protocols_of(self.protocol, SINGLE_QUESTION)  # RULER asks one question per prompt: no multi-turn
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct RULER task names, got {list(self.tasks)}")
        if not self.contexts or any(c < 256 for c in self.contexts):
            raise ValueError(f"contexts must be at least 256 tokens (RULER's prompts), got {list(self.contexts)}")
        for name in ("samples", "random_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def window(self, profile: dr.Profile | None) -> dr.SinkWindow:
        return row_window(profile, self.sink, self.recent)

    @property
    def essay_tasks(self) -> tuple[str, ...]:
        return tuple(t for t in self.tasks if t in T.ESSAY_TASKS)


@dataclass
class RulerRow:
    row: str
    context: int
    sparsity: float
    protocol: str
    scores: dict[str, float]  # task -> lm-eval's score at this context (mean over seeds for random)
    average: float
    kv_bytes: int  # analytic, at `context`, batch 1, model dtype
    fraction_of_full: float
    samples: int
    head_policy: dict[str, Any] | None
    seconds: float
    seeds: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        return {**data, **self.extra}


def ruler_question_start(tokenizer, ids: list[int]) -> int:
    """The first token of the prompt's question: the last token whose text holds a newline (a token
    that merges the newline with the question's first characters belongs to the question)."""
    for i in range(len(ids) - 1, -1, -1):
        if "\n" in tokenizer.decode([ids[i]]):
            return i
    raise ValueError("this prompt has no newline before its question: the query-agnostic protocol cannot split it")


def asks_alike(plan: dr.Plan) -> bool:
    """Whether every head keeps the same tokens whenever the question comes: 16-bit full or a sink
    window (a coded full head differs: the question in the prefill reads the context in full precision)."""
    return all(p.name in POSITION_ONLY and getattr(p, "kv_bits", 16) == 16 for row in plan.policies for p in row)


def row_protocols(row, protocols: tuple[str, ...]) -> tuple[str, ...]:
    """The protocols a row runs in: one run labelled `both` when its plans ask alike in both."""
    if len(protocols) == 2 and all(asks_alike(plan) for plan in row.plans):
        return ("both",)
    return protocols


def lm_eval_model(model, tokenizer, max_length: int, progress=None):
    """lm-eval's HFLM over the loaded model, counting generations, and, while `asking_after` holds a
    runtime, answering after the context (the query-agnostic protocol)."""
    from lm_eval.models.huggingface import HFLM

    class DuocalLM(HFLM):
        asking_after: dr.Runtime | None = None
        seen_before_question: list[tuple[int, int]] = []

        def generate_until(self, requests, disable_tqdm: bool = False):
            return super().generate_until(requests, disable_tqdm=True)  # duocal's bar counts generations

        def _model_generate(self, context, max_length, stop, **generation_kwargs):
            if progress is not None:
                progress()
            if self.asking_after is None:
                return super()._model_generate(context, max_length, stop, **generation_kwargs)
            if context.shape[0] != 1:
                raise ValueError("the query-agnostic protocol runs one prompt at a time (batch_size=1)")
            start = ruler_question_start(self.tokenizer, context[0].tolist())
            cache = self.asking_after.new_cache()
            with torch.no_grad():
                self.model(input_ids=context[:, :start], cache=cache, logits_to_keep=1)
            self.seen_before_question.append((int(cache.get_seq_length()), start))  # (tokens seen, question start)
            generation_kwargs.pop("attention_mask", None)  # no padding at batch 1
            return super()._model_generate(context, max_length, stop, cache=copy.deepcopy(cache), **generation_kwargs)

    return DuocalLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=max_length)


def run_lm_eval(lm, tasks, samples: dict[str, list[int]], runtime, protocol: str) -> dict[str, Any]:
    import lm_eval

    lm.asking_after = runtime if protocol == "query-agnostic" else None
    lm.seen_before_question = []
    try:
        return lm_eval.simple_evaluate(
            model=lm, tasks=tasks, samples=samples, bootstrap_iters=0, log_samples=False, verbosity="ERROR"
        )
    finally:
        lm.asking_after = None


def scores_at(results: dict[str, Any], context: int) -> dict[str, float]:
    """task -> lm-eval's score at `context` (a task with no document of that length is an error)."""
    out = {}
    for task, metrics in results["results"].items():
        value = metrics.get(f"{context},none")
        if value is None or value == -1:
            raise ValueError(f"{task} made no document of {context} tokens; try another context")
        out[task] = float(value)
    return out


def check_contexts(config: RulerConfig, model_config) -> None:
    advice = "lm-eval would cut the start of the prompt: choose a shorter --contexts"
    refuse_beyond_positions(config.contexts, model_config, advice, generated=MAX_NEW_TOKENS)


def evaluate_ruler(
    model,
    tokenizer,
    tokenizer_dir: str,
    config: RulerConfig = RulerConfig(),
    *,
    profile: dr.Profile | None = None,
    progress: Progress | None = None,
) -> list[RulerRow]:
    """Every row x sparsity x protocol x context on the same lm-eval documents."""
    require_profile(config.rows, profile, model.config)
    check_contexts(config, model.config)
    model.eval()
    if config.essay_tasks:
        from .nltk_punkt import fetch_punkt, use_punkt

        use_punkt(fetch_punkt())
    with tempfile.TemporaryDirectory(prefix="duocal-ruler-") as folder:
        tasks = T.build_tasks(
            config.tasks, config.contexts, tokenizer_dir, haystack_of(config), Path(folder), config.samples
        )
    return run_rows(model, tokenizer, tasks, config, profile, progress)


def haystack_of(config: RulerConfig) -> Path:
    from importlib import resources

    return config.haystack or Path(str(resources.files("duocal") / "assets" / "texts" / "gpl-3.0.txt"))


def run_rows(model, tokenizer, tasks, config: RulerConfig, profile, progress) -> list[RulerRow]:
    shape = dr.shape_of_config(model.config)
    protocols = protocols_of(config.protocol, SINGLE_QUESTION)
    planned = {
        c: build_rows(
            config.rows,
            config.sparsities,
            RowInputs(shape, c, config.window(profile), profile, config.random_seeds, config.mix_policies),
        )
        for c in config.contexts
    }
    runs = sum(len(r.plans) * len(row_protocols(r, protocols)) for rs in planned.values() for r in rs)
    total = len(tasks) * config.samples * runs
    done, label = 0, ""

    def tick():
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, label)

    lm = lm_eval_model(model, tokenizer, max(config.contexts) + MAX_NEW_TOKENS, tick)
    out = []
    for context, rows in planned.items():
        samples = T.docs_per_length(tasks, [context], config.samples)
        for row in rows:
            for protocol in row_protocols(row, protocols):
                label = f"{row.label}, {protocol}, {context} tokens"
                out.append(one_row(lm, model, row, tasks, samples, context, protocol, config))
                if hasattr(progress, "row"):
                    progress.row(f"{label}: average {out[-1].average:.3f}, KV {out[-1].fraction_of_full:.0%} of full")
    return out


def one_row(lm, model, row, tasks, samples, context: int, protocol: str, config: RulerConfig) -> RulerRow:
    """One row's plans (several for random) in one protocol at one context, on the chosen documents
    (`both`: lm-eval's own run, for a row that asks alike in both)."""
    started, per_plan, seen = time.perf_counter(), [], []
    for plan in row.plans:
        with dr.apply(model, plan) as runtime:
            per_plan.append(scores_at(run_lm_eval(lm, tasks, samples, runtime, protocol), context))
            seen += lm.seen_before_question
    dtype = next(model.parameters()).dtype
    result = ruler_row(row, per_plan, context, protocol, config, dtype, time.perf_counter() - started)
    if seen:  # query-agnostic: what each context's cache had seen when its question came
        result.extra["seen_before_question"] = [list(pair) for pair in seen]
    return result


def ruler_row(row, per_plan: list[dict[str, float]], context, protocol, config, dtype, seconds) -> RulerRow:
    scores = {task: sum(p[task] for p in per_plan) / len(per_plan) for task in per_plan[0]}
    full = dr.uniform_plan(row.plans[0].shape, dr.Full()).kv_bytes(context, 1, dtype)
    kv = round(sum(p.kv_bytes(context, 1, dtype) for p in row.plans) / len(row.plans))
    return RulerRow(
        row=row.row,
        context=context,
        sparsity=row.sparsity,
        protocol=protocol,
        scores=scores,
        average=sum(scores.values()) / len(scores),
        kv_bytes=kv,
        fraction_of_full=kv / full,
        samples=config.samples,
        head_policy=head_policy(row.plans[0]),
        seconds=round(seconds, 2),
        seeds=list(row.seeds) if row.seeds is not None else None,
    )
