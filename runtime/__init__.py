"""duocal_runtime: per-head KV cache policies for Hugging Face causal LMs.

Public API::

    import duocal_runtime as dr
    profile = dr.load_profile("path/or/name")          # or a URL, or hf://OWNER/REPO
    pulled = dr.pull("duo-attention/Meta-Llama-3.1-8B-Instruct")   # cached, verified; pulled.path
    plan = dr.plan(profile, sparsity=0.5)
    with dr.apply(model, plan) as runtime:
        out = model.generate(**inputs, max_new_tokens=256, cache=runtime.new_cache())

Names load on first use (PEP 562), so `import duocal_runtime` costs nothing until a name is used:
command-line tools that import it start fast, and torch and transformers load when needed.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_EXPORTS = {  # public name -> the module that defines it
    ".hf.apply": ("Runtime", "apply"),
    ".hf.cache": ("DuoCache",),
    ".errors": ("CacheFullError", "PlanError", "ProfileError"),
    ".compat": ("SUPPORTED_MODEL_TYPES",),
    ".profile.shape": ("ModelShape", "config_fingerprint", "shape_of_config"),
    ".planning.budget": ("Budget",),
    ".planning.plan": (
        "Plan",
        "plan",
        "plan_from_bounded_set",
        "uniform_plan",
        "with_kv_bits",
    ),
    ".policies": (
        "H2O",
        "POLICIES",
        "Full",
        "HeadPolicy",
        "SinkH2O",
        "SinkWindow",
        "SnapKV",
        "make_policy",
        "register_policy",
    ),
    ".profile.deploy_defaults": ("DeployDefaults",),
    ".profile.format": ("ModelInfo", "Profile", "profile_from_dict", "save_profile"),
    ".profile.upstream": ("export_upstream", "import_upstream"),
    ".fetching.download": ("ChecksumError", "DownloadError"),
    ".fetching.hub": ("HubError",),
    ".fetching.loading": ("load_profile",),
    ".fetching.prebuilt_index": ("load_index",),
    ".fetching.pull": ("PulledProfile", "pull"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule, e.g. dr.planning
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
