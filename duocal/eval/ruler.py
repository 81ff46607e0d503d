"""RULER through lm-evaluation-harness, with each row's plan applied to an already loaded model.

Tasks (ruler_tasks.py) are built once for every context length: every row and protocol sees the
same prompts, made by lm-eval's generators and scored by lm-eval's metrics. Each context, row,
protocol and task is one job: one `lm_eval.simple_evaluate` call runs the task's chosen documents
through `HFLM(pretrained=model)` while `dr.apply(model, plan)` is active (lm-eval calls
`model.generate()` without a cache and duocal's drop-in supplies one, so evicted tokens are really
gone). On a CPU the jobs run on forked workers of one thread each (workers.py).

Protocols: see ruler_lm.py. Scores are lm-eval's per-length metric (string match, 0-1). A row
whose every head is 16-bit full or a sink window runs once for both protocols (`both`): such heads
keep what the tokens' positions say, not what the question says, so the question prefilled with
the context or asked after it is the same computation (a prompt split across passes; a test checks
that the tokens agree).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duocal_runtime as dr
from duocal.eval.row_kinds import (
    MIX_POLICIES,
    RowInputs,
    build_rows,
    check_mix_policies,
    check_rows,
    head_policy,
    refuse_rows_beyond_positions,
    require_profile,
    row_sink_window,
)
from duocal.measure.limits import Progress

from . import ruler_tasks as T
from .protocols import SINGLE_QUESTION, protocols_of
from .ruler_lm import GenerationCounter, Job, JobResult, lm_eval_model, ruler_question_start, run_job
from .workers import check_worker_count, run_jobs, workers_for

__all__ = ["RulerConfig", "RulerRow", "evaluate_ruler", "ruler_question_start"]

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
    workers: int | None = None  # processes of one thread each (None: the CPU cores; 1 on a GPU)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        set_("tasks", tuple(self.tasks))
        set_("rows", tuple(self.rows))
        set_("sparsities", tuple(float(s) for s in self.sparsities))
        set_("contexts", tuple(int(c) for c in self.contexts))
        set_("mix_policies", tuple(self.mix_policies))
        check_rows(self.rows, self.sparsities)
        check_mix_policies(self.mix_policies)
        check_worker_count(self.workers)
        T.check_task_names(self.tasks)
        protocols_of(self.protocol, SINGLE_QUESTION)  # RULER asks one question per prompt: no multi-turn
        if not self.tasks or len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"tasks must be distinct RULER task names, got {list(self.tasks)}")
        if not self.contexts or any(c < 256 for c in self.contexts):
            raise ValueError(f"contexts must be at least 256 tokens (RULER's prompts), got {list(self.contexts)}")
        for name in ("samples", "random_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def sink_window(self, profile: dr.Profile | None) -> dr.SinkWindow:
        return row_sink_window(profile, self.sink, self.recent)

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


def asks_alike(plan: dr.Plan) -> bool:
    """Whether every head keeps the same tokens whenever the question comes: 16-bit full or a sink
    window (a quantized full head differs: the question in the prefill reads the context in full precision)."""
    return all(p.name in POSITION_ONLY and getattr(p, "kv_bits", 16) == 16 for row in plan.policies for p in row)


def row_protocols(row, protocols: tuple[str, ...]) -> tuple[str, ...]:
    """The protocols a row runs in: one run labelled `both` when its plans ask alike in both."""
    if len(protocols) == 2 and all(asks_alike(plan) for plan in row.plans):
        return ("both",)
    return protocols


def check_contexts(config: RulerConfig, model_config) -> None:
    advice = "lm-eval would cut the start of the prompt: choose a shorter --contexts"
    refuse_rows_beyond_positions(config.contexts, model_config, advice, generated=MAX_NEW_TOKENS)


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
    sink_window = config.sink_window(profile)
    planned = {
        c: build_rows(
            config.rows,
            config.sparsities,
            RowInputs(shape, c, sink_window, profile, config.random_seeds, config.mix_policies),
        )
        for c in config.contexts
    }
    samples = {c: T.docs_per_length(tasks, [c], config.samples) for c in config.contexts}
    jobs = [
        Job(c, i, protocol, t)
        for c, rows in planned.items()
        for i, row in enumerate(rows)
        for protocol in row_protocols(row, protocols)
        for t in range(len(tasks))
    ]
    workers = min(workers_for(config.workers, model.device), len(jobs))

    def generations(job: Job) -> int:
        return len(planned[job.context][job.row].plans) * len(samples[job.context][tasks[job.task].task_name])

    counter = GenerationCounter(progress, sum(map(generations, jobs)))
    if workers > 1:
        counter.label = f"RULER on {workers} workers"
    lm = lm_eval_model(model, tokenizer, max(config.contexts) + MAX_NEW_TOKENS, counter.tick if workers == 1 else None)

    def work(i: int) -> JobResult:
        job = jobs[i]
        row = planned[job.context][job.row]
        counter.label = f"{row.label}, {job.protocol}, {job.context} tokens"
        return run_job(lm, model, row, tasks[job.task], samples[job.context], job)

    rows = RowAssembly(jobs, planned, config, next(model.parameters()).dtype, progress)

    def done(i: int, result: JobResult) -> None:
        if workers > 1:
            counter.tick(generations(jobs[i]))
        rows.add(i, result)

    run_jobs(len(jobs), work, workers, done)
    return rows.rows()


class RowAssembly:
    """Jobs' results gathered into one `RulerRow` per (context, row, protocol), in the jobs' order;
    a row is reported to `progress.row` as soon as its last task is done."""

    def __init__(self, jobs: list[Job], planned, config: RulerConfig, dtype, progress):
        self.jobs, self.planned, self.config, self.dtype, self.progress = jobs, planned, config, dtype, progress
        self.groups: dict[tuple, list[int]] = {}  # (context, row, protocol) -> its jobs, in order
        for i, j in enumerate(jobs):
            self.groups.setdefault((j.context, j.row, j.protocol), []).append(i)
        self.results: dict[int, JobResult] = {}
        self.finished: dict[tuple, RulerRow] = {}

    def add(self, i: int, result: JobResult) -> None:
        self.results[i] = result
        key = (self.jobs[i].context, self.jobs[i].row, self.jobs[i].protocol)
        mine = self.groups[key]
        if all(k in self.results for k in mine):
            self.finished[key] = self.assemble(key, [self.results[k] for k in mine])
            if hasattr(self.progress, "row"):
                row = self.finished[key]
                label = f"{self.planned[key[0]][key[1]].label}, {key[2]}, {key[0]} tokens"
                self.progress.row(f"{label}: average {row.average:.3f}, KV {row.fraction_of_full:.0%} of full")

    def assemble(self, key, parts: list[JobResult]) -> RulerRow:
        context, index, protocol = key
        row = self.planned[context][index]
        per_plan = [{t: s for part in parts for t, s in part.per_plan[p].items()} for p in range(len(row.plans))]
        seconds = sum(part.seconds for part in parts)
        result = ruler_row(row, per_plan, context, protocol, self.config, self.dtype, seconds)
        seen = [list(pair) for part in parts for pair in part.seen]
        if seen:  # query-agnostic: what each context's cache had seen when its question came
            result.extra["seen_before_question"] = seen
        return result

    def rows(self) -> list[RulerRow]:
        return [self.finished[key] for key in self.groups]


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
