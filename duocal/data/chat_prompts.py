"""Prompts with a pass key hidden in a haystack, the question after it (README's quick-start prompt).

A prompt is an instruction, haystack sentences, the key sentence at a depth (0: right after the
instruction, 1: right before the question), more haystack, then the question, all in one user turn
of the model's chat template: README's words for the repeated filler, the words of the licence
prompt of the regression test (the key a paragraph of its own) for a real text. The haystack is
cut into sentences so no word is split: `repeated` (the passkey task's five sentences, as in
README) or the sentences of a text file. With 125 repeated sentences on each side it is exactly
README's prompt.

The key is a five-digit number by default; a word pair or a UUID on request (`values`,
duocal/data/needle_values.py). The framing is the model's chat template (`chat`, the default) or the
plain text ending in the answer's cue "The pass key is" (`plain`, as the calibration data and RULER ask).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from duocal.data.haystack import REPEATED_FILLER
from duocal.data.needle_values import NUMBER, draw_value
from duocal_runtime.files.regular_files import read_text

HAYSTACK_TEXT = "gpl-3.0.txt"  # `text`: the GPL-3.0 text in duocal/assets/texts
CHAT_HAYSTACKS = ("repeated", "text")  # or a plain-text file
FRAMINGS = ("chat", "plain")  # the model's chat template, or the plain text ending in PLAIN_CUE
PLAIN_CUE = "\nThe pass key is"
CHAT_DEPTHS = (0.25, 0.5, 0.75)  # where the key sits in the haystack (0: its start, 1: its end), in turn


@dataclass(frozen=True)
class ChatPrompt:
    """One question: its key, where the key sits (0..1 of the haystack) and the user turn's text."""

    key: int | str  # a five-digit number, a word pair or a UUID (needle_values.py)
    depth: float
    text: str
    haystack: str = "readme"
    framing: str = "chat"  # or "plain": `text` then PLAIN_CUE, no chat template


@dataclass(frozen=True)
class Framing:
    """The words around the haystack: an instruction, the key's sentence (`{key}`) and the question."""

    intro: str
    needle: str
    question: str


# README's quick-start prompt, for the repeated filler.
README_FRAMING = Framing(
    "There is important info hidden in this text. Find it and memorize it. ",
    "The pass key is {key}. Remember it. {key} is the pass key. ",
    "\nWhat is the pass key?",
)
# For a real text, the key as a paragraph of its own and a question that points into the text:
# in README's words SmolLM2-135M answers about the text itself ("This License is a special
# version of ..."): 0 of 8 with full attention at 1.3k tokens of the GPL.
TEXT_FRAMING = Framing(
    "Read this text carefully.\n\n",
    "\n\nThe pass key is {key}. Remember it.\n\n",
    "\n\nWhat is the pass key mentioned in the text?",
)


def document(before: list[str], after: list[str], key: int, framing: Framing = README_FRAMING) -> str:
    """The user turn: instruction, `before` sentences, the key, `after` sentences, the question."""
    needle = framing.needle.format(key=key)
    return f"{framing.intro}{''.join(before)}{needle}{''.join(after)}{framing.question}"


def haystack_sentences(haystack: str | Path) -> tuple[str, list[str]]:
    """(name, sentences each with its trailing space) of `repeated`, `text` (the GPL-3.0 text) or a text file."""
    if haystack == "repeated":
        return "repeated", sentences_in(REPEATED_FILLER)
    if haystack == "text":
        licence = (resources.files("duocal") / "assets" / "texts" / HAYSTACK_TEXT).read_text(encoding="utf-8")
        body, name = licence[licence.index("Preamble") :], "text"  # not the title's numbers (version, year)
    elif str(haystack).lower().endswith(".txt"):
        body, name = read_text(Path(haystack), "--haystack"), Path(haystack).name
    else:
        raise ValueError(
            f"the chat format's haystack must be {', '.join(CHAT_HAYSTACKS)} or a .txt file, got {haystack!r}"
        )
    sentences = sentences_in(body)
    if not sentences:
        raise ValueError(f"haystack {name} has no sentences (text ending in . ! or ?) to hide the key between")
    return name, sentences


def sentences_in(body: str) -> list[str]:
    """`body` cut after each sentence or clause end (. ! ? ; : before a space) and each blank line;
    a tail without one is dropped."""
    return re.findall(r".*?(?:[.!?;:]+[\"')\]]*(?:\s+|$)|\n\s*\n\s*)", body, re.S)


