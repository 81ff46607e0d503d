"""What `duocal tune` measures quality on: the user's chat conversations with expected answers (a JSONL
file), a plain text (perplexity), or, without data, passkey prompts of every kind of needle
(tune_prompts.py; with a seed of their own: no key is shared with the profiler's or the evaluation's prompts).

Every kind is measured on one set and confirmed on a second: the generated prompts' second set has other
keys and lengths; a user's file is split item by item (odd items measure, even items confirm), so each set
needs MIN_ITEMS_PER_SET items.

A JSONL line is one conversation and the answer expected after it::

    {"messages": [{"role": "user", "content": "..."}], "answer": "The pass key is 71432."}

(`"prompt": "..."` stands for one user message). Files are read and checked before any model loads;
each refusal names the file, the line and what to do.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duocal.data.chat_prompts import FRAMINGS
from duocal.data.needle_values import VALUE_KINDS, check_choices
from duocal_runtime.files.regular_files import read_text

TUNE_SEED = 5151  # not the profiler's (4242) nor the evaluation's (7777)
PASSKEY_HAYSTACKS = ("repeated", "text")  # the default prompts mix both haystacks
SHORT_ANSWER_TOKENS = 32  # exact match of the greedy answer is measured up to this many answer tokens
MIN_ITEMS_PER_SET = {"chat": 8, "text": 2}  # conversations (1 in 8 lost is the rule), text windows


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict[str, str], ...]
    answer: str


@dataclass(frozen=True)
class TuneData:
    """The data, read and checked: `kind` is chat (conversations), text, or passkey (generated later,
    from the tokenizer); `fingerprint` identifies the file's bytes (or the generated prompts' settings)."""

    kind: str
    name: str
    fingerprint: str
    conversations: tuple[Conversation, ...] = ()
    text: str = ""
    seed: int = TUNE_SEED  # passkey: the prompts' seed
    haystacks: tuple[str, ...] = PASSKEY_HAYSTACKS  # passkey: the kinds mix these haystacks,
    values: tuple[str, ...] = VALUE_KINDS  # these values
    framings: tuple[str, ...] = FRAMINGS  # and these framings

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "fingerprint": self.fingerprint}


def fingerprint(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def passkey_data(
    samples: int,
    context: int,
    seed: int = TUNE_SEED,
    haystacks: tuple[str, ...] = PASSKEY_HAYSTACKS,
    values: tuple[str, ...] = VALUE_KINDS,
    framings: tuple[str, ...] = FRAMINGS,
) -> TuneData:
    """The generated passkey prompts: `seed` and the haystacks, values and framings they mix (checked)."""
    for option, given, allowed in (
        ("--haystack", haystacks, PASSKEY_HAYSTACKS),
        ("--values", values, VALUE_KINDS),
        ("--framing", framings, FRAMINGS),
    ):
        check_choices(option, given, allowed)
    settings = {"seed": seed, "samples": samples, "context": context, "haystacks": haystacks}
    settings |= {"values": values, "framings": framings}  # (records before the mix had neither)
    name = (
        f"passkey prompts (seed {seed}; {' and '.join(values)} values; {' and '.join(framings)}; "
        f"haystacks {' and '.join(haystacks)})"
    )
    digest = fingerprint(json.dumps(settings, sort_keys=True).encode())
    return TuneData("passkey", name, digest, seed=seed, haystacks=haystacks, values=values, framings=framings)


def split_sets(items: tuple, kind: str, source: str) -> tuple[tuple, tuple]:
    """(measuring set, confirming set): odd and even items of a user's file; refused when a set would hold
    fewer than MIN_ITEMS_PER_SET items."""
    least = MIN_ITEMS_PER_SET[kind]
    if len(items) < 2 * least:
        what = "conversations" if kind == "chat" else "text windows of --context tokens"
        raise ValueError(
            f"--data {source} gives {len(items)} {what}; duocal tune measures on half and confirms the choice on "
            f"the other half, so it needs at least {2 * least} (give more"
            + (" text, a smaller --context or a larger --samples)" if kind == "text" else " conversations)")
        )
    return items[0::2], items[1::2]


def read_data(path: Path) -> TuneData:
    """A .jsonl file of conversations or a .txt file, checked; `ValueError` naming what is wrong."""
    body = read_text(path, "--data")
    if not body.strip():
        raise ValueError(f"--data {path} is empty; give a JSONL file of conversations or a text file")
    print_name = str(path)
    digest = fingerprint(body.encode("utf-8"))
    if path.suffix.lower() == ".txt":
        return TuneData("text", print_name, digest, text=body)
    if path.suffix.lower() != ".jsonl":
        raise ValueError(
            f"--data {path}: give a .jsonl file (one conversation and its answer per line) or a .txt file (perplexity)"
        )
    lines = [(n, line) for n, line in enumerate(body.splitlines(), 1) if line.strip()]
    return TuneData("chat", print_name, digest, conversations=tuple(conversation(path, n, line) for n, line in lines))


EXPECTED_SHAPE = '{"messages": [{"role": "user", "content": "..."}], "answer": "..."}'


def conversation(path: Path, number: int, line: str) -> Conversation:
    where = f"--data {path} line {number}"
    try:
        item = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where} is not JSON ({err.msg}); each line is one object like {EXPECTED_SHAPE}") from None
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not a JSON object; each line is one object like {EXPECTED_SHAPE}")
    answer = item.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"{where} has no answer: give the expected answer as a non-empty string, {EXPECTED_SHAPE}")
    return Conversation(messages_of(item, where), answer)


def messages_of(item: dict, where: str) -> tuple[dict[str, str], ...]:
    if "prompt" in item and "messages" not in item:
        if not isinstance(item["prompt"], str) or not item["prompt"].strip():
            raise ValueError(f"{where}: prompt must be a non-empty string")
        return ({"role": "user", "content": item["prompt"]},)
    messages = item.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where} has no messages: give a non-empty list, {EXPECTED_SHAPE}")
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and all(isinstance(message.get(k), str) for k in ("role", "content"))):
            raise ValueError(f"{where}: message {i} must be an object with string role and content")
    if messages[-1]["role"] == "assistant":
        raise ValueError(f'{where}: the last message is the assistant\'s; the expected answer goes in "answer"')
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)
