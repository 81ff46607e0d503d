"""Top-level typer app: the command groups and commands, registered in one place."""

import typer

from . import eval_ruler, eval_stream, profiles_remote  # noqa: F401  their decorators add `eval ruler | stream`, `profiles list | pull | push`
from .calibrate import CALIBRATE_EPILOG, calibrate_command
from .chat import CHAT_EPILOG, chat_command
from .eval import eval_app
from .models import models_app
from .profiler import PROFILER_EPILOG, profiler_command
from .profiles import profiles_app
from .recipes import recipes_app
from .serve import SERVE_EPILOG, serve_command
from .tune import TUNE_EPILOG, tune_command

app = typer.Typer(
    name="duocal",
    help="Per-head KV cache budgets for long-context LLMs (DuoAttention, StreamingLLM, H2O).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(profiles_app, name="profiles")
app.add_typer(eval_app, name="eval")
app.add_typer(models_app, name="models")
app.add_typer(recipes_app, name="recipes")
# one line each in `duocal --help`; `duocal COMMAND --help` gives the whole text
SHORT_HELP = {
    "calibrate": "Train DuoAttention gates on synthetic passkey data and write a profile.",
    "profile": "Measure every KV head from the model's own attention and write a profile.",
    "tune": "Choose the largest sparsity whose quality holds on your data; record it in the profile.",
    "serve": "Serve MODEL with a plan behind an OpenAI-compatible API (duocal's server or vLLM's).",
    "chat": "Chat with MODEL in the terminal through one KV cache kept across turns (--streaming: no end).",
}
app.command("calibrate", epilog=CALIBRATE_EPILOG, short_help=SHORT_HELP["calibrate"])(calibrate_command)
app.command("profile", epilog=PROFILER_EPILOG, short_help=SHORT_HELP["profile"])(profiler_command)
app.command("tune", epilog=TUNE_EPILOG, short_help=SHORT_HELP["tune"])(tune_command)
app.command("chat", epilog=CHAT_EPILOG, short_help=SHORT_HELP["chat"])(chat_command)
app.command("serve", epilog=SERVE_EPILOG, short_help=SHORT_HELP["serve"], context_settings={"allow_extra_args": True})(
    serve_command
)
