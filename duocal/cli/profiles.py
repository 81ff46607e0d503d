"""`duocal profiles ...`: inspect, validate and convert profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

import duocal_runtime as dr
from duocal_runtime.files.output_paths import check_output, check_output_folder
from duocal_runtime.profile import CONFIG_NAME, TSV_NAME

from ..reports.profile_compare import compare_profiles
from ..reports.profile_summary import profile_summary, render_summary
from .options import json_only_stdout
from .user_errors import user_errors

profiles_app = typer.Typer(help="Inspect, validate, convert and fetch profiles.", no_args_is_help=True)

ProfileArg = Annotated[str, typer.Argument(help="Profile: a JSON file, a pattern directory, or a prebuilt name.")]
ModelConfigOpt = Annotated[
    Path | None, typer.Option("--model-config", help="A model's config.json (or its folder) to check against.")
]


UNKNOWN_POSITIONS_CONTEXT = 32768  # `profiles show`'s context when the model's config is not on this machine


def default_context(profile: dr.Profile) -> tuple[int, str]:
    """The context `profiles show` sizes memory at, and where it comes from."""
    from duocal.models.resolve import local_max_positions

    name = profile.model.name_or_path
    positions = local_max_positions(name)
    if positions is not None:
        return positions, "the model's max_position_embeddings"
    return UNKNOWN_POSITIONS_CONTEXT, (
        f"assumed: the positions of {name or 'an unnamed model'!s} are unknown here (its config.json is not on "
        "this machine); pass --context"
    )


@profiles_app.command("show")
def show(
    profile: ProfileArg,
    sparsity: Annotated[float | None, typer.Option(help="Fraction of KV heads made bounded.")] = None,
    context: Annotated[
        int | None,
        typer.Option(
            help="Context length for the memory estimate (default: the model's max positions when its config is "
            f"here, else {UNKNOWN_POSITIONS_CONTEXT})."
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="KV memory budget at --context ('2GiB', '500MB' or tokens): choose a policy per head to fit it."
        ),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(help="With --budget: the policies heads may get (default: full and the profile's policy)."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="dtype of the cached keys and values: the model's (memory, budgets).")
    ] = "bfloat16",
    kv_bits: Annotated[
        int, typer.Option(help="Bits full heads store keys and values in: 16, 8 or 4 (KIVI codes below 16).")
    ] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object instead of a table.")] = False,
):
    """Shape, score histogram, retrieval heads per layer and KV memory at CONTEXT vs full.

    Examples: duocal profiles show my-profile.json --sparsity 0.75 --context 131072

      duocal profiles show profiled.json --budget 2GiB --context 131072 --policies full,sink_window,h2o
    """
    with user_errors(), json_only_stdout(as_json):
        if policies is not None and budget is None:
            raise ValueError("--policies chooses per head under a memory budget: give --budget too")
        names = tuple(p.strip() for p in policies.split(",") if p.strip()) if policies else None
        loaded = dr.load_profile(profile)
        context, context_from = (context, "--context") if context is not None else default_context(loaded)
        summary = profile_summary(
            loaded,
            sparsity=sparsity,
            context=context,
            context_from=context_from,
            budget=budget,
            policies=names,
            dtype=dtype,
            kv_bits=kv_bits,
        )
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        render_summary(summary)


@profiles_app.command("validate")
def validate_command(profile: ProfileArg, model_config: ModelConfigOpt = None):
    """Exit 0 if PROFILE is valid (and fits --model-config), else print why and exit 1."""
    with user_errors():
        loaded = dr.load_profile(profile)
        if model_config is not None:
            from duocal_runtime.profile.shape import load_local_config

            loaded.check_compatible(load_local_config(model_config))
    typer.echo(f"ok: {loaded.shape.describe()}, model {loaded.model.name_or_path or 'unnamed'}")


def refuse_writing_an_input(output: Path, pattern_dir: Path, model_config: Path | None) -> None:
    """The output is checked before any work: a writable regular file that is none of the files read."""
    target = check_output(output, "--output").resolve()
    inputs = [pattern_dir / name for name in (TSV_NAME, CONFIG_NAME)] + [pattern_dir]
    if model_config is not None:
        inputs += [model_config, model_config / CONFIG_NAME]
    if any(target == path.resolve() for path in inputs):
        raise ValueError(f"--output {output} is one of the files being read; write the profile somewhere else")


@profiles_app.command("import-upstream")
def import_upstream(
    pattern_dir: Annotated[Path, typer.Argument(help="Folder with full_attention_heads.tsv and config.json.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile JSON to write.")],
    model_config: ModelConfigOpt = None,
    commit: Annotated[str | None, typer.Option(help="Upstream commit the pattern came from.")] = None,
):
    """Convert an upstream DuoAttention pattern directory into a duocal profile."""
    with user_errors():
        refuse_writing_an_input(output, pattern_dir, model_config)
        profile = dr.import_upstream(pattern_dir, model_config=model_config, commit=commit)
        dr.save_profile(profile, output)
    typer.echo(f"wrote {output} ({profile.shape.describe()})")


@profiles_app.command("export-upstream")
def export_upstream(
    profile: ProfileArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder to write the pattern into.")],
):
    """Write PROFILE in upstream DuoAttention's layout (full_attention_heads.tsv + config.json)."""
    with user_errors():
        check_output_folder(output, "--output", beside=True)  # assembled beside it, then moved in
        if Path(profile).is_dir() and Path(profile).resolve() == output.resolve():
            raise ValueError(f"--output {output} is the pattern folder being read; give another folder")
        dr.export_upstream(dr.load_profile(profile), output)
    typer.echo(f"wrote {output}")


@profiles_app.command("compare")
def compare(
    first: ProfileArg,
    second: ProfileArg,
    top: Annotated[int | None, typer.Option(help="How many top heads to compare (default: a quarter).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
):
    """How two profiles of one model agree: Spearman's rank correlation and top-head overlap.

    Example: duocal profiles compare runs/calibrated.json runs/profiled.json --top 8
    """
    with user_errors(), json_only_stdout(as_json):
        result = compare_profiles(dr.load_profile(first), dr.load_profile(second), top)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(
            f"spearman {result['spearman']:.3f} over {result['heads']} heads; top {result['top']}: "
            f"{result['top_overlap']} in common"
        )
