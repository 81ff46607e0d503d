"""duocal plans under vLLM tensor parallelism: which KV heads, with which policies, each rank builds (no engine),
plans balanced for vLLM's size, unbalanced plans refused naming layers, and real engines on 2 ranks.

SmolLM2's 3 KV heads do not split over 2 ranks, so the engines run a random-weight Llama of 4 layers x 4 KV heads
(8 query heads, head_dim 32) with SmolLM2's tokenizer: tensor parallel size 2 (vLLM's "mp" executor, one core
per rank) against size 1, fp32, greedy, prompts of 400-1,000 tokens that cross sink 64 + recent 256."""

import random
import shutil
from types import SimpleNamespace

import pytest
import torch

import duocal_runtime as dr
from duocal.serving.vllm_launch import VllmServe, vllm_launch
from duocal_runtime.planning.tensor_parallel import shards, unbalanced_layers
from duocal_vllm.group_fit import group_slots, vllm_head_table
from duocal_vllm.head_plan import SETTINGS, DuoVllmError, HeadSpec, check_balanced, load_head_table
from duocal_vllm.plugin import kv_tokens_line, stock_kv_tokens
from duocal_vllm.rank_heads import rank_table

from helpers.vllm_engines import PROFILE, SMOLLM2, kv_cache_tokens, run_engines

TINY = dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32, hidden_size=256)
# plain plan at 0.5: layers 0 and 3 keep both rank 0 heads full (unbalanced); balanced: one full head per rank
SCORES = [[0.95, 0.9, 0.1, 0.05], [0.2, 0.85, 0.8, 0.15], [0.7, 0.3, 0.75, 0.25], [0.6, 0.65, 0.35, 0.4]]
BALANCED_FULL = [{0, 2}, {1, 2}, {0, 2}, {1, 3}]
SIZES = {"duocal_sparsity": 0.5, "duocal_sink": 64, "duocal_recent": 256}
PROMPT_LENGTHS = (400, 700, 1000)
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}  # one CPU list per rank


def vllm_config(tp_size: int, max_model_len: int = 2048, block_size: int = 64):
    """The parts of a VllmConfig that planning reads."""
    scheduler = SimpleNamespace(long_prefill_token_threshold=256, long_prefill_token_threshold_adaptive=False,
                                max_num_batched_tokens=512)  # fmt: skip
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block_size),
        model_config=SimpleNamespace(max_model_len=max_model_len, dtype=torch.float32),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp_size),
        scheduler_config=scheduler,
        max_concurrent_batches=1,
        max_in_flight_tokens=512,
    )


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    shape = dr.ModelShape(4, 8, 4, 32)
    profile = dr.Profile(dr.ModelInfo(shape, "tiny-tp"), SCORES)
    return dr.save_profile(profile, tmp_path_factory.mktemp("tp-profile") / "tiny.json")


def tiny_config(profile, **settings):
    return SimpleNamespace(**TINY, duocal_profile=str(profile), **settings)


@pytest.fixture(autouse=True)
def no_duocal_environment(monkeypatch):
    """Planning reads DUOCAL_* settings from the environment too: these tests give theirs in the config."""
    for name in SETTINGS:
        monkeypatch.delenv(f"DUOCAL_{name.upper()}", raising=False)


def test_each_rank_builds_its_own_kv_heads_with_the_plans_policies(tiny_profile):
    table = vllm_head_table(tiny_config(tiny_profile, **SIZES), vllm_config(2))
    assert [{s.kv_head for s in row if s.is_full} for row in table] == BALANCED_FULL
    ranks = [rank_table(table, 2, rank) for rank in range(2)]
    for rank, mine in enumerate(ranks):
        for layer, row in enumerate(mine):
            assert [s.kv_head for s in row] == list(shards(4, 2)[rank])  # vLLM's contiguous KV shard, in order
            assert [(s.sink, s.recent) for s in row] == [(table[layer][h].sink, table[layer][h].recent)
                                                         for h in shards(4, 2)[rank]]  # fmt: skip
            by_slot = sorted(row, key=lambda s: s.slot)
            assert [s.slot for s in by_slot] == [0, 1] and [s.is_full for s in by_slot] == [True, False]
    assert [s.slot for s in ranks[0][3]] == [1, 0]  # layer 3: rank 0's full head is its second
    with pytest.raises(ValueError, match="rank 2 of tensor parallel size 2"):
        rank_table(table, 2, 2)


