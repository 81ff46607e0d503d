"""The passkey prompts `duocal tune` measures on when no `--data` is given: every kind of needle a user may
serve, since they have not said which (duocal/data/prompt_kinds.py), with the answer each should get.

Two sets, so that a choice made on one is checked on prompts it never saw: the measuring set at the context,
and the confirming set with other keys (its own seed) at 0.75x and 1.5x the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from duocal.data.chat_answers import prompt_and_answer
from duocal.data.prompt_kinds import PromptKind, mixed_prompts

MEASURE_LENGTHS = (1.0,)
CONFIRM_LENGTHS = (0.75, 1.5)


def confirming_seed(seed: int | str) -> str:
    """The confirming set's seed: other keys than the measuring set's `seed`."""
    return f"{seed}:confirm"


@dataclass(frozen=True)
class AnsweredPrompt:
    prompt: list[int]  # the prompt's tokens (the chat template with the assistant's turn opened, or plain)
    answer: list[int]  # the expected answer's tokens
    key: int | str | None = None  # passkey prompts: scored by the free greedy answer's first value of its kind


def answered_prompts(
    tokenizer,
    samples: int,
    context: int,
    seed: int | str,
    mix: list[PromptKind],
    lengths: tuple[float, ...] = MEASURE_LENGTHS,
) -> list[AnsweredPrompt]:
    """`samples` prompts of the kinds of `mix` (prompt_kinds.mixed_prompts) as token ids, each with its answer's."""
    out = []
    for prompt in mixed_prompts(tokenizer, samples, context, seed, mix, lengths):
        prompt_ids, answer_ids = prompt_and_answer(tokenizer, prompt)
        out.append(AnsweredPrompt(prompt_ids, answer_ids, prompt.key))
    return out
