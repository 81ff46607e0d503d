"""What vLLM reserves for a request under a duocal plan: the per-request chunk cap that `duocal serve --engine
vllm` sets, the sink + window spec's admission with it, and the refusal of a KV space too small for a request
alone in the engine. vLLM's own capacity arithmetic (`get_kv_cache_configs`, `get_kv_cache_capacity`) on the
specs the model reports (`DuoLlamaForCausalLM`, or vLLM's own Llama when all heads are full, built on the meta
device); no engine starts here (tests/vllm/test_serve_vllm.py reads the same figure from a running server's log)."""

import json
import os
import socket

import pytest
import torch
from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_kv_cache_configs
from vllm.v1.worker.utils import customize_attention_spec

from duocal.serving.vllm_launch import VllmServe, vllm_launch
from duocal_vllm.group_fit import fitted_streaming_count, group_slots, vllm_head_table
from duocal_vllm.head_plan import DuoVllmError
from duocal_vllm.sink_window_spec import check_lone_request_fits

from helpers.vllm_engines import PROFILE, duo_overrides

NAME = "smollm2-135m-instruct"
GiB = 2**30


def threshold_of(argv: list[str]) -> str | None:
    name = "--long-prefill-token-threshold"
    return argv[argv.index(name) + 1] if name in argv else None


def test_serve_caps_each_requests_chunk_at_the_recent_size_when_the_plan_streams(model_folder):
    assert threshold_of(vllm_launch(VllmServe(NAME, sparsity=0.5)).argv) == "512"
    assert threshold_of(vllm_launch(VllmServe(NAME, sparsity=0)).argv) is None  # all full: stock behaviour
    given = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--long-prefill-token-threshold=2048",))).argv
    assert given.count("--long-prefill-token-threshold=2048") == 1 and threshold_of(given) is None
    short = vllm_launch(VllmServe(NAME, sparsity=0.5, vllm_args=("--max-model-len", "256"))).argv
    assert threshold_of(short) == "256"  # vLLM refuses a threshold above max_model_len


def engine_config(model_folder, sparsity: float, threshold: int, **engine):
    args = EngineArgs(model=str(model_folder), dtype="float32", hf_overrides=duo_overrides(duocal_sparsity=sparsity),
                      long_prefill_token_threshold=threshold, **engine)  # fmt: skip
    vllm_config = args.create_engine_config()
    vllm_config.cache_config.kv_cache_layout = CPUAttentionBackend.supported_kv_cache_layouts()[0].name  # the engine's
    return vllm_config


@pytest.fixture(scope="module", autouse=True)
def one_rank(model_folder):
    """vLLM's distributed state for one rank in this process, which a model builds its layers against."""
    with set_current_vllm_config(engine_config(model_folder, 0, threshold=0)):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                                     local_rank=0, backend="gloo")  # fmt: skip
        ensure_model_parallel_initialized(1, 1)
    yield
    cleanup_dist_env_and_memory()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def layer_specs(vllm_config) -> dict:
    """The KV cache spec of every layer that holds a cache, as the model vLLM builds for `vllm_config` reports
    them (vLLM's model runner asks the same): `DuoLlamaForCausalLM`'s one-head cache layers under a plan,
    vLLM's own attention layers when all heads are full. Built on the meta device: no weights, no memory."""
    with set_current_vllm_config(vllm_config), torch.device("meta"):
        initialize_model(vllm_config=vllm_config)
    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    return {
        name: customize_attention_spec(layer.get_attn_backend(), layer.get_kv_cache_spec(vllm_config))
        for name, layer in layers.items()
        if not layer.kv_sharing_target_layer_name  # a call over heads whose caches are its heads' cache layers
    }


def kv_tokens(vllm_config, space: int = GiB) -> int:
    kv_config = get_kv_cache_configs(vllm_config, [layer_specs(vllm_config)], [space])[0]
    return get_kv_cache_capacity(vllm_config, kv_config)[0]


