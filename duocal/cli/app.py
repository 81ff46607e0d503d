"""Top-level typer app: the command groups and commands, registered in one place."""

import typer

from . import eval_ruler, profiles_remote  # noqa: F401  their decorators add `eval ruler`, `profiles list | pull | push`
from .calibrate import CALIBRATE_EPILOG, calibrate_command
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
app.command("calibrate", epilog=CALIBRATE_EPILOG)(calibrate_command)
app.command("profile", epilog=PROFILER_EPILOG)(profiler_command)
app.command("tune", epilog=TUNE_EPILOG)(tune_command)
app.command("serve", epilog=SERVE_EPILOG, context_settings={"allow_extra_args": True})(serve_command)
