"""`duocal serve --engine vllm` picks a block size with which every streaming head runs vLLM's kernel (its sink a
whole number of blocks), unless the user gives one (no engine here)."""

from duocal.serving.vllm_launch import VllmServe, vllm_launch
from duocal_vllm.head_plan import HeadSpec, kernel_block_size

NAME = "smollm2-135m-instruct"


def block_size_in(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--block-size"]


def test_the_shipped_profile_gets_blocks_of_its_sink_before_the_users_options(model_folder):
    argv = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--max-model-len", "8192"))).argv
    assert block_size_in(argv) == ["64"]  # sink 64, recent 512
    assert argv[-2:] == ["--max-model-len", "8192"]


def test_the_users_block_size_wins_and_an_all_full_plan_keeps_vllms_default(model_folder):
    argv = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--block-size=128",))).argv
    assert block_size_in(argv) == [] and argv[-1] == "--block-size=128"
    assert block_size_in(vllm_launch(VllmServe(NAME, sparsity=0.0)).argv) == []


def test_the_kernel_block_size_fits_every_streaming_head():
    full = HeadSpec(0)
    assert kernel_block_size([[full, full]]) is None
    assert kernel_block_size([[full, HeadSpec(1, 128, 512)]]) == 128
    assert kernel_block_size([[HeadSpec(0, 128, 512)], [HeadSpec(0, 64, 512)]]) == 64
    assert kernel_block_size([[HeadSpec(0, 96, 512), HeadSpec(1, 64, 512)]]) == 32
    assert kernel_block_size([[HeadSpec(0, 32, 128)], [HeadSpec(0, 64, 16)]]) is None  # a window under 32
