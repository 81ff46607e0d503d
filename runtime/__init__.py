"""duocal_runtime: per-head KV cache policies for Hugging Face causal LMs.

Public API::

    import duocal_runtime as dr
    profile = dr.load_profile("path/or/name")          # or a URL, or hf://OWNER/REPO
    pulled = dr.pull("duo-attention/Meta-Llama-3.1-8B-Instruct")   # cached, verified; pulled.path
    plan = dr.plan(profile, sparsity=0.5)
    with dr.apply(model, plan) as runtime:
        out = model.generate(**inputs, max_new_tokens=256, cache=runtime.new_cache())
"""

from .apply import Runtime, apply
from .cache import DuoCache
from .fetching.download import ChecksumError, DownloadError
from .errors import CacheFullError, PlanError, ProfileError
from .hf_compat import SUPPORTED_MODEL_TYPES
from .fetching.hub import HubError
from .fetching.loading import load_profile
from .model_shape import ModelShape, config_fingerprint, shape_of_config
from .planning import Budget, Plan, plan, plan_from_streaming_set, uniform_plan
from .policies import H2O, POLICIES, Full, HeadPolicy, SinkH2O, SinkWindow, make_policy, register_policy
from .fetching.prebuilt_index import load_index
from .profile import DeployDefaults, ModelInfo, Profile, profile_from_dict, save_profile
from .fetching.pull import PulledProfile, pull
from .upstream import export_upstream, import_upstream

__all__ = [
    "CacheFullError", "DuoCache", "HeadPolicy", "Runtime", "register_policy", "SUPPORTED_MODEL_TYPES", "apply",
    "Budget", "DeployDefaults", "Full", "H2O", "ModelInfo", "ModelShape", "POLICIES", "Plan", "PlanError",
    "Profile", "ProfileError", "SinkH2O", "SinkWindow", "config_fingerprint", "export_upstream",
    "import_upstream", "load_profile", "make_policy", "plan", "plan_from_streaming_set", "profile_from_dict",
    "save_profile", "shape_of_config", "uniform_plan",
    "ChecksumError", "DownloadError", "HubError", "PulledProfile", "load_index", "pull",
]
