"""A chat prompt with its answer written out, for measuring heads where users read them (`duocal profile
--format chat`).

The profiler scores the positions that predict the key in the assistant's answer ("The pass key is
71432."), teacher-forced after the model's chat template, and the needle is the key's sentence in the
user turn. Scores measured this way rank heads on the format a chat user sends, not on raw text
ending in "The pass key is" (ranked on raw text, the quick-start profile missed 2 more chat answers in 8
than full attention at 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from duocal.data.chat_prompts import PLAIN_CUE, README_FRAMING, TEXT_FRAMING, ChatPrompt, prompt_ids, special_prefix

ANSWER = "The pass key is {key}."
PLAIN_ANSWER = " {key}."  # after the plain framing's cue, "The pass key is"


@dataclass(frozen=True)
class AnsweredChat:
    """Token ids of prompt + answer, the needle's token span [start, end), the rows that predict the key,
    and where the prompt ends (the answer's first position)."""

    ids: list[int]
    needle: tuple[int, int]
    rows: list[int]
    prompt_end: int


def answered_chat(tokenizer, prompt: ChatPrompt) -> AnsweredChat:
    """`prompt` in its framing (the chat template, or plain text ending in the cue), the answer appended; raises
    `ValueError` when the tokenizer cannot map the needle's characters to tokens (no offsets, or a template that
    splits it)."""
    framing = README_FRAMING if prompt.haystack == "repeated" else TEXT_FRAMING
    needle = framing.needle.format(key=prompt.key).strip()  # its spaces belong to the tokens around it
    if prompt.framing == "chat":
        messages = [{"role": "user", "content": prompt.text}]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        answer, lead = ANSWER.format(key=prompt.key), 0
    else:
        rendered, answer = prompt.text + PLAIN_CUE, PLAIN_ANSWER.format(key=prompt.key)
        lead = len(special_prefix(tokenizer))  # the tokenizer's own first tokens (a BOS) come before the text
    ids = prompt_ids(tokenizer, prompt.text, prompt.framing)
    start = rendered.index(prompt.text) + prompt.text.index(needle)
    span = token_span(tokenizer, rendered, ids[lead:], (start, start + len(needle)))
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    at = answer.index(str(prompt.key))
    first, end = token_span(tokenizer, answer, answer_ids, (at, at + len(str(prompt.key))))
    rows = [len(ids) + i - 1 for i in range(first, end)]  # each row predicts the next token: the key's
    return AnsweredChat(ids + answer_ids, (span[0] + lead, span[1] + lead), rows, len(ids))


def prompt_and_answer(tokenizer, prompt: ChatPrompt) -> tuple[list[int], list[int]]:
    """The prompt's tokens and its expected answer's: "The pass key is K." after the chat template, " K." after
    the plain framing's cue."""
    sample = answered_chat(tokenizer, prompt)
    return sample.ids[: sample.prompt_end], sample.ids[sample.prompt_end :]


def token_span(tokenizer, rendered: str, ids: list[int], chars: tuple[int, int]) -> tuple[int, int]:
    """The tokens [start, end) of `ids` (= `rendered` tokenized) that overlap the characters `chars`
    (a token holding the key and a neighbour counts: offsets, not a second tokenization, decide)."""
    try:
        encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as error:  # slow tokenizers have no offsets
        raise ValueError("the chat format needs a fast tokenizer (character offsets); use --format digits") from error
    if list(encoded["input_ids"]) != ids:
        raise ValueError(
            "the chat template's tokens differ from its text's: cannot place the needle; use --format digits"
        )
    inside = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < chars[1] and b > chars[0]]
    return inside[0], inside[-1] + 1