def test_an_unbalanced_plan_is_refused_under_tp2_naming_its_layers(tiny_profile):
    plain = vllm_head_table(tiny_config(tiny_profile, duocal_tensor_parallel=1, **SIZES), vllm_config(2))
    assert unbalanced_layers([[s.is_full for s in row] for row in plain], 2) == ["layer 0 (2/0)", "layer 3 (2/0)"]
    message = r"unbalanced for tensor parallel size 2: full KV heads per rank differ in 2 layers: layer 0 \(2/0\), "
    with pytest.raises(DuoVllmError, match=message + r"layer 3 \(2/0\).*leave duocal_tensor_parallel unset"):
        rank_table(plain, 2, 0)
    two_sizes = vllm_head_table(tiny_config(tiny_profile, **SIZES), vllm_config(2))
    two_sizes[0][3] = HeadSpec(3, sink=32, recent=128)  # streaming on both ranks, but not the same sizes
    with pytest.raises(DuoVllmError, match="ranks hold streaming heads of different sink/recent sizes in layers 0;"):
        rank_table(two_sizes, 2, 1)
    with pytest.raises(DuoVllmError, match="a plan for tensor parallel size 2 is made at a sparsity"):
        vllm_head_table(tiny_config(tiny_profile, duocal_budget="1MiB"), vllm_config(2))


