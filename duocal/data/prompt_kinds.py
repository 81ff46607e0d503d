"""Kinds of passkey prompt, mixed: a value (a five-digit number, a word pair, a UUID), a framing (the model's chat
template, or plain text ending in "The pass key is") and a haystack (README's repeated sentences, or the GPL-3.0
text). A ranking or a choice measured on one kind can hold that kind and break on another (a profile that kept
every digit pass key lost RULER's UUID needle at 0.875), so `duocal tune` measures on a mix by default and
`duocal profile` can rank heads on one.

Prompt i takes kind i of `prompt_mix` (ordered so that any few consecutive prompts already vary all three), the
depth 0.25, 0.5 or 0.75 in turn, and a length of `lengths[...]` times the context; its key is drawn from the seed
and i. The first kind is README's quick-start prompt (a number, in the chat template, in the repeated sentences).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from duocal.data.chat_prompts import CHAT_DEPTHS, ChatPrompt, chat_prompts


@dataclass(frozen=True)
class PromptKind:
    values: str  # number, word or uuid
    framing: str  # chat or plain
    haystack: str  # repeated or text

    def describe(self) -> str:
        return f"{self.values} in {self.framing}, {self.haystack}"


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
    lengths: tuple[float, ...] = (1.0,),
    depths: tuple[float, ...] = CHAT_DEPTHS,
) -> list[ChatPrompt]:
    """`samples` prompts, prompt i of kind `mix[i % len(mix)]` and of at most `lengths[...] * context` tokens
    (lengths alternate in pairs, so that each pairs with every haystack and framing), its key drawn from
    `seed` and i."""
    out = []
    for i in range(samples):
        kind = mix[i % len(mix)]
        length = round(context * lengths[(i + 1) // 2 % len(lengths)])
        depth = depths[i % len(depths)]
        (prompt,) = chat_prompts(
            tokenizer, length, 1, (depth,), kind.haystack, f"{seed}:{i}", kind.values, kind.framing
        )
        out.append(prompt)
    return out


def needs_template(mix: list[PromptKind]) -> bool:
    return any(kind.framing == "chat" for kind in mix)
