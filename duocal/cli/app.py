"""Top-level typer app; sub-apps register themselves here."""

import typer

from .eval import eval_app
from .profiles import profiles_app
from . import profiles_remote  # noqa: F401,E402  registers `profiles list | pull | push` on profiles_app

app = typer.Typer(
    name="duocal",
    help="Per-head KV cache budgets for long-context LLMs (DuoAttention, StreamingLLM, H2O).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(profiles_app, name="profiles")
from . import calibrate as _calibrate  # noqa: E402,F401  registers `duocal calibrate` on app
app.add_typer(eval_app, name="eval")