@pytest.mark.parametrize(("sparsity", "target"), [(0.5, 1.7), (0.75, 2.6)])
def test_at_the_default_batch_budget_a_plan_holds_the_issues_multiple_of_stock(model_folder, sparsity, target):
    capped = engine_config(model_folder, sparsity, threshold=512)
    stock = kv_tokens(engine_config(model_folder, 0, threshold=0))
    assert capped.scheduler_config.max_num_batched_tokens >= 2048  # vLLM-CPU's default, not lowered here
    ratio = kv_tokens(capped) / stock
    uncapped = kv_tokens(engine_config(model_folder, sparsity, threshold=0)) / stock
    print(f"sparsity {sparsity}: {ratio:.2f}x stock with the chunk cap, {uncapped:.2f}x without")
    assert ratio >= target
    assert uncapped < ratio  # without the cap a streaming head is reserved a whole in-flight batch


def test_a_kv_space_too_small_for_a_request_alone_is_refused(model_folder):
    capped = engine_config(model_folder, 0.5, threshold=512)
    table = vllm_head_table(capped.model_config.hf_config, capped)
    capped.cache_config.kv_cache_memory_bytes = GiB
    check_lone_request_fits(table, capped, 64, torch.float32)  # 1 GiB holds several
    space = 225 * 2**20  # 3,600 blocks: vLLM admits a request at max_model_len (3,330 blocks under the cap)...
    get_kv_cache_configs(capped, [layer_specs(capped)], [space])
    capped.cache_config.kv_cache_memory_bytes = space  # ...but alone it may hold 3,870 (2,048-token chunks)
    with pytest.raises(DuoVllmError, match="too small for one request of max_model_len 8192 alone in the engine"):
        check_lone_request_fits(table, capped, 64, torch.float32)


def test_vllms_groups_pad_the_larger_head_count_and_the_plugin_makes_the_fewest_heads_full_to_avoid_it():
    assert group_slots(22, 68) == (22, 88)  # 4 groups of 22: 20 padding layers
    assert group_slots(45, 45) == (45, 45) and group_slots(12, 13) == (13, 13) and group_slots(0, 90) == (0, 90)
    assert fitted_streaming_count(22, 68, full_blocks=64, streaming_blocks=10) == 67  # 23 + 67: 3 groups of 23
    assert fitted_streaming_count(45, 45, full_blocks=64, streaming_blocks=10) == 45
    assert fitted_streaming_count(30, 60, full_blocks=64, streaming_blocks=10) == 60
    # a streaming head reserved as much as a full one (max_model_len 2048, no chunk cap): the plan stays as it is
    assert fitted_streaming_count(0, 90, full_blocks=16, streaming_blocks=17) == 90
    assert fitted_streaming_count(45, 45, full_blocks=16, streaming_blocks=17) == 45


def test_the_table_vllm_runs_at_075_moves_the_best_scored_streaming_head_to_full(model_folder):
    from duocal_vllm.head_plan import load_head_table

    vllm_config = engine_config(model_folder, 0.75, threshold=512)
    planned = load_head_table(vllm_config.model_config.hf_config, 128, dtype=torch.float32)
    fitted = vllm_head_table(vllm_config.model_config.hf_config, vllm_config)
    pairs = enumerate(zip(planned, fitted, strict=True))
    moved = [(layer, a.kv_head) for layer, (old, new) in pairs for a, b in zip(old, new, strict=True) if a != b]
    assert len(moved) == 1 and all(not planned[i][h].is_full and fitted[i][h].is_full for i, h in moved)


def test_an_engine_process_plans_once_for_the_model_and_the_log_and_again_for_a_rewritten_profile(
    model_folder, tmp_path, monkeypatch
):
    import duocal_vllm.group_fit as G

    calls = []
    planned = G.make_plan
    monkeypatch.setattr(G, "make_plan", lambda *a, **k: calls.append(1) or planned(*a, **k))
    monkeypatch.setattr(G, "PLANNED", {})
    vllm_config = engine_config(model_folder, 0.5, threshold=512)
    config = vllm_config.model_config.hf_config
    profile = tmp_path / "profile.json"
    profile.write_text(PROFILE.read_text())
    config.duocal_profile = str(profile)
    first = G.vllm_head_table(config, vllm_config)
    assert G.vllm_head_table(config, vllm_config) == first and len(calls) == 1
    data = json.loads(profile.read_text())
    data["scores"] = [[1.0 - s for s in row] for row in data["scores"]]  # the other heads stream at 0.5
    profile.write_text(json.dumps(data))
    os.utime(profile, ns=(1, 1))  # a new version even within the file system's clock tick
    assert G.vllm_head_table(config, vllm_config) != first and len(calls) == 2
