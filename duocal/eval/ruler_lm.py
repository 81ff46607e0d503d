"""lm-evaluation-harness's side of `eval ruler`: its HFLM over the loaded model, one run of its tasks
in a protocol, and the scores it reports.

`query-aware` is lm-eval's own run (the question prefilled with the context). `query-agnostic`
prefills each prompt up to its question (RULER puts the question after the last newline of the
prompt) alone through the cache, then generates the answer, question first, on a copy of that
compressed cache: the tokens are the same in both protocols, only what the cache saw before the
question differs.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch

import duocal_runtime as dr
from duocal.measure.limits import Progress


def ruler_question_start(tokenizer, ids: list[int]) -> int:
    """The first token of the prompt's question: the last token whose text holds a newline (a token
    that merges the newline with the question's first characters belongs to the question)."""
    for i in range(len(ids) - 1, -1, -1):
        if "\n" in tokenizer.decode([ids[i]]):
            return i
    raise ValueError("this prompt has no newline before its question: the query-agnostic protocol cannot split it")


def lm_eval_model(model, tokenizer, max_length: int, progress=None):
    """lm-eval's HFLM over the loaded model, counting generations, and, while `asking_after` holds a
    runtime, answering after the context (the query-agnostic protocol)."""
    from lm_eval.models.huggingface import HFLM

    class DuocalLM(HFLM):
        asking_after: dr.Runtime | None = None
        seen_before_question: list[tuple[int, int]]  # per instance: set by run_lm_eval before each run

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

    lm = DuocalLM(pretrained=model, tokenizer=tokenizer, batch_size=1, max_length=max_length)
    lm.seen_before_question = []
    return lm


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


@dataclass(frozen=True)
class Job:
    """One task's documents under one row's plans in one protocol at one context."""

    context: int
    row: int  # index of the row among the context's rows
    protocol: str
    task: int  # index of the task among the built tasks


@dataclass
class JobResult:
    per_plan: list[dict[str, float]]  # per plan of the row: {task: score}
    seen: list[tuple[int, int]]  # query-agnostic: (tokens the cache had seen, question start) per document
    seconds: float


class GenerationCounter:
    """Generations done / in all, reported to `progress` with what is running."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done, self.label = progress, total, 0, "RULER"

    def tick(self, count: int = 1) -> None:
        self.done += count
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, self.label)


def run_job(lm, model, row, task, samples: dict[str, list[int]], job: Job) -> JobResult:
    """The task's documents under each of the row's plans (several for random)."""
    started, per_plan, seen = time.perf_counter(), [], []
    chosen = {task.task_name: samples[task.task_name]}
    for plan in row.plans:
        with dr.apply(model, plan) as runtime:
            per_plan.append(scores_at(run_lm_eval(lm, [task], chosen, runtime, job.protocol), job.context))
            seen += lm.seen_before_question
    return JobResult(per_plan, seen, time.perf_counter() - started)
