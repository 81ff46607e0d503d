"""What a measurement may ask of a model: the positions it was trained for, and the progress callback every
long measurement reports to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[int, int, str], None]  # (units done, units in all, what is running)


def model_positions(model_config: Any) -> int | None:
    """The positions the model was trained for (`max_position_embeddings` of its text config), if it says."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    return getattr(text_config, "max_position_embeddings", None)


def refuse_beyond_positions(contexts, model_config: Any, advice: str, generated: int = 0, which: str = "") -> None:
    """Raise `ValueError` for the first context (plus `generated` tokens) beyond the model's positions, saying
    `which` (what sees them) and `advice`."""
    limit = model_positions(model_config)
    beyond = [c for c in contexts if limit is not None and c + generated > limit]
    if not beyond:
        return
    plus = f" + {generated} generated tokens" if generated else ""
    raise ValueError(
        f"context {beyond[0]}{plus} is beyond the model's max_position_embeddings ({limit}){which}; {advice}"
    )
