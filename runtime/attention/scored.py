"""Causal attention that also returns each key's attention mass: what H2O accumulates.

mass[b, g, k] = Σ over the pass's real queries q and the R query heads of KV head g of p(q → k).
Long passes never hold a probability matrix: one block-sparse FlexAttention call gives the
outputs and each query's log-sum-exp (lse), and a second call with the roles of queries and
keys swapped and `score - lse[query]` as its score gives log Σ_q exp(s_qk - lse_q) = log mass
as *its* log-sum-exp. Both are O(N²·D) compute and O(N) memory. Compiled FlexAttention has no
`return_lse` on CPU (torch 2.13), so there long passes materialise probabilities one block of
queries at a time (bounded memory). Short passes take the direct route: probabilities in fp32.
A first pass without padding (key i is the pass's token i) needs no rank mask: each block of
queries sees every key before it, and only the keys of its own positions are masked, by one
triangle (bit for bit the rank-masked result; a 3.9k-token SmolLM2 layer 593 -> 420 ms on one CPU thread).
"""

from __future__ import annotations

import torch

from . import block_sparse as BS
from . import dense as DA
from . import ranks as R

BLOCK_ELEMENTS = 1 << 22  # CPU route: logits per block of queries (16 MiB in fp32)


def flex_route(device: torch.device) -> bool:
    """Whether compiled FlexAttention can return the log-sum-exp on this device."""
    return device.type != "cpu"


def attention_with_mass(
    q, k, v, q_rank, k_rank, scaling: float, first_pass: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, G*R, T, D], k/v [B, G, S, D], q_rank [B, T], k_rank [B, G, S] (each head its own slots)
    -> out [B, G*R, T, D], mass [B, G, S] fp32. A key is visible when real and not after the query.
    `first_pass`: the keys are the pass's own tokens, none padding (S == T, ranks in order)."""
    t, s, r = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    if DA.fits_dense(t * r, s, q.device):
        block = t
    elif not flex_route(q.device):  # a block of queries holds BLOCK_ELEMENTS logits over all rows and heads
        block = max(1, BLOCK_ELEMENTS // (s * q.shape[0] * q.shape[1]))
    else:
        return _flex(q, k, v, q_rank, k_rank, scaling)
    mask = _OwnPositions(block, r, q.device) if first_pass else _RankMask(q_rank, k_rank, r)
    return _blocked(q, k, v, scaling, block, mask)


class _RankMask:
    """Each head's own ranks decide what a query sees (padding, earlier slots in any order)."""

    def __init__(self, q_rank, k_rank, rep: int):
        self.q_rank, self.k_rank, self.rep = q_rank, k_rank, rep

    def apply(self, logits: torch.Tensor, i0: int, i1: int, end: int) -> None:
        visible = R.causal_rank_mask(self.q_rank[:, None, i0:i1], self.k_rank[..., :end])
        logits.add_(DA.additive_mask(DA.expand_mask_over_heads(visible, self.rep), logits.dtype))


class _OwnPositions:
    """Key i is query i: a block of queries sees every key before it and, of its own, those not after it."""

    def __init__(self, block: int, rep: int, device: torch.device):
        self.rep = rep
        self.triangle = DA.additive_mask(
            torch.ones(block, block, dtype=torch.bool, device=device).tril_(), torch.float32
        )

    def apply(self, logits: torch.Tensor, i0: int, i1: int, end: int) -> None:
        n = i1 - i0
        logits.unflatten(2, (self.rep, n))[..., end - n : end].add_(self.triangle[:n, :n])


def _blocked(q, k, v, scaling, block: int, mask):
    """Probabilities of `block` queries at a time; keys after a block's last query are skipped.
    Rows with no key to see (padding queries) get all-zero probabilities and garbage outputs."""
    g, t, s = k.shape[1], q.shape[2], k.shape[2]
    mass = torch.zeros(k.shape[:3], dtype=torch.float32, device=k.device)
    outs = []
    for i0 in range(0, t, block):
        i1 = min(t, i0 + block)
        end = s - t + i1
        logits = torch.matmul(DA.gqa_queries(q[:, :, i0:i1], g).float(), k[:, :, :end].float().transpose(-1, -2))
        mask.apply(logits.mul_(scaling), i0, i1, end)
        probs = torch.softmax(logits, dim=-1).nan_to_num_(0.0)
        mass[..., :end] += probs.sum(2)
        outs.append(DA.gqa_outputs(torch.matmul(probs.to(v.dtype), v[:, :, :end]), q.shape[1]))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0], mass


def _flex(q, k, v, q_rank, k_rank, scaling):
    g, r, t, s = k.shape[1], q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    tp, sp = BS.padded_length(t), BS.padded_length(s)
    q_rank, k_rank = BS.pad_to(q_rank, tp, 1, -1), BS.pad_to(k_rank, sp, 2, -1)
    q, k, v = BS.pad_to(q, tp, 2), BS.pad_to(k, sp, 2), BS.pad_to(v, sp, 2)
    partial, full = (x.repeat_interleave(r, dim=1) for x in BS.visible_blocks(q_rank, k_rank, BS.NO_SINK, None))

    def visible(b, h, q_idx, kv_idx):
        qr, kr = q_rank[b, q_idx], k_rank[b, h // r, kv_idx]
        return (kr >= 0) & (qr >= 0) & (kr <= qr)

    out, lse = BS.flex(q, k, v, BS.block_mask(partial, full, visible, tp, sp), scaling, return_lse=True)

    def seen_by(b, h, kv_idx, q_idx):
        return visible(b, h, q_idx, kv_idx)

    def minus_lse(score, b, h, kv_idx, q_idx):
        return score - lse[b, h, q_idx]

    swapped = BS.block_mask(partial.transpose(-1, -2), full.transpose(-1, -2), seen_by, sp, tp)
    _, log_mass = BS.flex(k.repeat_interleave(r, dim=1), q, q, swapped, scaling, score_mod=minus_lse, return_lse=True)
    return out[:, :, :t], log_mass.float().exp().unflatten(1, (g, r)).sum(2)[..., :s]
