"""Runs one vLLM engine (in this process) on token-id prompts and prints the greedy tokens as JSON.

Used by the tests in a subprocess each, so that every engine starts clean:

    python tests/vllm/run_vllm.py '{"prompts": [[1, 2, 3]], "max_tokens": 16, "hf_overrides": {...}}'

Prints one line ``RESULT {"tokens": [[...], ...]}``. float32, eager mode, no prefix caching.
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
        enable_prefix_caching=False,
        hf_overrides=spec.get("hf_overrides"),
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=spec["max_tokens"]), use_tqdm=False)
    print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs]}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
