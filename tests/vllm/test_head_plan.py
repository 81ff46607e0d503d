"""The plugin's plan table without an engine: settings from the config over the environment, the table
vLLM runs, refusals; and the CPU kernel's page layout that streaming heads read."""

from types import SimpleNamespace

import pytest
import torch

from duocal_vllm.head_plan import (
    DuoVllmError,
    check_balanced,
    check_streaming_heads_run_here,
    load_head_table,
    settings_of,
)
from duocal_vllm.sink_window_backend import page_layout

from helpers.vllm_engines import PROFILE, SMOLLM2


def config(**settings):
    return SimpleNamespace(**SMOLLM2, **{f"duocal_{k}": v for k, v in settings.items()})


def test_config_settings_win_over_the_environment():
    env = {"DUOCAL_PROFILE": "from-env", "DUOCAL_SPARSITY": "0.25", "DUOCAL_SINK": "32"}
    assert settings_of(config(profile="from-config", sparsity=0.5), env) == {
        "profile": "from-config",
        "sparsity": "0.5",
        "sink": "32",
    }


def test_the_shipped_profile_at_half_sparsity_is_45_full_and_45_sink_window_heads():
    table = load_head_table(config(profile=str(PROFILE), sparsity=0.5), 128, environ={})
    heads = [spec for row in table for spec in row]
    assert sum(spec.is_full for spec in heads) == 45
    assert {(spec.sink, spec.recent) for spec in heads if not spec.is_full} == {(64, 512)}
    assert [spec.kv_head for spec in table[7]] == [0, 1, 2]


def test_sparsity_zero_is_all_full_and_sizes_can_be_changed():
    assert all(s.is_full for row in load_head_table(config(profile=str(PROFILE), sparsity=0), 128, {}) for s in row)
    table = load_head_table(config(profile=str(PROFILE), sparsity=0.5, sink=32, recent=256), 128, {})
    assert {(s.sink, s.recent) for row in table for s in row if not s.is_full} == {(32, 256)}


def test_refusals_say_why():
    with pytest.raises(DuoVllmError, match="no duocal profile"):
        load_head_table(config(), 128, {})
    with pytest.raises(DuoVllmError, match=r"profile is for 30 layers x 3 KV heads.*has 28 layers"):
        load_head_table(SimpleNamespace(**{**SMOLLM2, "num_hidden_layers": 28}, duocal_profile=str(PROFILE)), 128, {})
    with pytest.raises(DuoVllmError, match=r"45 other heads: layer 1 head 0 \(h2o\)"):
        load_head_table(config(profile=str(PROFILE), sparsity=0.5, policy="h2o"), 128, {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_page_layout_is_a_permutation_of_one_page(dtype):
    keys, values = page_layout("vec", 32, 64, dtype)
    both = torch.cat([keys.flatten(), values.flatten()])
    assert sorted(both.tolist()) == list(range(2 * 32 * 64))


def test_tensor_parallel_plans_are_balanced_and_unbalanced_ones_refused():
    table = load_head_table(config(profile=str(PROFILE), sparsity=0.5, tensor_parallel=3), 128, {})
    check_balanced(table, 3)
    assert all(len({spec.is_full for spec in row}) == 1 for row in table)  # 1 KV head per rank: whole layers
    assert sum(spec.is_full for row in table for spec in row) == 45
    plain = load_head_table(config(profile=str(PROFILE), sparsity=0.5), 128, {})
    with pytest.raises(DuoVllmError, match=r"unbalanced for tensor parallel size 3: .* layers: layer \d+ \(.*"
                       r"duocal_tensor_parallel': 3"):  # fmt: skip
        check_balanced(plain, 3)
    with pytest.raises(DuoVllmError, match="tensor parallel size 2 does not divide the model's 3 KV heads"):
        check_balanced(plain, 2)


def test_streaming_heads_are_refused_off_vllm_cpu_with_what_to_do_there():
    mixed = load_head_table(config(profile=str(PROFILE), sparsity=0.5), 128, {})
    with pytest.raises(DuoVllmError, match=r"45 streaming \(sink_window\) heads.*on cuda that path is not built.*"
                       r"DUOCAL_SPARSITY=0.*duocal serve without --engine vllm"):  # fmt: skip
        check_streaming_heads_run_here(mixed, "cuda", is_cpu=False)
    check_streaming_heads_run_here(mixed, "cpu", is_cpu=True)
    all_full = load_head_table(config(profile=str(PROFILE), sparsity=0), 128, {})
    check_streaming_heads_run_here(all_full, "cuda", is_cpu=False)


def test_sink_windows_keep_their_original_positions_on_vllm(tmp_path):
    """vLLM's prefix cache relies on a key depending only on the tokens before it: a profile that deploys
    positions within the cache is planned with original positions here, and a plan that has them is refused."""
    from dataclasses import replace

    import duocal_runtime as dr
    from duocal_vllm.head_plan import head_table

    profile = dr.load_profile(PROFILE)
    streaming = replace(profile, deploy=profile.deploy.with_sizes(dr.SinkWindow(64, 512, positions="cache")))
    saved = dr.save_profile(streaming, tmp_path / "streaming.json")
    table = load_head_table(config(profile=str(saved), sparsity=0.5), 128, {})
    assert {(s.sink, s.recent) for row in table for s in row if not s.is_full} == {(64, 512)}
    with pytest.raises(DuoVllmError, match=r"45 other heads: .*positions within its cache.*positions='original'"):
        head_table(dr.plan(profile, sparsity=0.5, positions="cache"), 128)
