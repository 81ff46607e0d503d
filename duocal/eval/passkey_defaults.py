"""What `duocal eval passkey` measures when an option is left out: per model kind, a run that ends soon.

The bundled demo model keeps its own task (its symbolic format on the synthetic haystack, 1 to 6
needles, 40 samples at 512 and 1024 tokens: ~1 minute). A real model gets a task full attention
solves (one digit passkey in the repeated filler, which pretrained LLMs read past; SmolLM2-135M
gets 16/16 at 2k) at 2048 tokens with 8 samples, so README's quick-start command finishes in
minutes on 2 CPU cores instead of ~27. Either way one sparsity, the profile's own (what
`dr.plan` and `duocal serve` deploy), unless --sparsity names more.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from duocal.data.chat_prompts import HAYSTACK_TEXT
from duocal.measure.limits import model_positions

DEFAULT_SPARSITY = 0.5  # without a profile (dr.DeployDefaults' sparsity)


@dataclass(frozen=True)
class PasskeyDefaults:
    """The values of the options a user left out."""

    contexts: str
    samples: int
    haystack: str
    passkeys: int | None  # None: the config's own (1 to 6 needles)


DEMO = PasskeyDefaults(contexts="512,1024", samples=40, haystack="synthetic", passkeys=None)
REAL = PasskeyDefaults(contexts="2048", samples=8, haystack="repeated", passkeys=1)


def defaults_for(is_demo: bool) -> PasskeyDefaults:
    return DEMO if is_demo else REAL


def default_contexts(defaults: PasskeyDefaults, model_config) -> str:
    """The default contexts, each capped at the model's positions (a small model trained for fewer)."""
    limit = model_positions(model_config)
    return ",".join(str(min(int(c), limit or int(c))) for c in defaults.contexts.split(","))


def default_sparsity(profile) -> str:
    """The one sparsity evaluated when none is named: the profile's deploy sparsity, else 0.5."""
    return f"{profile.deploy.sparsity:g}" if profile is not None else f"{DEFAULT_SPARSITY:g}"


def haystack_source(haystack: str, passkey_format: str) -> str:
    """`text` is the GPL-3.0 text shipped in duocal/assets/texts for every format; the chat format
    reads it by name, the raw formats by its path."""
    if haystack != "text" or passkey_format == "chat":
        return haystack
    return str(resources.files("duocal") / "assets" / "texts" / HAYSTACK_TEXT)
