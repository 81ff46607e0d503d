"""Training-free head profiling: per-head scores and kept-attention measurements from a model's own
attention (`duocal profile`), written as a profile with measurements for mixed plans under a budget."""

from duocal.profiling.profiler import PROFILER_SEED, ProfilerConfig, profile_model, with_measurements

__all__ = ["PROFILER_SEED", "ProfilerConfig", "profile_model", "with_measurements"]
