"""Training-free head profiling: per-head scores and kept-attention measurements from a model's own
attention (`duocal profile`), written as a version-2 profile for mixed plans under a budget."""

from duocal.profiling.profiler import ProfilerConfig, profile_model

__all__ = ["ProfilerConfig", "profile_model"]
