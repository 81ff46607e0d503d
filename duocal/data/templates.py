"""Rendering passkey templates into token ids while locating the key and the value inside them."""

from __future__ import annotations

import re
from typing import Any

PLACEHOLDER = re.compile(r"(\{key\}|\{value\})")


def render(template: str, key: str, value: str) -> tuple[str, dict[str, tuple[int, int]]]:
    """The template's text and the character spans of its first key and its value.

    A span starts before the whitespace that precedes it (" 4821" is one token in many BPE
    vocabularies, and the prompt should end before it).
    """
    text, spans = "", {}
    for part in PLACEHOLDER.split(template):
        if part in ("{key}", "{value}"):
            name = part[1:-1]
            start = len(text)
            text += key if name == "key" else value
            floor = max((e for _, e in spans.values()), default=0)
            while start > floor and text[start - 1].isspace():
                start -= 1
            spans.setdefault(name, (start, len(text)))
        else:
            text += part
    return text, spans


def encode_blocks(tokenizer: Any, blocks: list[tuple[str, str, str]]):
    """For each (template, key, value): (ids, key token span, value token span), in one tokenizer call."""
    rendered = [render(*b) for b in blocks]
    texts, cuts = [], []
    for text, spans in rendered:
        bounds = sorted({c for span in spans.values() for c in span} - {0, len(text)})
        cuts.append(bounds)
        texts += [text[:c] for c in bounds] + [text]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"])
    out = []
    for (text, spans), bounds in zip(rendered, cuts, strict=True):
        prefixes = [list(next(encoded)) for _ in bounds]
        ids = list(next(encoded))
        token_at = {0: 0, len(text): len(ids)}
        for c, prefix in zip(bounds, prefixes, strict=True):
            if ids[: len(prefix)] != prefix:
                raise ValueError(
                    f"the tokenizer splits the passkey markers: in {text!r} a token crosses the boundary between "
                    f"{text[:c][-20:]!r} and {text[c:][:20]!r}, so the key or value cannot be located. Put "
                    "whitespace or punctuation around {key} and {value} in the format, or use another tokenizer"
                )
            token_at[c] = len(prefix)
        key = spans.get("key", (0, 0))
        value = spans["value"]
        out.append((ids, (token_at[key[0]], token_at[key[1]]), (token_at[value[0]], token_at[value[1]])))
    return out
