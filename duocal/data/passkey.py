"""Synthetic multi-passkey retrieval samples, for calibration and for evaluation.

A sample is a haystack with several needles (a key and a value each) inserted at depths drawn from
a range, then questions that ask for one or all of the values by key. Labels are set on the answer
tokens only; calibration distils on the positions that predict them (DuoAttention, Xiao et al.,
ICLR 2025, arXiv 2410.10819, §3.2) and evaluation greedily decodes from the prompt and compares
with the answer ids (exact match).

Pieces (needles, questions) are tokenized on their own and joined as ids, like upstream
DuoAttention's ``MultiplePasskeyRetrievalDataset``, so every position is known exactly. A piece's
key and value must start and end on token boundaries: a tokenizer that merges them with the
surrounding template text is rejected with a ``ValueError``.

Determinism: sample ``i`` of seed ``s`` is drawn from ``random.Random(f"duocal-passkey:{s}:{i}")``
(Python's string seeding hashes with SHA-512, so it is the same on every machine and process).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from duocal.data.haystack import Haystack, load_haystack
from duocal.data.padding import pad_batch
from duocal.data.passkey_formats import PasskeyFormat, get_format
from duocal.data.templates import encode_blocks

IGNORE_INDEX = -100
QUESTIONS = ("one", "all")


class TokenKind(IntEnum):
    """What each token of a sample is (for loss weights and analysis)."""

    PROMPT = 0  # BOS, the format's prefix and suffix
    HAYSTACK = 1
    NEEDLE = 2  # needle template text, key and value
    QUESTION = 3  # question template text (and its text after the answer)
    ANSWER = 4


@dataclass(frozen=True)
class Needle:
    """One inserted passkey. Spans are ``[start, end)`` token positions in ``input_ids``."""

    key: str
    value: str
    depth: float  # drawn depth in [0, 1]: 0 = right after the prefix, 1 = ends right before the suffix
    start: int
    end: int
    key_span: tuple[int, int]
    value_span: tuple[int, int]


@dataclass(frozen=True)
class Answer:
    """The tokens that answer one question about ``needles[needle]``; ``labels[start:end] == ids``."""

    needle: int
    start: int
    end: int
    ids: tuple[int, ...]
    asked_at: int  # the first token of its question (the answer's start - 1 at the latest)

    @property
    def predict_positions(self) -> range:
        """Positions whose next-token logits predict the answer tokens (``start - 1 … end - 2``)."""
        return range(self.start - 1, self.end - 1)


@dataclass(frozen=True)
class PasskeySample:
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]  # IGNORE_INDEX except on answer tokens
    kinds: tuple[int, ...]  # a TokenKind per token
    needles: tuple[Needle, ...]  # in order of position
    answers: tuple[Answer, ...]  # in order of position

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """Everything before the first answer: what evaluation feeds the model."""
        return self.input_ids[: self.answers[0].start]

    @property
    def answer_ids(self) -> tuple[int, ...]:
        """The expected greedy continuation of ``prompt_ids``."""
        return self.answers[0].ids

    def prompt(self, answer: int) -> tuple[int, ...]:
        """The prompt of the ``answer``-th answer (earlier questions with their correct answers included)."""
        return self.input_ids[: self.answers[answer].start]

    @property
    def predict_positions(self) -> tuple[int, ...]:
        return tuple(p for a in self.answers for p in a.predict_positions)


@dataclass
class PasskeyGenerator:
    """Deterministic multi-passkey samples for any Hugging Face tokenizer.

    context_length: total tokens per sample (questions and answers included); an int or an
        inclusive ``(min, max)`` range drawn uniformly per sample.
    num_passkeys: needles per sample, an int or an inclusive ``(min, max)`` range.
    depth: ``(min, max)`` in [0, 1]; each needle's depth is drawn uniformly from it.
    questions: ``"one"`` asks for one random needle; ``"all"`` asks for every needle, in random order.
    haystack: ``"synthetic"``, a file path (``.jsonl`` or plain text), a ``datasets`` dataset, a
        list of strings or a ``Haystack`` (see ``duocal.data.haystack.load_haystack``).
    format: a preset name from ``duocal.data.passkey_formats.FORMATS`` or a ``PasskeyFormat``.
    add_bos: start every sample with the tokenizer's BOS token (when it has one).
    """

    tokenizer: Any
    context_length: int | tuple[int, int] = 1024
    num_passkeys: int | tuple[int, int] = 1
    depth: tuple[float, float] = (0.0, 1.0)
    questions: str = "one"
    haystack: Any = "synthetic"
    format: str | PasskeyFormat = "digits"
    seed: int = 0
    text_field: str = "text"
    add_bos: bool = True
    pool_tokens: int = 1 << 16
    _pool: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        self.context_length = _range("context_length", self.context_length, minimum=1)
        self.num_passkeys = _range("num_passkeys", self.num_passkeys, minimum=1)
        lo, hi = self.depth = tuple(float(d) for d in self.depth)
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"depth must be a range within [0, 1], got {self.depth}")
        if self.questions not in QUESTIONS:
            raise ValueError(f"questions must be one of {QUESTIONS}, got {self.questions!r}")
        self.format = get_format(self.format)
        if self.num_passkeys[1] > self.format.max_passkeys():
            raise ValueError(
                f"{self.num_passkeys[1]} passkeys do not fit the format: it has distinct keys (and symbols) "
                f"for at most {self.format.max_passkeys()}"
            )
        bos = getattr(self.tokenizer, "bos_token_id", None)
        self._head = ([bos] if self.add_bos and bos is not None else []) + self._encode(self.format.prefix)
        self._tail = self._encode(self.format.suffix)
        haystack: Haystack = load_haystack(self.haystack, self.text_field)
        self._pool = haystack.token_pool(self.tokenizer, max(self.pool_tokens, self.context_length[1]))
        # Fail now, not in the middle of a training run: the largest sample in the smallest context.
        self._build(random.Random(f"duocal-passkey-probe:{self.seed}"), self.context_length[0], self.num_passkeys[1])

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def __getitem__(self, index: int) -> PasskeySample:
        return self.sample(index)

    def sample(self, index: int, context_length: int | None = None) -> PasskeySample:
        """Sample ``index`` of this seed; ``context_length`` replaces the drawn length (e.g. one per batch)."""
        if index < 0:
            raise IndexError("sample indices start at 0")
        rng = random.Random(f"duocal-passkey:{self.seed}:{index}")
        length = rng.randint(*self.context_length)
        return self._build(rng, length if context_length is None else context_length, rng.randint(*self.num_passkeys))

    def samples(self, count: int, start: int = 0, context_length: int | None = None) -> Iterator[PasskeySample]:
        return (self.sample(i, context_length) for i in range(start, start + count))

    def _draw(self, rng: random.Random, count: int) -> tuple[list[str], list[str]]:
        fmt = self.format
        key_pool = list(fmt.keys) if fmt.keys is not None else list(fmt.values)
        keys = rng.sample(key_pool, count)
        if fmt.distinct:
            taken = set(keys)
            free = [v for v in fmt.values if v not in taken]
            symbols = rng.sample(free, count * fmt.value_length)
        else:
            symbols = [rng.choice(fmt.values) for _ in range(count * fmt.value_length)]
        n = fmt.value_length
        return keys, [fmt.joiner.join(symbols[i * n : (i + 1) * n]) for i in range(count)]

    def _build(self, rng: random.Random, length: int, count: int) -> PasskeySample:
        fmt = self.format
        keys, values = self._draw(rng, count)
        depths = sorted(rng.uniform(*self.depth) for _ in range(count))
        asked = rng.sample(range(count), count) if self.questions == "all" else [rng.randrange(count)]
        blocks = [(fmt.needle, k, v) for k, v in zip(keys, values, strict=True)] + [
            (fmt.question, keys[i], values[i]) for i in asked
        ]
        encoded = encode_blocks(self.tokenizer, blocks)
        needles, questions = encoded[:count], encoded[count:]
        fixed = len(self._head) + len(self._tail) + sum(len(b[0]) for b in encoded)
        filler = length - fixed
        if filler < 0:
            raise ValueError(
                f"{count} passkeys need {fixed} tokens with this tokenizer and format, but the context is "
                f"{length} tokens: raise context_length or lower num_passkeys"
            )
        starts = needle_starts(depths, [len(b[0]) for b in needles], filler)
        hay = self._haystack(rng, filler)
        ids: list[int] = list(self._head)
        kinds: list[int] = [TokenKind.PROMPT] * len(ids)
        placed: list[Needle] = []
        used = 0
        for (needle_ids, key_span, value_span), start, d, k, v in zip(
            needles, starts, depths, keys, values, strict=True
        ):
            gap = start - (len(ids) - len(self._head))
            ids += hay[used : used + gap]
            kinds += [TokenKind.HAYSTACK] * gap
            used += gap
            at = len(ids)
            ids += needle_ids
            kinds += [TokenKind.NEEDLE] * len(needle_ids)
            placed.append(Needle(k, v, d, at, len(ids), _shift(key_span, at), _shift(value_span, at)))
        ids += hay[used:]
        kinds += [TokenKind.HAYSTACK] * (filler - used)
        ids += self._tail
        kinds += [TokenKind.PROMPT] * len(self._tail)
        answers = []
        by_key = {n.key: i for i, n in enumerate(placed)}  # needles are placed in depth order
        for i, (question_ids, _, (a, b)) in zip(asked, questions, strict=True):
            at = len(ids)
            ids += question_ids
            kinds += [TokenKind.QUESTION] * len(question_ids)
            kinds[at + a : at + b] = [TokenKind.ANSWER] * (b - a)
            answer = tuple(question_ids[a:b])
            needle = by_key[keys[i]]
            if tuple(ids[slice(*placed[needle].value_span)]) != answer:
                raise ValueError(
                    f"the tokenizer writes the value {values[i]!r} as different tokens in the needle and in the "
                    "answer, so it cannot be retrieved by copying: change the format's text around {value}"
                )
            answers.append(Answer(needle, at + a, at + b, answer, at))
        assert len(ids) == length, (len(ids), length)
        labels = [IGNORE_INDEX] * length
        for answer in answers:
            labels[answer.start : answer.end] = answer.ids
        return PasskeySample(tuple(ids), tuple(labels), tuple(int(k) for k in kinds), tuple(placed), tuple(answers))

    def _haystack(self, rng: random.Random, count: int) -> list[int]:
        pool = self._pool
        offset = rng.randrange(len(pool))
        out = pool[offset : offset + count]
        while len(out) < count:  # a short haystack repeats
            out += pool[: count - len(out)]
        return out


def needle_starts(depths: Sequence[float], lengths: Sequence[int], filler: int) -> list[int]:
    """Start of each needle, in tokens from the start of the context (after the prefix).

    depths: sorted, in [0, 1]; lengths: tokens of each needle; filler: haystack tokens around them.
    Needle i starts at ``round(depth_i * (room - length_i))`` (depth 1 ends the needle at the end of
    the context), pushed right past the previous needle and left so the later ones still fit.
    """
    room = filler + sum(lengths)
    starts, cursor, rest = [], 0, sum(lengths)
    for depth, length in zip(depths, lengths, strict=True):
        start = min(max(round(depth * (room - length)), cursor), room - rest)
        starts.append(start)
        cursor, rest = start + length, rest - length
    return starts


def _range(name: str, value: int | Sequence[int], minimum: int) -> tuple[int, int]:
    lo, hi = (value, value) if isinstance(value, int) else tuple(value)
    if not minimum <= lo <= hi:
        raise ValueError(f"{name} must be an int >= {minimum} or a (min, max) range with min <= max, got {value}")
    return int(lo), int(hi)


def _shift(span: tuple[int, int], offset: int) -> tuple[int, int]:
    return span[0] + offset, span[1] + offset


def collate(samples: Sequence[PasskeySample], pad_token_id: int) -> dict[str, Any]:
    """Right-padded ``input_ids`` / ``labels`` / ``attention_mask`` tensors, each ``[B, T_max]``."""
    ids, mask = pad_batch([s.input_ids for s in samples], pad_token_id)
    labels, _ = pad_batch([s.labels for s in samples], IGNORE_INDEX)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask.long()}
