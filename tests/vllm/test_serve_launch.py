"""What `duocal serve MODEL --engine vllm` hands to vLLM, and what it refuses before vLLM starts (no engine here)."""

import json

import pytest

from duocal.serving.vllm_launch import SHARED_PREFIX_SCHEDULER, VllmServe, vllm_launch

from helpers.vllm_engines import PROFILE, profile_of_another_model

NAME = "smollm2-135m-instruct"


def test_the_command_line_carries_the_name_the_plan_and_vllms_own_options(model_folder):
    launch = vllm_launch(VllmServe(NAME, sparsity=0.75, kv_memory="2GiB", port=9123,
                                   vllm_args=("--max-model-len", "8192")))  # fmt: skip
    argv = launch.argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(model_folder)
    assert argv[argv.index("--served-model-name") + 1] == NAME
    assert argv[argv.index("--port") + 1] == "9123"
    assert argv[-2:] == ["--max-model-len", "8192"]
    overrides = json.loads(argv[argv.index("--hf-overrides") + 1])
    assert overrides == {"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": str(PROFILE),
                         "duocal_sparsity": 0.75}  # fmt: skip
    assert launch.env == {"VLLM_CPU_KVCACHE_SPACE": "2"}


def test_a_budget_is_passed_and_planned_before_the_start(model_folder):
    launch = vllm_launch(VllmServe(NAME, budget="100MiB"))
    assert json.loads(launch.argv[launch.argv.index("--hf-overrides") + 1])["duocal_budget"] == "100MiB"
    with pytest.raises(ValueError, match="impossible budget"):
        vllm_launch(VllmServe(NAME, budget="1MiB"))
    with pytest.raises(ValueError, match="not sparsity and budget"):
        vllm_launch(VllmServe(NAME, sparsity=0.5, budget="100MiB"))


def test_a_profile_of_another_model_is_refused_before_vllm_starts(model_folder, tmp_path):
    wrong = profile_of_another_model(tmp_path)
    with pytest.raises(ValueError, match=r"profile is for 28 layers x 3 KV heads .*has 30 layers x 3 KV heads"):
        vllm_launch(VllmServe(NAME, profile=str(wrong)))


def with_architectures(model_folder, folder, architectures):
    folder.mkdir()
    config = json.loads((model_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": architectures}))
    for weights in model_folder.glob("*.safetensors"):
        (folder / weights.name).symlink_to(weights)
    return folder


@pytest.mark.parametrize("architectures", [["GemmaForCausalLM"], ["GPTNeoXForCausalLM"], [],
                                           ["LlamaForCausalLM", "MistralForCausalLM"]])  # fmt: skip
def test_a_model_the_plugin_cannot_run_is_refused_naming_the_families_it_runs(model_folder, tmp_path, architectures):
    folder = with_architectures(model_folder, tmp_path / "other", architectures)
    with pytest.raises(ValueError, match="duocal on vLLM runs LlamaForCausalLM, MistralForCausalLM, "
                                         "Qwen2ForCausalLM, Qwen3ForCausalLM models") as refused:  # fmt: skip
        vllm_launch(VllmServe(str(folder), profile=str(PROFILE)))
    assert (", ".join(architectures) or "model without architectures") in str(refused.value)


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Qwen2", "Qwen3"])
def test_each_family_is_served_by_its_duocal_class(model_folder, tmp_path, family):
    """The plan needs the model's shape only, so SmolLM2's config under each family's name plans the same."""
    folder = with_architectures(model_folder, tmp_path / family, [f"{family}ForCausalLM"])
    launch = vllm_launch(VllmServe(str(folder), profile=str(PROFILE), sparsity=0.5))
    overrides = json.loads(launch.argv[launch.argv.index("--hf-overrides") + 1])
    assert overrides["architectures"] == [f"Duo{family}ForCausalLM"]


def value_of(argv: list[str], option: str) -> str | None:
    return argv[argv.index(option) + 1] if option in argv else None


def test_a_plan_with_streaming_heads_keeps_every_blocks_hash_unless_the_user_says_otherwise(model_folder):
    """vLLM's default retention (0) hashes only the window before each prompt's end: a document's second question
    would find no window to resume from (tests/vllm/test_sink_window_hits.py)."""
    retention = "--prefix-cache-retention-interval"
    assert value_of(vllm_launch(VllmServe(NAME, sparsity=0.5)).argv, retention) == "None"
    assert value_of(vllm_launch(VllmServe(NAME, sparsity=0)).argv, retention) is None  # all full: vLLM's default
    given = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--prefix_cache_retention_interval=1024",))).argv
    assert retention not in given and given[-1] == "--prefix_cache_retention_interval=1024"


def test_answers_say_how_many_prompt_tokens_came_from_the_prefix_cache(model_folder):
    assert "--enable-prompt-tokens-details" in vllm_launch(VllmServe(NAME)).argv
    off = vllm_launch(VllmServe(NAME, vllm_args=("--no-enable-prompt-tokens-details",))).argv
    assert "--enable-prompt-tokens-details" not in off


def test_a_plan_with_streaming_heads_runs_duocals_scheduler_unless_the_user_names_one(model_folder):
    scheduler = "--scheduler-cls"
    assert value_of(vllm_launch(VllmServe(NAME, sparsity=0.5)).argv, scheduler) == SHARED_PREFIX_SCHEDULER
    assert value_of(vllm_launch(VllmServe(NAME, sparsity=0)).argv, scheduler) is None  # all full: vLLM's own
    mine = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--scheduler-cls", "my.Scheduler"))).argv
    assert mine.count(scheduler) == 1 and mine[-1] == "my.Scheduler"
