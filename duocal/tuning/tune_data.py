"""What `duocal tune` measures quality on: the user's chat conversations with expected answers (a JSONL
file), a plain text (perplexity), or, without data, the chat-format passkey prompts the profiler uses
(with a seed of their own: no key is shared with the profiler's or the evaluation's prompts).

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

from duocal_runtime.files.regular_files import read_text

TUNE_SEED = 5151  # not the profiler's (4242) nor the evaluation's (7777)
PASSKEY_HAYSTACKS = ("repeated", "text")  # the default prompts alternate between both chat haystacks
SHORT_ANSWER_TOKENS = 32  # exact match of the greedy answer is measured up to this many answer tokens


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
    haystacks: tuple[str, ...] = PASSKEY_HAYSTACKS  # passkey: prompts alternate between these

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "fingerprint": self.fingerprint}


def fingerprint(content: bytes) -> str:
    return "sha256:" + hashlib.sha256(content).hexdigest()


def passkey_data(
    samples: int, context: int, seed: int = TUNE_SEED, haystacks: tuple[str, ...] = PASSKEY_HAYSTACKS
) -> TuneData:
    """The generated chat passkey prompts: `seed` and the chat haystacks they alternate between (checked)."""
    bad = [h for h in haystacks if h not in PASSKEY_HAYSTACKS]
    if bad or not haystacks or len(set(haystacks)) != len(haystacks):
        raise ValueError(
            f"--haystack takes {' and/or '.join(PASSKEY_HAYSTACKS)}, each once (e.g. repeated,text), "
            f"got {','.join(haystacks) or 'none'}"
        )
    settings = {"seed": seed, "samples": samples, "context": context, "haystacks": haystacks}
    name = f"chat passkey prompts (seed {seed}, haystacks {' and '.join(haystacks)})"
    digest = fingerprint(json.dumps(settings, sort_keys=True).encode())
    return TuneData("passkey", name, digest, seed=seed, haystacks=tuple(haystacks))


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
