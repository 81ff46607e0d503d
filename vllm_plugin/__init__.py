"""duocal_vllm: run a duocal plan (full + sink_window KV heads) inside stock vLLM (CPU), as a plugin.

Installed with the project; vLLM finds it through the ``vllm.general_plugins`` entry point (plugin.py), which
checks vLLM's version and registers duocal's model class of each family (``DuoLlamaForCausalLM``,
``DuoMistralForCausalLM``, ``DuoQwen2ForCausalLM``, ``DuoQwen3ForCausalLM``: models.py) and the sink + recent KV
cache spec. Select one with ``hf_overrides={"architectures": ["DuoQwen2ForCausalLM"], "duocal_profile": PATH,
"duocal_sparsity": 0.5}`` (head_plan.py lists every setting; ``duocal serve --engine vllm`` picks the class from
the model's architecture). Nothing here imports transformers' 5.24-only code.
"""
