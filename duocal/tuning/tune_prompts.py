"""The passkey prompts `duocal tune` measures on when no `--data` is given: every kind of needle a user may
serve, since they have not said which (a ranking measured on one kind holds that kind and can break on
another).

A kind is a value (a five-digit number, a word pair, a UUID), a framing (the chat template, or plain text
ending in "The pass key is") and a haystack (README's repeated sentences, or the GPL-3.0 text). Prompt i takes
kind i of `prompt_mix` (ordered so that any few consecutive prompts already vary all three), the depth
0.25, 0.5 or 0.75 in turn, and a length of `lengths[...]` times the context. The first kind is README's
quick-start prompt (a number, in the chat template, in the repeated sentences).

Two sets, so that a choice made on one is checked on prompts it never saw: the measuring set at the context,
and the confirming set with other keys (its own seed) at 0.75x and 1.5x the context.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from duocal.data.chat_answers import prompt_and_answer
from duocal.data.chat_prompts import CHAT_DEPTHS, chat_prompts

MEASURE_LENGTHS = (1.0,)
CONFIRM_LENGTHS = (0.75, 1.5)


@dataclass(frozen=True)
class PromptKind:
    values: str  # number, word or uuid
    framing: str  # chat or plain
    haystack: str  # repeated or text

    def describe(self) -> str:
        return f"{self.values} in {self.framing}, {self.haystack}"


@dataclass(frozen=True)
class AnsweredPrompt:
    prompt: list[int]  # the prompt's tokens (the chat template with the assistant's turn opened, or plain)
    answer: list[int]  # the expected answer's tokens
    key: int | str | None = None  # passkey prompts: scored by the free greedy answer's first value of its kind


def prompt_mix(values: tuple[str, ...], framings: tuple[str, ...], haystacks: tuple[str, ...]) -> list[PromptKind]:
    """Every combination, ordered so that consecutive kinds differ in value, framing and haystack where they
    can (3 values x 2 framings x 2 haystacks: the first 4 kinds hold both framings and haystacks and all
    three values)."""
    every = [PromptKind(v, f, h) for v, f, h in itertools.product(values, framings, haystacks)]
    ordered: list[PromptKind] = []
    for i in range(4 * len(every)):
        kind = PromptKind(values[i % len(values)], framings[i % len(framings)], haystacks[i // 2 % len(haystacks)])
        if kind not in ordered:
            ordered.append(kind)
    return ordered + [k for k in every if k not in ordered]


def mixed_prompts(
    tokenizer,
    samples: int,
    context: int,
    seed: int | str,
    mix: list[PromptKind],
    lengths: tuple[float, ...] = MEASURE_LENGTHS,
) -> list[AnsweredPrompt]:
    """`samples` prompts, prompt i of kind `mix[i % len(mix)]` and of at most `lengths[...] * context` tokens
    (lengths alternate in pairs, so that each pairs with every haystack and framing), its key drawn from
    `seed` and i."""
    out = []
    for i in range(samples):
        kind = mix[i % len(mix)]
        length = round(context * lengths[(i + 1) // 2 % len(lengths)])
        depth = CHAT_DEPTHS[i % len(CHAT_DEPTHS)]
        (prompt,) = chat_prompts(
            tokenizer, length, 1, (depth,), kind.haystack, f"{seed}:{i}", kind.values, kind.framing
        )
        prompt_ids, answer_ids = prompt_and_answer(tokenizer, prompt)
        out.append(AnsweredPrompt(prompt_ids, answer_ids, prompt.key))
    return out


def needs_template(mix: list[PromptKind]) -> bool:
    return any(kind.framing == "chat" for kind in mix)