def sentences_of(pool: list[str], count: int, cycle: bool) -> list[str]:
    """The first `count` sentences of `pool` (repeated from its start when `cycle`)."""
    if cycle:
        return [pool[i % len(pool)] for i in range(count)]
    return pool[:count]


def depth_cut(sentences: list[str], depth: float) -> int:
    """How many of `sentences` go before the key: the fewest that hold `depth` of their characters."""
    total, held = sum(map(len, sentences)), 0
    for i, sentence in enumerate(sentences):
        if held >= depth * total:
            return i
        held += len(sentence)
    return len(sentences)


def fitted_prompt(
    tokenizer,
    pool: list[str],
    cycle: bool,
    context: int,
    key: int | str,
    depth: float,
    framing: Framing = README_FRAMING,
    template: str = "chat",
) -> str:
    """The longest prompt of at most `context` tokens in `template` (chat or plain), the key after `depth` of its
    haystack's characters."""

    def text(count: int) -> str:
        used = sentences_of(pool, count, cycle)
        cut = depth_cut(used, depth)
        return document(used[:cut], used[cut:], key, framing)

    low, high = 0, len(pool) if not cycle else context  # a sentence is at least one token

    def length(content: str) -> int:
        return len(prompt_ids(tokenizer, content, template))

    if length(text(0)) > context:
        raise ValueError(f"context {context} is too short for the chat prompt's instruction and question")
    while low < high:  # the most sentences that fit
        middle = (low + high + 1) // 2
        low, high = (middle, high) if length(text(middle)) <= context else (low, middle - 1)
    if not cycle and low == len(pool) and length(text(low)) < context * 0.9:
        raise ValueError(
            f"the haystack text is too short for {context} tokens; give a shorter context or a longer text"
        )
    return text(low)


def chat_ids(tokenizer, content: str) -> list[int]:
    """The user turn `content` in the model's chat template, with the assistant's turn opened."""
    messages = [{"role": "user", "content": content}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def prompt_ids(tokenizer, content: str, framing: str = "chat") -> list[int]:
    """`content` as the model reads it: in its chat template (`chat_ids`) or as plain text ending in PLAIN_CUE."""
    if framing == "chat":
        return chat_ids(tokenizer, content)
    if framing != "plain":
        raise ValueError(f"a prompt's framing is one of {', '.join(FRAMINGS)}, got {framing!r}")
    return special_prefix(tokenizer) + list(tokenizer(content + PLAIN_CUE, add_special_tokens=False)["input_ids"])


def special_prefix(tokenizer) -> list[int]:
    """The tokens the tokenizer puts before a text of its own accord (a BOS, or none)."""
    marked = list(tokenizer("a")["input_ids"])
    bare = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    return marked[: marked.index(bare[0])] if bare and bare[0] in marked else []


def check_chat_template(tokenizer, instead: str = "use --format digits") -> None:
    """Raise `ValueError` when the tokenizer has no chat template to put the prompts in (`instead`: what to do)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the chat format needs the model's chat template and this tokenizer has none; {instead}")


def alternating(samples: int, haystacks: tuple) -> list[tuple[object, int]]:
    """(haystack, prompts in it) for `samples` prompts alternating between `haystacks`: the first gets any
    extra prompt, a haystack left with none is left out."""
    counts = [(h, len(range(i, samples, len(haystacks)))) for i, h in enumerate(haystacks)]
    return [(h, n) for h, n in counts if n]


def chat_prompts(
    tokenizer,
    context: int,
    samples: int,
    depths: tuple[float, ...],
    haystack: str | Path,
    seed: int,
    values: str = NUMBER,
    template: str = "chat",
) -> list[ChatPrompt]:
    """`samples` prompts of at most `context` tokens in `template` (chat or plain): keys of kind `values` drawn
    from `seed` (numbers in chat: the draws of every earlier release), depths in turn."""
    name, pool = haystack_sentences(haystack)
    framing = README_FRAMING if name == "repeated" else TEXT_FRAMING
    salt = "" if (values, template) == (NUMBER, "chat") else f":{values}:{template}"
    draw = random.Random(f"duocal-chat-passkey:{seed}{salt}")
    out = []
    for i in range(samples):
        value, depth = draw_value(values, draw), depths[i % len(depths)]
        key = int(value) if values == NUMBER else value
        text = fitted_prompt(tokenizer, pool, name == "repeated", context, key, depth, framing, template)
        out.append(ChatPrompt(key, depth, text, name, template))
    return out
