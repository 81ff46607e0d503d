"""`duocal serve [MODEL] [--profile P] [--sparsity S | --budget B] ...`: an OpenAI-compatible server, duocal's own
(--engine transformers) or vLLM's with duocal's plugin (--engine vllm, duocal/serving/vllm_launch.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import ProfileOpt
from .user_errors import user_errors

SERVE_EPILOG = """Examples:

  duocal serve smollm2-135m-instruct --kv-memory 2GiB          # its shipped profile at its deploy sparsity

  duocal serve ./my-model --profile mine.json --sparsity 0.75 --port 9000 --num-blocks 4096

  duocal serve smollm2-135m-instruct --kv-memory 2GiB --kv-bits 4    # full heads in 4-bit codes

  .venv-vllm/bin/duocal serve smollm2-135m-instruct --engine vllm --kv-memory 1GiB -- --max-model-len 8192

Then: curl http://127.0.0.1:8000/v1/chat/completions -d '{"model": "NAME", "messages": [...]}'
"""


ENGINES = ("transformers", "vllm")
TRANSFORMERS_ONLY = {"num_blocks": None, "max_batch_tokens": None, "page_size": None, "kv_bits": 16,
                     "max_request_size": "4MiB"}  # fmt: skip


def serve_command(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Argument(help="A model folder, a .gguf file or a known name (default: the bundled demo model)."),
    ] = None,
    profile: ProfileOpt = None,
    sparsity: Annotated[
        float | None, typer.Option(help="Fraction of KV heads made bounded (default: the profile's).")
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="KV bytes per request at the model's context instead ('64MiB'): the fewest bounded heads that fit."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address or name to listen on (IPv6: '::1', '::' for all).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    kv_memory: Annotated[
        str | None, typer.Option(help="KV pool size ('2GiB'); default: sized from free memory by transformers.")
    ] = None,
    num_blocks: Annotated[
        int | None,
        typer.Option(help="KV pool as transformers counts it: blocks of --page-size tokens of the plain model."),
    ] = None,
    max_batch_tokens: Annotated[
        int | None, typer.Option(help="Tokens per forward pass (default: the model's context, at most 8192).")
    ] = None,
    page_size: Annotated[
        int | None,
        typer.Option(
            help="Tokens per page of full heads (default 16, or a multiple of the code group under --kv-bits)."
        ),
    ] = None,
    kv_bits: Annotated[
        int, typer.Option(help="Bits full heads store keys and values in: 16, 8 or 4 (KIVI codes below 16).")
    ] = 16,
    max_request_size: Annotated[
        str, typer.Option(help="Largest request body ('4MiB', '500kB'); a larger one gets a 413.")
    ] = "4MiB",
    engine: Annotated[
        str, typer.Option(help="transformers: duocal's own server; vllm: vLLM's OpenAI server with duocal's plugin.")
    ] = "transformers",
):
    """Serve MODEL with a plan over transformers' OpenAI-compatible endpoints (/v1/chat/completions,
    /v1/completions, /v1/responses, streaming or not; /v1/models, /health), continuous batching on
    duocal's paged cache. Prints the address and the KV pool (MiB/GiB; requests of the model's context
    it holds vs plain attention). The model's id is the MODEL you gave. Errors are OpenAI-shaped JSON; sampling
    settings are honoured per request, and a field the server cannot honour (n > 1, log probabilities, images)
    is a 400 naming it. Ctrl-C drains open requests, a second Ctrl-C stops at once. With
    --engine vllm (run from .venv-vllm, `make vllm`): vLLM's own server, options after `--` go to vLLM,
    --kv-memory is whole GiB."""
    if engine == "vllm":
        options = {name: value for name, value in locals().items() if name in TRANSFORMERS_ONLY}
        return serve_with_vllm(model, profile, sparsity, budget, kv_memory, host, port, tuple(ctx.args), options)
    with user_errors():
        if engine not in ENGINES:
            raise ValueError(f"--engine is one of {', '.join(ENGINES)}, got {engine!r}")
        if ctx.args:
            raise ValueError(f"unexpected arguments {' '.join(ctx.args)}: options after `--` are for --engine vllm")
    from duocal.serving.addresses import listening_socket, server_url
    from duocal.serving.startup import SERVE_FIELDS, ServeSettings, prepare_server, run
    from duocal_runtime.planning.sizes import bytes_with_count, human_bytes

    with user_errors():
        sock = listening_socket(host, port)  # a port in use fails before the model loads
        options = {name: value for name, value in locals().items() if name in SERVE_FIELDS}
        served, summary = prepare_server(ServeSettings(**options))
    bound = sock.getsockname()[1]
    typer.echo(f"serving {served.name} at {server_url(host, bound)}/v1 (chat/completions, completions; streaming)")
    typer.echo(
        f"KV pool: {bytes_with_count(summary['kv_bytes'])}; {summary['requests']} requests of {summary['context']} "
        f"tokens at once ({human_bytes(summary['bytes_per_request'])} each) vs {summary['plain_requests']} with plain "
        f"attention ({human_bytes(summary['plain_bytes_per_request'])} each); plan: "
        f"{served.runtime.plan.num_bounded} of {served.runtime.plan.num_heads} KV heads bounded"
        + ("" if kv_bits == 16 else f", full heads in {kv_bits}-bit codes")
    )
    if run(served, sock):
        typer.echo("stopped", err=True)
        raise typer.Exit(130)


def serve_with_vllm(model, profile, sparsity, budget, kv_memory, host, port, vllm_args, options) -> None:
    """Check, print the plan, then become vLLM's OpenAI server."""
    from duocal.serving.vllm_launch import VllmServe, exec_server, vllm_launch

    with user_errors():
        given = [name for name, value in options.items() if value != TRANSFORMERS_ONLY[name]]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags}: --engine transformers only; give vLLM's own options after `--`")
        if model is None or model.startswith("-"):
            raise ValueError("--engine vllm needs MODEL before `--` (a folder or a known name)")
        launch = vllm_launch(VllmServe(model, profile, sparsity, budget, kv_memory, host, port, vllm_args))
    typer.echo(f"duocal: starting {launch.summary}", err=True)
    exec_server(launch)
