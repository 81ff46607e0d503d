"""Rotating queries and keys by whole numbers of positions (RoPE), for heads that see positions within
their cache (StreamingLLM's rule; `SinkWindow(positions="cache")`).

A query or key the model rotated at position p, rotated by d more positions, is what the model would
have made at p + d: RoPE's rotations compose when its frequencies are fixed. The angles d·f are computed
in float64 from the model's own frequencies and only for whole, bounded d, so a rotation adds one
rounding of the tensor's dtype and no error of the angle (float32 angles at position 4,000,000 are off
by a tenth of a radian). Nothing is rotated step after step: see hf/stream_positions.py for which
tensors are rotated, and when.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import PlanError

# rope types whose frequencies do not depend on the sequence length (transformers' names)
COMPOSING_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, eq=False)
class Rotation:
    """A model's RoPE frequencies (float64, [head_dim / 2]), in transformers' rotate-half layout."""

    inv_freq: torch.Tensor
    placed: dict = field(default_factory=dict)  # the frequencies on each device used (no copy per step)

    def frequencies_on(self, device: torch.device) -> torch.Tensor:
        if device not in self.placed:
            self.placed[device] = self.inv_freq.to(device)
        return self.placed[device]

    def rotate(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, D] rotated by delta [B, T] positions (whole numbers). A delta of 0 leaves x exactly."""
        angle = delta.to(torch.float64)[..., None] * self.frequencies_on(delta.device)  # [B, T, D/2]
        cos, sin = angle.cos().to(torch.float32), angle.sin().to(torch.float32)
        cos, sin = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
        wide = x.float()
        half = wide.shape[-1] // 2
        turned = torch.cat([-wide[..., half:], wide[..., :half]], -1)
        return (wide * cos + turned * sin).to(x.dtype)


def rotary_embedding(model) -> torch.nn.Module | None:
    """The module that computes the model's RoPE (`model.model.rotary_emb` in the supported families)."""
    for holder in (getattr(model, "model", None), model):
        rotary = getattr(holder, "rotary_emb", None)
        if rotary is not None and hasattr(rotary, "inv_freq"):
            return rotary
    return None


def rotation_of(model, head_dim: int) -> Rotation:
    """The rotation of `model`'s RoPE, refused where rotations by whole positions do not compose."""
    rotary = rotary_embedding(model)
    if rotary is None:
        raise PlanError(
            f"positions='cache' rotates cached keys by whole positions, but {type(model).__name__} has no RoPE "
            "module duocal can read (model.model.rotary_emb); use positions='original'"
        )
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in COMPOSING_ROPE_TYPES:
        raise PlanError(
            f"positions='cache' needs a RoPE whose rotations compose (frequencies fixed: "
            f"{', '.join(COMPOSING_ROPE_TYPES)}); this model's rope_type {rope_type!r} changes its frequencies with "
            "the sequence length, so a key moved to a position within the cache would not be the key the model "
            "makes there. Use positions='original'"
        )
    inv_freq = rotary.inv_freq.detach().to(torch.float64)
    if 2 * inv_freq.numel() != head_dim:
        raise PlanError(
            f"positions='cache' rotates whole heads, but this model's RoPE turns {2 * inv_freq.numel()} of "
            f"{head_dim} channels (partial rotary); use positions='original'"
        )
    return Rotation(inv_freq)
