"""Streaming heads on vLLM's own kernel in a real engine (SmolLM2-135M-Instruct, fp32): with a block size that
divides the sink, the shipped profile at 0.5 and every head streaming with a small window give duocal's runtime
tokens (data/reference_tokens.json), prompts chunked across prefill steps, and the slow gather is not used."""

from helpers.vllm_engines import duo_overrides, run_vllm

GATHER_LINE = "run a per-request PyTorch gather"


def test_the_shipped_profile_on_the_kernel_gives_duocal_runtime_tokens(model_folder, reference):
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    overrides = duo_overrides(duocal_sparsity=reference["sparsity"])  # sink 64, recent 512
    duo, log = run_vllm(model_folder, prompts, overrides, block_size=64, max_num_batched_tokens=256)
    assert duo is not None, log[-3000:]
    assert GATHER_LINE not in log
    assert duo == [case["duo"] for case in reference["cases"]]


def test_every_head_streaming_on_the_kernel_gives_duocal_runtime_tokens(model_folder, reference):
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    small = {f"duocal_{k}": v for k, v in reference["small"].items()}  # sink 32, recent 128
    duo, log = run_vllm(model_folder, prompts, duo_overrides(duocal_sparsity=1.0, **small), block_size=32)
    assert duo is not None, log[-3000:]
    assert GATHER_LINE not in log
    assert duo == [case["duo_small"] for case in reference["cases"]]


def test_a_sink_that_is_not_whole_blocks_says_which_block_sizes_use_the_kernel(model_folder, reference):
    prompts = [reference["cases"][2]["prompt_ids"]]
    duo, log = run_vllm(model_folder, prompts, duo_overrides(duocal_sparsity=reference["sparsity"]), max_tokens=4)
    assert duo == [reference["cases"][2]["duo"][:4]], log[-3000:]
    assert f"sink 64 / recent 512 at block size 128 {GATHER_LINE}" in log
    assert "--block-size 64" in log
