"""`duocal serve`'s start-up, before any weights load: a `--kv-memory` that holds no request of the
model's context is refused with the smallest size that does; the plan is made once, for the dtype the
weights then load in; sparsity is checked once, by the plan's owner, and the CLI names its options."""

import re

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.models import ModelRef
from duocal.serving.startup import ServeSettings, prepare_server, saved_dtype
from duocal_runtime.paged.paged_cache import DuoPagedCache, pool_summary
from duocal_runtime.paged.pool_size import plain_block_bytes, pool_blocks, pool_config
from duocal_runtime.paged.quantized_pages import page_size_for


class WeightsLoaded(Exception):
    """Raised by the patched weight loader: reaching it means every start-up check passed."""


@pytest.fixture
def no_weights(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise WeightsLoaded(self.arg)

    monkeypatch.setattr(ModelRef, "load_model", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def requests_held(model: str | None, kv_bytes: int) -> int:
    """Requests of the model's context a `kv_bytes` pool holds under its shipped profile (pool built on meta)."""
    ref = ModelRef.resolve(model, offline=True)
    config = ref.load_config()
    dtype, plan = saved_dtype(config), dr.plan(dr.load_profile(ref.default_profile))
    page, context = page_size_for(plan), config.max_position_embeddings
    rep = plan.shape.num_attention_heads // plan.shape.num_key_value_heads
    try:
        cache = DuoPagedCache(
            plan, config, pool_config(page, pool_blocks(kv_bytes, plan.shape, dtype, page)), "meta", dtype, rep
        )
    except ValueError as err:
        assert "holds no sector" in str(err)
        return 0
    return pool_summary(cache, context, page)["requests"]


def smallest_named(message: str) -> tuple[int, str]:
    found = re.search(r"smallest pool that holds one is [^(]*\(([\d,]+) bytes\): give --kv-memory (\d+MiB)", message)
    assert found, message
    return int(found.group(1).replace(",", "")), found.group(2)


@pytest.mark.parametrize("model, kv_memory", [(None, "1B"), (None, "2MiB"), ("smollm2-135m-instruct", "64MiB")])
def test_a_kv_memory_that_holds_no_request_is_refused_before_the_weights_load(model, kv_memory, no_weights):
    with pytest.raises(ValueError, match=f"--kv-memory {kv_memory} holds no request of") as refused:
        prepare_server(ServeSettings(model=model, kv_memory=kv_memory))
    smallest, suggested = smallest_named(str(refused.value))
    ref = ModelRef.resolve(model, offline=True)
    shape, dtype = dr.shape_of_config(ref.load_config()), saved_dtype(ref.load_config())
    block = plain_block_bytes(shape, dtype, page_size_for(dr.plan(dr.load_profile(ref.default_profile))))
    assert requests_held(model, smallest) >= 1  # the size it names is enough ...
    assert requests_held(model, smallest - block) == 0  # ... and the least: one block fewer holds none
    with pytest.raises(WeightsLoaded):  # the suggested option passes every check
        prepare_server(ServeSettings(model=model, kv_memory=suggested))


def test_the_cli_refuses_a_kv_memory_too_small_with_the_size_to_give(no_weights):
    result = CliRunner().invoke(app, ["serve", "--kv-memory", "1B", "--port", "0"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: --kv-memory 1B holds no request of 4096 tokens"), result.output
    smallest, suggested = smallest_named(result.output)
    assert requests_held(None, smallest) == 1 and suggested == f"{-(-smallest // 2**20)}MiB"


def test_num_blocks_is_taken_as_given(no_weights):
    """--num-blocks is transformers' own count: a small pool for short requests stays allowed."""
    with pytest.raises(WeightsLoaded):
        prepare_server(ServeSettings(num_blocks=8))


def test_the_plan_is_made_once_for_the_dtype_the_weights_load_in(monkeypatch):
    made, loaded = [], []
    real_plan, real_load = dr.plan, ModelRef.load_model

    def counted_plan(*args, **kwargs):
        made.append(kwargs["dtype"])
        return real_plan(*args, **kwargs)

    def recorded_load(self, dtype=None):
        loaded.append(dtype)
        return real_load(self, dtype)

    monkeypatch.setattr(dr, "plan", counted_plan)
    monkeypatch.setattr(ModelRef, "load_model", recorded_load)
    served, summary = prepare_server(ServeSettings(sparsity=0.5, num_blocks=64, max_batch_tokens=256))
    try:
        assert made == [torch.float32] and loaded == [torch.float32]  # the demo model's saved dtype
        assert served.runtime.model.dtype == torch.float32 and served.runtime.plan.sparsity == 0.5
        assert summary["kv_bytes"] > 0
    finally:
        served.manager.stop(block=True, hard_stop=True)
        served.runtime.remove()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sparsity", "0.5", "--budget", "1MiB"], "error: give --sparsity or --budget, not both"),
        (["--sparsity", "1.5"], "error: sparsity must be in [0, 1], got 1.5"),
    ],
)
def test_sparsity_is_checked_by_the_plans_owner_before_the_model_is_resolved(args, message, monkeypatch):
    monkeypatch.setattr(ModelRef, "resolve", lambda *a, **k: pytest.fail("the model was resolved before the check"))
    result = CliRunner().invoke(app, ["serve", *args, "--port", "0"])
    assert result.exit_code == 1 and result.output.startswith(message), result.output


def test_the_plan_names_arguments_that_exclude_each_other():
    profile = dr.load_profile(ModelRef.resolve(None).default_profile)
    with pytest.raises(dr.PlanError, match="not sparsity and budget") as refused:
        dr.plan(profile, sparsity=0.5, budget="1MiB", context=64)
    assert refused.value.names == ("sparsity", "budget")
    with pytest.raises(dr.PlanError, match="not sparsity and budget"):
        prepare_server(ServeSettings(sparsity=0.5, budget="1MiB"))
