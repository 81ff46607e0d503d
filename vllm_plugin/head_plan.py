"""Which duocal plan a vLLM model runs, and its per-layer head table.

Settings, first found wins: the model config's ``duocal_*`` keys (pass them with
``hf_overrides={"duocal_profile": PATH, "duocal_sparsity": 0.5}``), then the ``DUOCAL_PROFILE`` /
``DUOCAL_SPARSITY`` / ``DUOCAL_BUDGET`` / ``DUOCAL_POLICY`` / ``DUOCAL_SINK`` / ``DUOCAL_RECENT`` /
``DUOCAL_TENSOR_PARALLEL`` environment variables. Without a sparsity or budget the profile's deploy sparsity
is used; sparsity 0 is an all-full plan. A budget ('64MiB') is KV bytes per request at the model's context
(``max_position_embeddings``) in the model's dtype, as ``duocal serve`` reads it. With ``tensor_parallel`` N > 1
every one of N ranks gets the same number of full heads per layer (duocal_runtime.planning.tensor_parallel); the
model plans for vLLM's own tensor parallel size when the settings name none (group_fit.vllm_head_table).

Only ``duocal_runtime``'s profile, planning and policy modules are imported: no transformers and
no duocal runtime cache code, so this runs next to vLLM's own transformers pin. H2O-family heads need
attention scores at run time, which vLLM's kernels do not return: a plan with any is refused, naming them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

SETTINGS = ("profile", "sparsity", "budget", "policy", "sink", "recent", "tensor_parallel")
# vLLM's model classes the plugin runs -> the plugin's class of each (models.py): vLLM's own model with duocal's
# attention call in each decoder layer. The families duocal's runtime plans (Llama incl. Llama-3 rope scaling,
# Mistral, Qwen2 with q/k/v bias, Qwen3 with per-head q/k norms).
DUO_ARCHITECTURES = {
    "LlamaForCausalLM": "DuoLlamaForCausalLM",
    "MistralForCausalLM": "DuoMistralForCausalLM",
    "Qwen2ForCausalLM": "DuoQwen2ForCausalLM",
    "Qwen3ForCausalLM": "DuoQwen3ForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(DUO_ARCHITECTURES)
ENV_PREFIX = "DUOCAL_"
CONFIG_PREFIX = "duocal_"


class DuoVllmError(ValueError):
    """A duocal profile or plan that this vLLM model cannot run."""


@dataclass(frozen=True)
class HeadSpec:
    """One KV head's policy as vLLM runs it: `sink` / `recent` are None for a full head. `slot` names its attention
    module on a tensor-parallel rank (rank_heads.py); None until the rank's heads are chosen."""

    kv_head: int
    sink: int | None = None
    recent: int | None = None
    slot: int | None = None

    @property
    def is_full(self) -> bool:
        return self.sink is None


def config_head_dim(config: Any) -> int:
    """The head size transformers builds for `config`: its head_dim, else hidden_size / num_attention_heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def settings_of(config: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The duocal settings of a model config (``duocal_*`` attributes) over the environment."""
    environ = os.environ if environ is None else environ
    found = {}
    for name in SETTINGS:
        value = getattr(config, CONFIG_PREFIX + name, None)
        if value is None:
            value = environ.get(ENV_PREFIX + name.upper())
        if value not in (None, ""):
            found[name] = str(value)
    return found


def make_plan(config: Any, settings: dict[str, str], dtype: Any = "bfloat16"):
    """(the profile, the duocal `Plan`) for a model with transformers-style `config`, from `settings` (a budget is
    planned in `dtype`, the dtype vLLM runs the model in)."""
    from duocal_runtime.errors import PlanError, ProfileError
    from duocal_runtime.fetching.loading import load_profile
    from duocal_runtime.planning.head_order import check_head_choice
    from duocal_runtime.planning.plan import plan
    from duocal_runtime.planning.tensor_parallel import balanced_plan

    if "profile" not in settings:
        raise DuoVllmError(
            "no duocal profile: pass hf_overrides={'duocal_profile': PATH} or set DUOCAL_PROFILE "
            "(a profile JSON file, a pattern folder or a prebuilt name)"
        )
    try:
        profile = load_profile(settings["profile"], offline=True)
        profile.check_compatible(config)
        numbers = {k: int(settings[k]) for k in ("sink", "recent") if k in settings}
        numbers["positions"] = "original"  # vLLM gives every key its place: its prefix cache relies on it
        sparsity = float(settings["sparsity"]) if "sparsity" in settings else None
        check_head_choice(sparsity=sparsity, budget=settings.get("budget"))
        if sparsity == 0:
            return profile, plan(profile, sparsity=0.0, positions="original")
        tensor_parallel = int(settings.get("tensor_parallel", 1))
        if tensor_parallel > 1:
            if "budget" in settings:
                raise DuoVllmError(
                    f"a plan for tensor parallel size {tensor_parallel} is made at a sparsity (every rank the same "
                    "full heads per layer): give a sparsity (duocal_sparsity, --sparsity), not a budget"
                )
            return profile, balanced_plan(profile, tensor_parallel, sparsity, policy=settings.get("policy"), **numbers)
        if "budget" in settings:
            numbers.update(budget=settings["budget"], context=config.max_position_embeddings, dtype=dtype)
        return profile, plan(profile, sparsity=sparsity, policy=settings.get("policy"), **numbers)
    except (ProfileError, PlanError) as err:
        raise DuoVllmError(f"duocal profile {settings['profile']!r}: {err}") from err


