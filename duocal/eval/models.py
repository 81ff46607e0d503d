"""The model side of evaluations: resolving and loading a model, its pad id, its passkey format."""

from __future__ import annotations

from pathlib import Path

from duocal.demo import DEMO_MODEL_DIR, DEMO_PASSKEY_FORMAT
from duocal.models import resolve_model


def default_format(model_path: str | Path) -> str:
    """The demo model's own passkey format for the demo model, the classic digits task otherwise."""
    try:
        is_demo = Path(model_path).resolve() == DEMO_MODEL_DIR.resolve()
    except OSError:
        is_demo = False
    return DEMO_PASSKEY_FORMAT if is_demo else "digits"


def load_model(model: str | Path):
    """The model from a known name, a local folder, a .gguf file or a Hub id, in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model(model)).eval()


def load_tokenizer(model: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(model))
