"""`duocal chat MODEL`: a terminal conversation through one KV cache (duocal/chat/session.py), interactive or
scripted (--script FILE, or lines on stdin that is not a terminal)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from .options import ProfileOpt
from .user_errors import user_errors

CHAT_EPILOG = """Examples:

  duocal chat smollm2-135m-instruct --streaming            # every head a sink window: no length limit

  duocal chat smollm2-135m-instruct --sparsity 0.75        # its profile's plan (up to the trained length)

  duocal chat smollm2-135m-instruct --streaming --script questions.txt

In the chat: /stats (tokens and KV cache), /reset (a new conversation), /exit. Ctrl-C stops an answer;
a second Ctrl-C leaves.
"""


def chat_command(
    model: Annotated[str, typer.Argument(help="A model folder, a .gguf file or a known name (duocal models list).")],
    profile: ProfileOpt = None,
    streaming: Annotated[
        bool, typer.Option(help="Every head a sink window that sees positions within its cache (no profile needed).")
    ] = False,
    sparsity: Annotated[float | None, typer.Option(help="The profile's plan at this sparsity.")] = None,
    positions: Annotated[
        str | None,
        typer.Option(help="What the profile plan's sink windows see: original or cache (default: original)."),
    ] = None,
    sink: Annotated[
        int | None, typer.Option(help="Sink tokens (default: 4 with --streaming, else the profile's).")
    ] = None,
    recent: Annotated[
        int | None, typer.Option(help="Recent tokens (default: 1020 with --streaming, else the profile's).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens of one answer.")] = 256,
    temperature: Annotated[float, typer.Option(help="0: greedy; above: sampling at this temperature.")] = 0.0,
    system: Annotated[str | None, typer.Option(help="A system message opening the conversation.")] = None,
    script: Annotated[
        Path | None, typer.Option(help="Messages to send, one per line (else stdin or the terminal).")
    ] = None,
):
    """Chat with MODEL through one KV cache kept across turns: each turn prefills only its own tokens, and the
    answer streams as it is generated. With --streaming the conversation goes past the model's trained length
    at constant memory; with a profile's plan, a turn past it is refused and the chat goes on."""
    import duocal_runtime as dr
    from duocal.chat.session import ChatSession, streaming_plan
    from duocal.models import ModelRef
    from duocal_runtime.files.regular_files import check_regular
    from duocal_runtime.hf.apply import trained_positions
    from duocal_runtime.planning.sizes import human_bytes

    with user_errors():
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be a positive number of tokens, got {max_new_tokens}")
        if script is not None:
            check_regular(script, "--script")
        ref = ModelRef.resolve(model)
        config, tokenizer = ref.load_config(), ref.load_tokenizer()
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{ref.arg} has no chat template: duocal chat needs an instruction-tuned model with one")
        if streaming:
            if profile or sparsity is not None or positions is not None:
                raise ValueError(
                    "--streaming makes every head a sink window: give no --profile, --sparsity or --positions"
                )
            plan = streaming_plan(config, sink or 4, recent or 1020)
        else:
            chosen = profile or ref.default_profile
            if chosen is None:
                raise ValueError(f"no profile for {ref.arg}: pass --profile, or chat with --streaming")
            loaded = dr.load_profile(chosen)
            loaded.check_compatible(config)
            plan = dr.plan(loaded, sparsity=sparsity, sink=sink, recent=recent, positions=positions)
        trained = trained_positions(config)
        runtime = dr.apply(ref.load_model(), plan)
        session = ChatSession(runtime.model, tokenizer, runtime, trained, max_new_tokens, system)
    sampling = {"temperature": temperature} if temperature > 0 else {}
    lines = script_lines(script) if script is not None else None if sys.stdin.isatty() else stdin_lines()
    echo = lines is not None

    def status() -> str:
        return f"[{session.tokens:,} tokens, KV {human_bytes(session.kv_bytes())}]"

    typer.echo(f"duocal chat: {ref.name}, {plan!r}. /stats, /reset, /exit; Ctrl-C stops an answer.", err=True)
    with user_errors():
        converse(session, messages(lines, status), echo, status, trained, plan, sampling)


def converse(session, texts: Iterator[str], echo: bool, status, trained: int, plan, sampling: dict) -> None:
    """Answer every message of `texts`; commands /exit, /stats, /reset."""
    from duocal.chat.session import TurnRefused

    for text in texts:
        if echo:
            typer.echo(f"you> {text}")
        command = text.strip().lower()
        if command in ("/exit", "/quit"):
            break
        if command == "/stats":
            typer.echo(f"{status()} trained length {trained:,}; {plan.summary().splitlines()[1]}")
            continue
        if command == "/reset":
            session.reset()
            typer.echo("(a new conversation)")
            continue
        if not text.strip():
            continue
        with stopping_on_interrupt(session):
            try:
                typer.echo("bot> ", nl=False)
                result = session.turn(text, lambda piece: typer.echo(piece, nl=False), **sampling)
                typer.echo(" (stopped)" if result.stopped else "")
            except TurnRefused as err:
                typer.echo(f"\nrefused: {err}")


def messages(lines: Iterator[str] | None, status) -> Iterator[str]:
    """The user's messages: `lines`, else what is typed at the prompt (until end of input)."""
    if lines is not None:
        yield from lines
        return
    while True:
        try:
            yield input(f"{status()} you> ")
        except EOFError:
            typer.echo("")
            return
        except KeyboardInterrupt:
            typer.echo("")
            raise typer.Exit(130) from None


def script_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield line.rstrip("\n")


def stdin_lines() -> Iterator[str]:
    for line in sys.stdin:
        yield line.rstrip("\n")


class stopping_on_interrupt:
    """During an answer, the first Ctrl-C ends the answer (the chat goes on); a second one leaves."""

    def __init__(self, session):
        self.session = session

    def __enter__(self):
        self.session.stop.clear()  # a stop left from the last answer must not make this Ctrl-C the second
        self.previous = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def _interrupt(self, signum, frame):
        if self.session.stop.is_set():
            raise KeyboardInterrupt
        self.session.stop.set()

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)
        if exc[0] is KeyboardInterrupt:
            typer.echo("")
            raise typer.Exit(130)
        return False
