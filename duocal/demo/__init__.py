"""The bundled demo model: a 0.8 M-parameter Llama with real retrieval heads, trained on CPU.

``DEMO_MODEL_DIR`` loads with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``. ``demo_passkeys(tokenizer, context_length)`` makes passkey
samples in the format it was trained on. ``DEMO_MODEL_DIR / "training.json"`` records how it was
trained and what it measured (exact match per context, which KV heads retrieve). Rebuild it with
``OMP_NUM_THREADS=1 python -m duocal.demo.train recipes/demo_model.yaml``.
"""

from __future__ import annotations

from duocal.data.passkey_formats import DEMO_PASSKEY_FORMAT
from duocal.models.known import DEMO_MODEL_DIR


def demo_passkeys(tokenizer, context_length: int | tuple[int, int] = 512, seed: int = 0, **overrides):
    """A ``PasskeyGenerator`` with the demo model's training data settings (format ``"demo"``,
    1-6 needles at depths 0-1 in the default synthetic filler, one question); ``overrides`` are
    passed on (e.g. ``num_passkeys=4``, ``questions="all"``)."""
    from duocal.data import PasskeyGenerator

    settings = {"format": DEMO_PASSKEY_FORMAT, "num_passkeys": (1, 6), "depth": (0.0, 1.0), "questions": "one"}
    return PasskeyGenerator(tokenizer, context_length=context_length, seed=seed, **{**settings, **overrides})


__all__ = ["DEMO_MODEL_DIR", "DEMO_PASSKEY_FORMAT", "demo_passkeys"]
