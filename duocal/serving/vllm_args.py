"""The vLLM options given after `--` to `duocal serve --engine vllm`, read as vLLM's own parser reads them.

vLLM's `FlexibleArgumentParser` takes ``--hf_overrides`` for ``--hf-overrides``, a dotted ``--hf-overrides.KEY V``
for one key of a JSON option, a prefix of an option's name for the option (argparse's abbreviations) and more
options from a ``--config`` YAML file: an option duocal sets itself, given again in any of these forms, would
replace duocal's (another model, another plan, vLLM's defaults), so each is refused naming duocal's option.
Nothing here imports vLLM.
"""

from __future__ import annotations

from pathlib import Path

OWN_OPTIONS = {  # vLLM options duocal sets itself: passing them after `--` is refused, naming ours
    "--model": "MODEL",
    "--served-model-name": "MODEL (the name you give is the model id)",
    "--hf-overrides": "--profile / --sparsity / --budget",
    "--host": "--host",
    "--port": "--port",
}
CONFIG_OPTION = "--config"


def option_name(arg: str) -> str | None:
    """The option `arg` names as vLLM reads it ('--hf_overrides.x=1' -> '--hf-overrides'), None for a value."""
    if not arg.startswith("--") or arg == "--":
        return None
    return "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def own_option(name: str) -> str | None:
    """The option of duocal's own that vLLM would read `name` as (itself, or a prefix argparse expands), or None."""
    if name in OWN_OPTIONS:
        return name
    expands = [own for own in OWN_OPTIONS if own.startswith(name) and len(name) > 2]
    return expands[0] if expands else None


def check_vllm_args(args: tuple[str, ...]) -> None:
    """Refuse duocal's own options among `args`, in any form vLLM's parser accepts, and in a ``--config`` file."""
    for arg in args:
        name = option_name(arg)
        own = own_option(name) if name else None
        if own is not None:
            raise ValueError(
                f"{arg.split('=', 1)[0]} after `--` is duocal's {own} to set: use {OWN_OPTIONS[own]} instead"
            )
    config = option_value(args, CONFIG_OPTION)
    if config is not None:
        check_config_file(Path(config))


def check_config_file(path: Path) -> None:
    """Refuse a vLLM ``--config`` YAML file that sets one of duocal's own options (or cannot be read)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"--config {path} after `--`: cannot read it as YAML ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} after `--`: vLLM reads a YAML mapping of option names to values")
    for key in data:
        own = own_option(option_name(f"--{key}") or "")
        if own is not None:
            raise ValueError(f"--config {path} sets {key}, duocal's {own} to set: use {OWN_OPTIONS[own]} instead")


def option_value(args: tuple[str, ...], name: str) -> str | None:
    """The value of `name` in `args` (``NAME VALUE``, ``NAME=VALUE``, underscores for dashes, a prefix of the name),
    else None; `name` last, without its value, is refused (vLLM's parser would refuse it only after its imports)."""
    for i, arg in enumerate(args):
        given = option_name(arg) or arg.split("=", 1)[0]
        if given != name and not (given.startswith("--") and len(given) > 2 and name.startswith(given)):
            continue
        if "=" in arg:
            return arg.split("=", 1)[1]
        if i + 1 == len(args) or args[i + 1].startswith("--"):
            raise ValueError(f"{arg} after `--` needs a value")
        return args[i + 1]
    return None


def tensor_parallel_size(vllm_args: tuple[str, ...]) -> int:
    """vLLM's ``--tensor-parallel-size`` / ``-tp`` among the arguments after `--` (1 when not given)."""
    value = option_value(vllm_args, "--tensor-parallel-size") or option_value(vllm_args, "-tp") or "1"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--tensor-parallel-size {value!r}: give a whole number of ranks, e.g. 2")
    return int(value)
