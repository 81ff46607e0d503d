"""The vLLM options given after `--` to `duocal serve --engine vllm`, read as vLLM's own parser reads them.

vLLM's `FlexibleArgumentParser` takes ``--hf_overrides`` for ``--hf-overrides``, a dotted ``--hf-overrides.KEY V``
for one key of a JSON option, a prefix of an option's name for the option (argparse's abbreviations) and more
options from a ``--config`` YAML file (put before the command line's, which win): an option duocal sets itself,
given again in any of these forms, would replace duocal's (another model, another plan, vLLM's defaults), so each is
refused naming duocal's option. Options are read as argparse keeps them: the last one given wins.
Nothing here imports vLLM.
"""

from __future__ import annotations

import re
from pathlib import Path

OWN_OPTIONS = {  # vLLM options duocal sets itself: passing them after `--` is refused, naming ours
    "--model": "MODEL",
    "--served-model-name": "MODEL (the name you give is the model id)",
    "--hf-overrides": "--profile / --sparsity / --budget",
    "--host": "--host",
    "--port": "--port",
}
NOT_SERVED = {  # vLLM options that would make duocal's checks or its printed address wrong: refused, saying why
    "--uds": "vLLM would listen on that Unix socket and ignore --host / --port (the address duocal prints)",
    "--hf-config-path": "vLLM would plan the model from that config.json, not the model folder's that duocal checked",
}
CONFIG_OPTION = "--config"


def option_name(arg: str) -> str | None:
    """The option `arg` names as vLLM reads it ('--hf_overrides.x=1' -> '--hf-overrides'), None for a value."""
    if not arg.startswith("--") or arg == "--":
        return None
    return "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def own_option(name: str) -> str | None:
    """The option of duocal's own, or one it refuses, that vLLM would read `name` as (itself, or a prefix argparse
    expands), or None."""
    refused = [*OWN_OPTIONS, *NOT_SERVED]
    if name in refused:
        return name
    expands = [own for own in refused if own.startswith(name) and len(name) > 2]
    return expands[0] if expands else None


def refusal(own: str) -> str:
    """Why an option vLLM reads as `own` is refused, and what to do instead."""
    if own in NOT_SERVED:
        return f"is vLLM's {own}, refused by duocal: {NOT_SERVED[own]}; leave it out"
    return f"is duocal's {own} to set: use {OWN_OPTIONS[own]} instead"


def check_vllm_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse duocal's own options among `args`, in any form vLLM's parser accepts, and in a ``--config`` file; the
    options as vLLM reads them: a ``--config PATH`` file's options, then `args` (vLLM's order: the last one wins)."""
    if args and not args[0].startswith("-"):  # vLLM's parser would refuse it too, but only after its imports
        raise ValueError(
            f"{args[0]!r} after `--` is not an option: vLLM would read it as a second model; give the model before "
            "`--` and only vLLM's options after it (e.g. `-- --max-num-seqs 8`)"
        )
    for arg in args:
        name = option_name(arg)
        own = own_option(name) if name else None
        if own is not None:
            raise ValueError(f"{arg.split('=', 1)[0]} after `--` {refusal(own)}")
    config = option_value(args, CONFIG_OPTION)
    if config is None:
        return args
    given = [arg for arg in args if spells(arg, (CONFIG_OPTION,))]
    if given != [CONFIG_OPTION]:  # vLLM reads the file only for one `--config PATH`, and ignores `--config=PATH`
        raise ValueError(f"{' '.join(given)} after `--`: give vLLM one config file as `--config PATH` (vLLM reads "
                         "the file only in that form)")  # fmt: skip
    return (*config_file_args(Path(config)), *args)


def config_file_args(path: Path) -> list[str]:
    """The options of a vLLM ``--config`` YAML file as vLLM's `load_config_file` builds them (``--KEY VALUE``; a
    list's items after its key; a mapping as JSON; true as ``--KEY``, false as ``--no-KEY``); refused when it sets
    one of duocal's own options or cannot be read."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"--config {path} after `--`: cannot read it as YAML ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} after `--`: vLLM reads a YAML mapping of option names to values")
    argv: list[str] = []
    for key, value in data.items():
        own = own_option(option_name(f"--{key}") or "")
        if own is not None:
            raise ValueError(f"--config {path} sets {key}, which {refusal(own)}")
        argv.extend(yaml_option(str(key), value))
    return argv


def yaml_option(key: str, value) -> list[str]:
    """One YAML entry as vLLM's `load_config_file` puts it on the command line (vLLM drops a false one that has no
    ``--no-`` form; duocal reads no switch, so ``--no-KEY`` stands for either)."""
    import json

    if isinstance(value, bool):
        return [f"--{key}"] if value else [f"--no-{key}"]
    if isinstance(value, list):
        return [f"--{key}", *map(str, value)] if value else []
    if isinstance(value, dict):
        return [f"--{key}", json.dumps(value)]
    return [f"--{key}", str(value)]


def option_value(args: tuple[str, ...], *names: str) -> str | None:
    """The value of the option `names` spell (``NAME VALUE``, ``NAME=VALUE``, underscores for dashes, a prefix of
    a long name) in `args`, the last one given as argparse keeps it, else None; one without its value is refused
    (vLLM's parser would refuse it only after its imports)."""
    value = None
    for i, arg in enumerate(args):
        if not spells(arg, names):
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 == len(args) or args[i + 1].startswith("--"):
            raise ValueError(f"{arg} after `--` needs a value")
        else:
            value = args[i + 1]
    return value


def spells(arg: str, names: tuple[str, ...]) -> bool:
    """Whether vLLM reads `arg` as one of the options `names` (itself, underscores for dashes, a long one's prefix)."""
    given = option_name(arg) or arg.split("=", 1)[0]
    abbreviates = given.startswith("--") and len(given) > 2
    return any(given == name or (abbreviates and name.startswith(given)) for name in names)


def whole_number(args: tuple[str, ...], *names: str) -> int:
    """The whole number (at least 1) of the option `names` spell, 1 when not given."""
    value = option_value(args, *names)
    try:
        number = int(value) if value is not None else 1
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{names[0]} {value!r}: give a whole number, e.g. 2")
    return number


def human_readable_length(value: str, name: str) -> int | None:
    """A length as vLLM reads it (human_readable_int_or_auto: '1k' 1000, '1K' 1024, '25.6k' 25600), None for
    'auto' / -1 (vLLM takes the model's own)."""
    text = value.strip()
    if text == "-1" or text.lower() == "auto":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    try:
        if match is None:
            return int(text)
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
    except ValueError:
        raise ValueError(f"{name} {value!r} after `--`: give a number of tokens, e.g. 4096 or 4k or 4K") from None


def tensor_parallel_size(vllm_args: tuple[str, ...]) -> int:
    """vLLM's ``--tensor-parallel-size`` / ``-tp`` among the arguments after `--` (1 when not given)."""
    return whole_number(vllm_args, "--tensor-parallel-size", "-tp")
