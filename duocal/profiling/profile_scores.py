"""How a profiler's scores rank heads, from what it measured (profiler.py, measure/answer_loss.py)."""

from __future__ import annotations

import torch

from duocal_runtime.profile.measurements import kept_name

# How the profile's scores rank heads: `retrieval`, attention mass on the needle (passkey data);
# `kept`, 1 - the sink window's kept share; `loss`, the first-order rise of the answer's loss when the
# head alone streams (measure/answer_loss.py).
SCORES = ("loss", "retrieval", "kept")

SCORE_METHODS = {
    "retrieval": "attention (answer rows in blocks; Wu et al. arXiv 2404.15574)",
    "kept": "attention (1 - the sink window's kept share of the scored rows)",
    "loss": "answer loss (first-order rise when one head streams; gates as in arXiv 2410.10819)",
}


def chosen_scores(measured: dict[str, torch.Tensor], score: str) -> torch.Tensor:
    """[L, G] in [0, 1]: `loss` spread over [0, 1] (its order kept, no ties made), or the measure itself."""
    if score == "loss":
        loss = measured["loss"]
        return (loss - loss.min()) / (loss.max() - loss.min()).clamp_min(torch.finfo(loss.dtype).tiny)
    return measured["retrieval"] if score == "retrieval" else 1.0 - measured[kept_name("sink_window")]
