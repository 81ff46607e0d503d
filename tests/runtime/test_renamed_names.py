"""Public names renamed to the glossary's words (docs/contributing/glossary.md) keep their old
spelling for a release: it warns, names the new one, and gives the same answer."""

import runpy
from dataclasses import dataclass

import pytest

import duocal_runtime as dr
from duocal_runtime.attention import ranks as R


def test_a_policys_budget_is_its_capacity_and_warns():
    policy = dr.SinkH2O(4, 60, 64)
    with pytest.warns(DeprecationWarning, match=r"HeadPolicy\.budget is deprecated: use HeadPolicy\.capacity"):
        assert policy.budget == policy.capacity == 128
    assert dr.Full().capacity is None and dr.SinkWindow(8, 24).capacity == 32


def test_the_capacity_constructors_take_the_old_keyword_with_a_warning():
    with pytest.warns(
        DeprecationWarning, match=r"H2O\.halves\(budget=\.\.\.\) is deprecated: use H2O\.halves\(capacity"
    ):
        assert dr.H2O.halves(budget=65) == dr.H2O.halves(65) == dr.H2O(heavy=33, recent=32)
    with pytest.warns(DeprecationWarning, match=r"SnapKV\.keeping\(budget=\.\.\.\) is deprecated"):
        assert dr.SnapKV.keeping(budget=200) == dr.SnapKV.keeping(capacity=200) == dr.SnapKV(selected=168, window=32)
    with pytest.raises(TypeError, match=r"give capacity only \(budget is its deprecated name\), not both"):
        dr.H2O.halves(64, budget=64)
    with pytest.raises(TypeError, match=r"SnapKV\.keeping\(\) needs capacity"):
        dr.SnapKV.keeping()


def test_a_policy_written_with_budget_gets_it_as_its_capacity():
    with pytest.warns(DeprecationWarning, match=r"OldStyle\.budget is deprecated: use OldStyle\.capacity"):

        @dataclass(frozen=True)
        class OldStyle(dr.HeadPolicy):
            name = "old_style"
            recent: int = 8

            @property
            def budget(self) -> int:
                return 1 + self.recent

            def keeps(self, k_rank, real_total, score=None):
                return R.in_sink_or_recent(k_rank, real_total[..., None] - 1, 1, self.recent)

            def make_group(self, kv_heads, rep, max_length=None):
                raise NotImplementedError

    assert OldStyle().capacity == 9 and OldStyle().tokens_kept(100) == 9 and OldStyle().tokens_kept(5) == 5


def test_the_old_deploy_defaults_attribute_is_their_sink_window_and_warns():
    deploy = dr.DeployDefaults(sizes={"sink_window": {"sink": 8, "recent": 40}})
    with pytest.warns(
        DeprecationWarning, match=r"DeployDefaults\.window is deprecated: use DeployDefaults\.sink_window"
    ):
        assert deploy.window == deploy.sink_window == dr.SinkWindow(8, 40)


def test_the_pool_capacity_benchmark_is_the_pool_requests_one_and_warns():
    from duocal_runtime.bench import pool_requests

    with pytest.warns(
        DeprecationWarning, match=r"bench\.pool_capacity is deprecated: use duocal_runtime\.bench\.pool_requests"
    ):
        old = runpy.run_module("duocal_runtime.bench.pool_capacity")  # fresh each time: warns even when imported before
    assert old["main"] is pool_requests.main and old["synthetic_profile"] is pool_requests.synthetic_profile
