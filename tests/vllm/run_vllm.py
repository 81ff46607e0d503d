"""Runs one vLLM engine (in this process) on token-id prompts and prints the greedy tokens as JSON.

Used by the tests in a subprocess each, so that every engine starts clean:

    python tests/vllm/run_vllm.py '{"prompts": [[1, 2, 3]], "max_tokens": 16, "hf_overrides": {...}}'

Prints one line ``RESULT {"tokens": [[...], ...], "cached": [prompt tokens read from the prefix cache, ...]}``.
float32, eager mode, prefix caching only with ``"enable_prefix_caching": true``. Prompts run one after
another, so that a repeated prompt can hit the cache of an earlier one.
"""

import json
import os
import sys

MODEL = os.environ.get("DUOCAL_VLLM_MODEL", "")


def main(spec: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec.get("model", MODEL),
        dtype="float32",
        enforce_eager=True,
        max_model_len=spec.get("max_model_len", 2048),
        max_num_seqs=4,
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 2048),
        enable_prefix_caching=spec.get("enable_prefix_caching", False),
        block_size=spec.get("block_size"),
        hf_overrides=spec.get("hf_overrides"),
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"])
    outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps({"tokens": tokens, "cached": [o.num_cached_tokens for o in outs]}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
