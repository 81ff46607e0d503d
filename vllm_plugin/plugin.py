"""The ``vllm.general_plugins`` entry point: registers duocal's model class and KV cache spec.

vLLM calls `register()` in every process it starts (engine core and workers), before it builds
models or KV cache managers.
"""

from __future__ import annotations

ARCHITECTURES = {"DuoLlamaForCausalLM": "duocal_vllm.llama:DuoLlamaForCausalLM"}


def register() -> None:
    """Register the model classes (lazily, by name) and the sink + window KV cache spec."""
    from vllm import ModelRegistry

    from . import sink_window_spec

    for name, where in ARCHITECTURES.items():
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, where)
    sink_window_spec.register_spec()
