"""Calibration samples that mix every kind of passkey prompt (`data.format: mixed` in a recipe): the kinds of
duocal/data/prompt_kinds.py (number, word and UUID values; the chat template and plain text; the repeated
sentences and the GPL-3.0 text), each prompt followed by its answer written out, and only the answer's tokens
scored (`predict_positions`: the rows that predict them), so the distillation loss is the answer's.

Sample i of a seed is always the same (its kind is mix[i % len(mix)], its length and depth are drawn from the
seed and i): a resumed run, or a run on more processes, sees the same data, as with `PasskeyGenerator`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from duocal.data.chat_answers import answered_chat
from duocal.data.chat_prompts import FRAMINGS, chat_prompts, check_chat_template
from duocal.data.needle_values import VALUE_KINDS, check_choices
from duocal.data.prompt_kinds import needs_template, prompt_mix


@dataclass(frozen=True)
class MixedSample:
    input_ids: tuple[int, ...]  # the prompt in its framing, then the answer
    prompt_end: int  # the answer's first token
    kind: str  # prompt_kinds.PromptKind.describe()

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def predict_positions(self) -> tuple[int, ...]:
        """The rows whose next token is an answer token: every answer token, and nothing else, is scored."""
        return tuple(range(self.prompt_end - 1, len(self.input_ids) - 1))


@dataclass
class MixedGenerator:
    """Deterministic mixed samples of `context_length` tokens or fewer (an int or an inclusive (min, max)
    range drawn per sample), the key at a depth drawn from `depth`."""

    tokenizer: object
    context_length: int | tuple[int, int]
    values: tuple[str, ...]
    framings: tuple[str, ...]
    haystacks: tuple[str, ...]
    depth: tuple[float, float] = (0.05, 0.95)
    seed: int = 0

    def __post_init__(self):
        check_choices("data.values", self.values, VALUE_KINDS)
        check_choices("data.framings", self.framings, FRAMINGS)
        check_choices("data.haystack", self.haystacks, ("repeated", "text"))
        self.mix = prompt_mix(self.values, self.framings, self.haystacks)
        if needs_template(self.mix):
            check_chat_template(self.tokenizer, "leave chat out of data.framings")

    def sample(self, index: int) -> MixedSample:
        draw = random.Random(f"duocal-mixed:{self.seed}:{index}")
        low, high = (self.context_length,) * 2 if isinstance(self.context_length, int) else self.context_length
        kind = self.mix[index % len(self.mix)]
        length, depth = draw.randint(low, high), draw.uniform(*self.depth)
        answer_room = 48  # the longest answer ("The pass key is <UUID>.") in SmolLM2's tokens is about 40
        (prompt,) = chat_prompts(
            self.tokenizer, length - answer_room, 1, (depth,), kind.haystack, f"{self.seed}:{index}", kind.values,
            kind.framing,
        )  # fmt: skip
        answered = answered_chat(self.tokenizer, prompt)
        return MixedSample(tuple(answered.ids), answered.prompt_end, kind.describe())

    def samples(self, count: int, start: int = 0) -> list[MixedSample]:
        return [self.sample(i) for i in range(start, start + count)]
