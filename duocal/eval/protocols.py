"""When the questions are asked: with the context (query-aware) or after it (query-agnostic, multi-turn).

`query-aware` prefills context + question together, as most KV-cache evaluations do; it favours
policies that choose what to keep by the question (SnapKV, H2O). The two others prefill the context
alone through the cache, so its policies evict knowing nothing of the questions, as a served long
document or chat is asked. `query-agnostic` then asks every question on its own copy of that
compressed cache; `multi-turn` asks them one after another on the one cache, each after the model's
own earlier answers (a conversation: every turn's question and answer stay in the cache, and
evicting policies keep evicting while it grows). DuoAttention's head split does not depend on the query.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from duocal.data import PasskeySample
from duocal.data.padding import pad_batch
from duocal.measure.decoding import greedy, prefill, question_start

PROTOCOLS = ("query-aware", "query-agnostic", "multi-turn")
CHOICES = (*PROTOCOLS, "both", "all")  # both: query-aware and query-agnostic; all: the three
SINGLE_QUESTION = ("query-aware", "query-agnostic", "both")  # for tasks that ask one question per context


def protocols_of(choice: str, choices: tuple[str, ...] = CHOICES) -> tuple[str, ...]:
    if choice not in choices:
        raise ValueError(f"unknown protocol {choice!r}; choose one of {', '.join(choices)}")
    return {"both": PROTOCOLS[:2], "all": PROTOCOLS}.get(choice, (choice,))


@dataclass(frozen=True)
class Batch:
    """Questions asked with their context (query-aware): each prompt holds the earlier questions
    of its sample with their correct answers."""

    input_ids: torch.Tensor  # [B, T] left-padded prompts
    attention_mask: torch.Tensor  # [B, T]
    answers: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Work:
    """One context's samples, and the same questions in batches for the query-aware protocol."""

    samples: tuple[PasskeySample, ...]
    batches: tuple[Batch, ...]

    @property
    def questions(self) -> int:
        return sum(len(s.answers) for s in self.samples)


def make_batches(samples: Sequence[PasskeySample], batch_size: int, pad_id: int) -> list[Batch]:
    asks = [(s.prompt(i), a.ids) for s in samples for i, a in enumerate(s.answers)]
    out = []
    for i in range(0, len(asks), batch_size):
        chunk = asks[i : i + batch_size]
        ids, mask = pad_batch([prompt for prompt, _ in chunk], pad_id, left=True)
        out.append(Batch(ids, mask.long(), tuple(answer for _, answer in chunk)))
    return out


@torch.no_grad()
def greedy_answers(model, runtime, batch: Batch, pad_id: int) -> tuple[list[tuple[int, ...]], int]:
    """Greedy continuations (as long as each answer) through the runtime's cache, and its bytes."""
    cache = runtime.new_cache()
    out = model.generate(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        cache=cache,
        do_sample=False,
        max_new_tokens=max(len(a) for a in batch.answers),
        pad_token_id=pad_id,
    )
    new = out[:, batch.input_ids.shape[1] :].tolist()  # [B, new tokens]
    return [tuple(row[: len(a)]) for row, a in zip(new, batch.answers, strict=True)], cache.kv_bytes()


@dataclass(frozen=True)
class Asked:
    """What asking a sample's questions after its context gave."""

    answers: list[tuple[int, ...]]  # one per question, as long as its expected answer (or shorter at EOS)
    kv_bytes: int  # the most bytes the cache (or one copy) held
    seen: list[int]  # tokens the cache had seen when each question came


@torch.no_grad()
def answers_on_copies(model, runtime, sample: PasskeySample) -> Asked:
    """The query-agnostic protocol: the context's cache once, each question on its own copy of it."""
    context = sample.input_ids[: question_start(sample)]
    cache = prefill(model, runtime, context)
    seen, answers, nbytes = int(cache.get_seq_length()), [], 0
    for answer in sample.answers:
        asked = copy.deepcopy(cache)
        answers.append(
            greedy(model, context + sample.input_ids[answer.asked_at : answer.start], asked, len(answer.ids))
        )
        nbytes = max(nbytes, asked.kv_bytes())
    return Asked(answers, nbytes, [seen] * len(answers))


@torch.no_grad()
def answers_in_turns(model, runtime, sample: PasskeySample) -> Asked:
    """The multi-turn protocol: the context's cache, then every question in order on that one cache,
    each after the model's own earlier answers (the sample's text between answers is each turn)."""
    ids = list(sample.input_ids[: question_start(sample)])
    cache = prefill(model, runtime, ids)
    answers, seen, turn_start = [], [], len(ids)
    for answer in sample.answers:
        seen.append(int(cache.get_seq_length()))
        ids += sample.input_ids[turn_start : answer.start]
        answers.append(greedy(model, ids, cache, len(answer.ids)))
        ids += answers[-1]
        turn_start = answer.end
    return Asked(answers, cache.kv_bytes(), seen)


ASK_AFTER = {"query-agnostic": answers_on_copies, "multi-turn": answers_in_turns}
