"""The attention function of calibration: teacher (full) and student (gated) passes.

DuoAttention's two-way forward (arXiv 2410.10819 §3.2; reference `duo_attn/patch/llama.py`,
`llama_duo_attention_forward_two_way`): the teacher is the model with full attention, without
gradients; in the student, each head outputs

    gate * full_attention + (1 - gate) * streaming_attention

where, as in the reference, the full-attention term is the *teacher's* attention output at that
layer (upstream computes it from the teacher half of a doubled batch), and the streaming term is
computed from the student's own queries and keys. Here the two halves are two passes: the
teacher pass stores each layer's output in `Gating.teacher`, the student pass reads it. Only
the streaming term and the gates carry gradients.

One function serves every supported family (Llama, Mistral, Qwen2, Qwen3): it is registered by
name with `duocal_runtime.compat.register`, the same mechanism the runtime uses, and gets
its per-pass state through the model's forward kwargs (`GATING_KWARG`), which transformers hands
to every attention call. Nothing is patched and nothing is global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from duocal.calibrate.key_blocks import DEFAULT_BLOCK, blocked_sink_window_attention
from duocal_runtime import compat

ATTENTION_NAME = "duocal_calibrate_gated"
GATING_KWARG = "duocal_gating"


@dataclass
class Gating:
    """One forward pass's instructions to every attention layer.

    gates: [layers, KV heads] in [0, 1] for a student pass; None for the teacher pass.
    teacher: layer -> the teacher's attention output [B, H_local, T, D] (written by the teacher
        pass, read by the student pass).
    sequence_parallel: a `duocal.calibrate.ulysses.SequenceParallel`, or None on one process.
    """

    sink: int
    recent: int
    block: int = DEFAULT_BLOCK
    gates: torch.Tensor | None = None
    teacher: dict[int, torch.Tensor] = field(default_factory=dict)
    sequence_parallel: Any = None

    def student(self, gates: torch.Tensor) -> Gating:
        return Gating(self.sink, self.recent, self.block, gates, self.teacher, self.sequence_parallel)


def mix(gates: torch.Tensor, full: torch.Tensor, streaming: torch.Tensor) -> torch.Tensor:
    """gates [G], full/streaming [B, G*R, T, D] -> gate * full + (1 - gate) * streaming, per KV group."""
    g = gates.to(streaming.dtype).repeat_interleave(streaming.shape[1] // gates.shape[0])[None, :, None, None]
    return g * full + (1 - g) * streaming


def local_attention(gating: Gating, layer: int, scaling: float, q, k, v, kv_offset: int = 0) -> torch.Tensor:
    """q [B, H, T, D], k/v [B, G, T, D] (a slice of heads starting at KV head `kv_offset`) -> [B, H, T, D]."""
    if gating.gates is None:
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=k.shape[1] != q.shape[1]
        )
        gating.teacher[layer] = out
        return out
    if layer not in gating.teacher:
        raise RuntimeError(f"duocal calibrate: no teacher output for layer {layer}; run the teacher pass first")
    streaming = blocked_sink_window_attention(q, k, v, gating.sink, gating.recent, scaling, gating.block)
    gates = gating.gates[layer, kv_offset : kv_offset + k.shape[1]]
    return mix(gates, gating.teacher[layer], streaming)


def attend_gated(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature: q [B,H,T,D], k/v [B,G,T,D] -> ([B,T,H,D], None)."""
    gating: Gating | None = kwargs.get(GATING_KWARG)
    if gating is None:
        raise RuntimeError(
            f"the model is set to duocal's calibration attention but was called without {GATING_KWARG}=...; "
            "call duocal.calibrate.gated_attention.uninstall(model) to use it normally"
        )
    if attention_mask is not None:
        raise ValueError("duocal calibrate runs unpadded (right-padded, mask-free) batches; do not pass attention_mask")
    scale = scaling if scaling is not None else module.scaling

    def attend(q, k, v, kv_offset=0):
        return local_attention(gating, module.layer_idx, scale, q, k, v, kv_offset)

    if gating.sequence_parallel is not None:
        return gating.sequence_parallel.attend(attend, query, key, value), None
    return attend(query, key, value).transpose(1, 2), None


def install(model) -> str:
    """Switch `model` to the calibration attention (explicit; undo with `uninstall`). Returns the previous name."""
    compat.check_model_supported(model.config)
    previous = compat.attention_implementation(model)
    compat.register(ATTENTION_NAME, attend_gated)
    compat.set_attention_implementation(model, ATTENTION_NAME)
    return previous


def uninstall(model, previous: str | None = "sdpa") -> None:
    compat.set_attention_implementation(model, previous or "sdpa")
    compat.unregister(ATTENTION_NAME)
