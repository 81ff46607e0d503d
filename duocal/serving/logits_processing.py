"""The logits arithmetic of per-request sampling, as small pure functions (batch_sampling.py applies them to
the rows of a batched step). In vLLM's order: logit bias and `min_tokens`, then the penalties (greedy
requests too: they change which token is the largest), then, for sampled requests only, temperature, top-k and
top-p; then a token is drawn.

Penalties follow vLLM (and OpenAI's description): presence and frequency penalties count the tokens generated
so far; the repetition penalty (transformers' `RepetitionPenaltyLogitsProcessor`, CTRL's rule) looks at prompt
and answer.
"""

from __future__ import annotations

import torch


def add_bias(scores: torch.Tensor, ids: torch.Tensor, biases: torch.Tensor) -> torch.Tensor:
    """`scores` [V] with `biases` [n] added at token `ids` [n]."""
    return scores.index_add(0, ids, biases.to(scores.dtype))


def forbid(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`scores` [V] with the tokens `ids` [n] made impossible (-inf)."""
    return scores.index_fill(0, ids, float("-inf"))


def token_counts(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each token occurs in `tokens` [G] (ids): [V]."""
    return torch.bincount(tokens, minlength=vocab_size)[:vocab_size]


def penalize(scores: torch.Tensor, counts: torch.Tensor, presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's presence and frequency penalties: `scores` [V] minus `frequency` per occurrence in `counts` [V],
    minus `presence` once for every token that occurs."""
    return scores - frequency * counts.to(scores.dtype) - presence * (counts > 0).to(scores.dtype)


def repetition_penalize(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, as transformers applies it): the logits [V] of the tokens
    `seen` [S] divided by `penalty` where positive, multiplied where negative."""
    picked = scores.gather(0, seen)
    return scores.scatter(0, seen, torch.where(picked < 0, picked * penalty, picked / penalty))


def scale(scores: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """`scores` [R, V] divided by each row's `temperature` [R] (all > 0)."""
    return scores / temperature.to(scores.dtype).unsqueeze(-1)


def keep_top_k(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """`scores` [R, V] with all but each row's `k` [R] largest at -inf (k <= 0: the whole row; ties at the k-th
    value are kept)."""
    vocab = scores.size(-1)
    k = torch.where(k <= 0, vocab, k.clamp(max=vocab)).to(torch.int64)
    kth = scores.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1).unsqueeze(-1))  # [R, 1]
    return scores.masked_fill(scores < kth, float("-inf"))


def keep_top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2020): per row of `scores` [R, V], the fewest most likely tokens whose
    probability adds up to `p` [R] (in (0, 1]) or more; the rest at -inf. The most likely token always stays."""
    ordered, order = scores.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above each one
    p = p.to(probs.dtype).unsqueeze(-1)
    drop = (before >= p) & (p < 1)  # at 1 nothing goes (a rounded sum may reach 1 before the last token)
    drop[..., 0] = False
    return scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def draw_tokens(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [R, V] (rows of a distribution), drawn with `generator`: [R]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
