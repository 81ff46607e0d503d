"""duocal_vllm: run a duocal plan (full + sink_window KV heads) inside stock vLLM (CPU), as a plugin.

Installed with the project; vLLM finds it through the ``vllm.general_plugins`` entry point (plugin.py),
which registers ``DuoLlamaForCausalLM`` and the sink + window KV cache spec. Select it with
``hf_overrides={"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": PATH, "duocal_sparsity": 0.5}``
(head_plan.py lists every setting). Nothing here imports transformers' 5.24-only code.
"""
