"""The shared policy matrix (tests/helpers/policy_matrix.py) names every registered policy, in every storage it
accepts, so that the tests parametrized over it cover a new policy the day it is registered."""

import dataclasses

import pytest

from duocal_runtime.policies import POLICIES as REGISTERED
from duocal_runtime.quant.codes import BITS

from helpers.policy_matrix import POLICIES, kv_bits, policy_matrix


def test_every_registered_policy_has_a_line():
    missing = set(REGISTERED) - {p.name for p in POLICIES}
    assert not missing, f"add a line for {sorted(missing)} to tests/helpers/policy_matrix.py"


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_storage_a_policy_accepts_has_a_line(name):
    """A policy with a `kv_bits` field stores 16 bits and codes: the matrix holds both, and only widths it accepts."""
    fields = {f.name for f in dataclasses.fields(REGISTERED[name])}
    stored = {kv_bits(p) for p in POLICIES if p.name == name}
    assert stored <= set(BITS)
    if "kv_bits" in fields:
        assert 16 in stored and stored & (set(BITS) - {16}), f"{name}: add a line with kv_bits 8 or 4"
    else:
        assert stored == {16}


def test_lines_are_distinct_and_filters_choose_from_them():
    assert len({str(p) for p in POLICIES}) == len(POLICIES)
    bounded16 = [param.values[0] for param in policy_matrix(bits=16, bounded=True)]
    assert bounded16 == [p for p in POLICIES if p.bounded and kv_bits(p) == 16] and bounded16
    with pytest.raises(AssertionError, match="leaves no policy"):
        policy_matrix(names=("no_such_policy",))
