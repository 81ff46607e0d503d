"""A dense, step-by-step reference for every per-head policy, written for the tests.

It keeps *every* key (transformers' DynamicCache) and masks each head by its policy. For
`h2o` / `sink_h2o` it runs a plain Python simulation of H2O on the same attention
probabilities: add this pass's probabilities (summed over the query heads of the KV group and
over the pass's queries) to each alive key's score, then keep the last `recent` real tokens,
the first `sink`, and the `heavy` highest-scoring others. Nothing here is shared with the
runtime's code.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import duocal_runtime as dr

NAME = "duocal_test_reference"


class DenseReference:
    def __init__(self, plan: dr.Plan):
        self.plan = plan
        self.state: dict[int, dict] = {}  # layer -> {"alive": [B][Hkv] set of ranks, "score": dict, "real": [B]}

    def __enter__(self):
        AttentionInterface.register(NAME, self.attention)
        AttentionMaskInterface.register(
            NAME,
            lambda attention_mask=None, kv_offset=0, kv_length=0, **kw: (
                None if attention_mask is None else attention_mask[:, kv_offset : kv_offset + kv_length].bool()
            ),
        )
        return self

    def __exit__(self, *exc):
        AttentionInterface._global_mapping.pop(NAME, None)
        AttentionMaskInterface._global_mapping.pop(NAME, None)

    def attention(self, module, q, k, v, mask, scaling=None, **kwargs):
        b, h, t, d = q.shape
        s = k.shape[2]
        hkv = k.shape[1]
        rep = h // hkv
        valid = torch.ones(b, s, dtype=torch.bool) if mask is None else mask
        ranks = valid.long().cumsum(1) - 1
        ranks[~valid] = -1
        q_ranks = ranks[:, s - t :]
        layer = module.layer_idx
        st = self.state.setdefault(
            layer,
            {
                "alive": [[set() for _ in range(hkv)] for _ in range(b)],
                "score": [[{} for _ in range(hkv)] for _ in range(b)],
            },
        )
        out = torch.zeros(b, h, t, d)
        for row in range(b):
            real_total = int(valid[row].sum())
            for kvh in range(hkv):
                policy = self.plan.policies[layer][kvh]
                for r in range(rep):
                    qh = kvh * rep + r
                    allowed = self._allowed(policy, st, row, kvh, ranks[row], q_ranks[row])
                    logits = (q[row, qh].double() @ k[row, kvh].double().T) * scaling
                    logits = logits.masked_fill(~allowed, float("-inf"))
                    probs = torch.softmax(logits, -1).nan_to_num(0.0)
                    out[row, qh] = (probs @ v[row, kvh].double()).float()
                    if isinstance(policy, (dr.H2O, dr.SinkH2O)):
                        for j in range(s):
                            if ranks[row, j] >= 0 and allowed[:, j].any():
                                sc = st["score"][row][kvh]
                                sc[int(ranks[row, j])] = sc.get(int(ranks[row, j]), 0.0) + float(probs[:, j].sum())
                if isinstance(policy, (dr.H2O, dr.SinkH2O)):
                    self._evict(policy, st, row, kvh, real_total)
        return out.to(q.dtype).transpose(1, 2), None

    def _allowed(self, policy, st, row, kvh, ranks, q_ranks):
        kr, qr = ranks[None, :], q_ranks[:, None]
        causal = (kr >= 0) & (qr >= 0) & (kr <= qr)
        if isinstance(policy, dr.SinkWindow):
            return causal & ((kr < policy.sink) | (kr > qr - policy.recent))
        if isinstance(policy, (dr.H2O, dr.SinkH2O)):
            alive = st["alive"][row][kvh]
            new = set(int(x) for x in q_ranks if x >= 0)
            alive |= new
            in_cache = torch.tensor([int(x) in alive for x in ranks])[None, :]
            return causal & in_cache
        return causal

    @staticmethod
    def _evict(policy, st, row, kvh, real_total):
        alive, score = st["alive"][row][kvh], st["score"][row][kvh]
        if len(alive) <= policy.capacity:
            return
        sink = getattr(policy, "sink", 0)
        protected = {r for r in alive if r < sink or r >= real_total - policy.recent}
        others = sorted(alive - protected, key=lambda r: -score.get(r, 0.0))
        keep = protected | set(others[: policy.heavy])
        st["alive"][row][kvh] = keep
        st["score"][row][kvh] = {r: score[r] for r in keep}

    def kept_ranks(self, layer: int, row: int, kvh: int) -> set[int]:
        policy = self.plan.policies[layer][kvh]
        if isinstance(policy, (dr.H2O, dr.SinkH2O)):
            return set(self.state[layer]["alive"][row][kvh])
        raise ValueError("kept_ranks is tracked for H2O heads only")


def runtime_kept_ranks(cache: dr.DuoCache, layer: int, row: int, kvh: int) -> set[int]:
    for group in cache.head_groups(layer):
        if kvh in group.kv_heads:
            g = group.kv_heads.index(kvh)
            rank = group.rank[row, g] if group.rank.ndim == 3 else group.rank[row]
            return {int(r) for r in rank if r >= 0}
    raise KeyError(kvh)