def test_group_fitting_under_tensor_parallel_keeps_every_rank_balanced():
    """SmolLM2's profile at 0.25 on 3 ranks: 23 full + 7 streaming heads per rank pad to 28 + 7 layers in vLLM's
    groups (5 padding layers of full size); the fit makes the best streaming heads full, one per rank: 24 + 6."""
    config = SimpleNamespace(**SMOLLM2, duocal_profile=str(PROFILE), duocal_sparsity=0.25)
    unfitted = load_head_table(SimpleNamespace(**vars(config), duocal_tensor_parallel=3), 64, environ={})
    table = vllm_head_table(config, vllm_config(3, max_model_len=8192))
    check_balanced(table, 3)
    before, after = (sum(not s.is_full for row in t for s in row) for t in (unfitted, table))
    assert (before, after) == (21, 18)
    assert [sum(group_slots(30 - n // 3, n // 3)) - 30 for n in (before, after)] == [5, 0]  # padding layers per rank
    full_before = {(layer, s.kv_head) for layer, row in enumerate(unfitted) for s in row if s.is_full}
    assert full_before < {(layer, s.kv_head) for layer, row in enumerate(table) for s in row if s.is_full}


def test_the_kv_tokens_line_compares_with_stock_vllm_on_one_rank(tiny_profile):
    """Under tensor parallelism the KV space is per rank: stock vLLM holds 1 GiB / (4 layers x 2 x 2 KV heads x 32 x
    4 bytes) = 524,288 tokens per rank (its own start-up line with this model on 2 ranks, max_model_len 2048)."""
    config = SimpleNamespace(**tiny_config(tiny_profile, **SIZES).__dict__, architectures=["DuoLlamaForCausalLM"])
    engine = vllm_config(2)
    engine.model_config.hf_config = config
    engine.cache_config.__dict__.update(kv_cache_size_tokens=786_432, kv_cache_memory_bytes=2**30, cache_dtype="auto")
    assert "= 1.50x the 524,288 tokens stock vLLM holds in the same 1 GiB" in kv_tokens_line(engine)
    assert stock_kv_tokens(2**30, 4, 2, 32, 4, 64, 2048) == 524_288
    engine.parallel_config.tensor_parallel_size = 8  # more ranks than KV heads: vLLM gives each rank one, replicated
    engine.model_config.hf_config.duocal_sparsity = 0  # all full: vLLM's own model, which replicates KV heads
    assert all(s.is_full for row in vllm_head_table(config, engine) for s in row)
    assert "the 1,048,576 tokens stock vLLM holds" in kv_tokens_line(engine)


def test_serve_plans_for_the_tensor_parallel_size_it_passes_to_vllm(model_folder):
    import json

    launch = vllm_launch(VllmServe("smollm2-135m-instruct", sparsity=0.5, vllm_args=("--tensor-parallel-size", "3")))
    overrides = json.loads(launch.argv[launch.argv.index("--hf-overrides") + 1])
    assert overrides["duocal_tensor_parallel"] == 3
    assert launch.argv[-2:] == ["--tensor-parallel-size", "3"]
    with pytest.raises(ValueError, match="tensor parallel size 2 does not divide the model's 3 KV heads"):
        vllm_launch(VllmServe("smollm2-135m-instruct", sparsity=0.5, vllm_args=("-tp", "2")))
    with pytest.raises(ValueError, match="argument --tensor-parallel-size/-tp: invalid int value: 'two'"):
        vllm_launch(VllmServe("smollm2-135m-instruct", vllm_args=("--tensor-parallel-size=two",)))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, model_folder):
    """The random-weight Llama of TINY, saved with SmolLM2's tokenizer."""
    import transformers

    folder = tmp_path_factory.mktemp("tiny-tp") / "model"
    config = transformers.LlamaConfig(vocab_size=49152, intermediate_size=512, max_position_embeddings=4096,
                                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                                      initializer_range=0.05, **TINY)  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_folder / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def tp_runs(tiny_model, tiny_profile):
    """Engines on 2 ranks in one subprocess, engines on 1 rank in another: {name: EngineRun}."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 49000) for _ in range(n)] for n in PROMPT_LENGTHS]
    duo = {"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": str(tiny_profile)}
    common = {"prompts": prompts, "block_size": 64}
    two = run_engines(tiny_model, [
        {"name": "all_full_tp2", "tensor_parallel_size": 2, "hf_overrides": {**duo, "duocal_sparsity": 0}, **common},
        {"name": "mixed_tp2", "tensor_parallel_size": 2, "hf_overrides": {**duo, **SIZES}, **common},
    ], env=TP2_ENV)  # fmt: skip
    one = run_engines(tiny_model, [
        {"name": "stock_tp1", **common},
        {"name": "mixed_tp1", "hf_overrides": {**duo, **SIZES, "duocal_tensor_parallel": 2}, **common},
    ])  # fmt: skip
    return {**two, **one}


def test_a_mixed_plan_on_two_ranks_gives_the_tokens_of_one_rank(tp_runs):
    tp2, tp1 = tp_runs["mixed_tp2"], tp_runs["mixed_tp1"]
    assert tp2.tokens is not None, tp2.log[-4000:]
    assert tp1.tokens is not None, tp1.log[-4000:]
    assert "world_size=2 rank=1" in tp2.log
    assert tp2.tokens == tp1.tokens
    assert tp2.tokens != tp_runs["all_full_tp2"].tokens  # streaming heads evicted: the plan changes the answers
    assert kv_cache_tokens(tp2.log) > kv_cache_tokens(tp_runs["all_full_tp2"].log)


def test_an_all_full_plan_on_two_ranks_gives_stock_vllm_tokens(tp_runs):
    duo, stock = tp_runs["all_full_tp2"], tp_runs["stock_tp1"]
    assert duo.tokens is not None, duo.log[-4000:]
    assert stock.tokens is not None, stock.log[-4000:]
    assert duo.tokens == stock.tokens
    assert kv_cache_tokens(duo.log) == stock_kv_tokens(2**30, 4, 2, 32, 4, 64, 2048)  # one rank's 2 KV heads in 1 GiB