def head_table(plan, block_size: int) -> list[list[HeadSpec]]:
    """Per layer, per KV head: what vLLM runs. Refuses policies other than full and sink_window."""
    table, refused = [], []
    for layer, row in enumerate(plan.policies):
        specs = []
        for head, policy in enumerate(row):
            if policy.name == "full" and getattr(policy, "kv_bits", 16) == 16:
                specs.append(HeadSpec(head))
            elif policy.name == "sink_window" and not policy.cache_positions:
                specs.append(HeadSpec(head, policy.sink, policy.recent))
            elif policy.name == "sink_window":
                refused.append(f"layer {layer} head {head} (sink_window with positions within its cache)")
            else:
                refused.append(f"layer {layer} head {head} ({policy.name})")
        table.append(specs)
    if refused:
        shown = ", ".join(refused[:8]) + (f" and {len(refused) - 8} more" if len(refused) > 8 else "")
        raise DuoVllmError(
            f"duocal on vLLM runs only full and sink_window heads; this plan has {len(refused)} other heads: "
            f"{shown}. H2O-family heads need attention scores that vLLM's kernels do not return: plan with "
            "policy='sink_window' (DUOCAL_POLICY=sink_window). Sink windows keep their original positions on vLLM "
            "(its prefix cache relies on a key depending only on the tokens before it): plan with positions='original'"
        )
    del block_size
    return table


def load_head_table(
    config: Any, block_size: int, environ: dict[str, str] | None = None, dtype: Any = "bfloat16"
) -> list[list[HeadSpec]]:
    """Settings -> profile -> plan -> head table, for the model with `config` run in `dtype`."""
    return head_table(make_plan(config, settings_of(config, environ), dtype)[1], block_size)


def kernel_block_size(table: list[list[HeadSpec]]) -> int | None:
    """The largest vLLM-CPU block size with which every streaming head of `table` runs vLLM's kernel (its sink whole
    blocks, its recent at least one: virtual_tables.kernel_fits); None without streaming heads or if none fits."""
    from .virtual_tables import fitting_block_sizes

    shapes = {(spec.sink, spec.recent) for row in table for spec in row if not spec.is_full}
    fitting = [set(fitting_block_sizes(sink, recent)) for sink, recent in shapes]
    common = set.intersection(*fitting) if fitting else set()
    return max(common) if common else None


def check_streaming_heads_run_here(table: list[list[HeadSpec]], platform: str, is_cpu: bool) -> None:
    """Refuse streaming heads off vLLM-CPU, before any module is built: their attention is vLLM's paged CPU kernel
    on virtual block tables, and nothing else runs them yet (a CUDA build would fail inside its first step)."""
    streaming = sum(not spec.is_full for row in table for spec in row)
    if streaming and not is_cpu:
        raise DuoVllmError(
            f"this plan has {streaming} streaming (sink_window) heads, and duocal runs streaming heads on vLLM-CPU "
            f"only (vLLM's paged CPU kernel on virtual block tables); on {platform} that path is not built yet. "
            "Here, serve an all-full plan (DUOCAL_SPARSITY=0: vLLM's own layers, no KV saved) or use duocal's own "
            "server (duocal serve without --engine vllm), which runs the plan on any device torch supports"
        )


def check_balanced(table: list[list[HeadSpec]], tp_size: int) -> None:
    """Refuse a head table whose `tp_size` ranks hold different numbers of full heads in some layer, naming them."""
    from duocal_runtime.errors import PlanError
    from duocal_runtime.planning.tensor_parallel import unbalanced_layers

    try:
        uneven = unbalanced_layers([[spec.is_full for spec in row] for row in table], tp_size)
    except PlanError as err:
        raise DuoVllmError(str(err)) from err
    if uneven:
        shown = ", ".join(uneven[:6]) + (f" and {len(uneven) - 6} more" if len(uneven) > 6 else "")
        raise DuoVllmError(
            f"this plan is unbalanced for tensor parallel size {tp_size}: full KV heads per rank differ in "
            f"{len(uneven)} layers: {shown}. Plan for it: leave duocal_tensor_parallel unset (the plugin then plans "
            f"for vLLM's tensor parallel size) or set hf_overrides={{'duocal_tensor_parallel': {tp_size}}} (or "
            f"DUOCAL_TENSOR_PARALLEL={tp_size}): every rank then gets the same number of full heads per layer"
        )
