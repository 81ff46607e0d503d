"""The kinds of value a needle hides, as RULER varies them: a five-digit number (README's 71432), a pair of
words ("amber-falcon") or a UUID ("3f2a9c4e-1b7d-4e2a-9c3f-5d8e7a6b4c21"). Each kind has a shape; an answer
gives a value when the first span of that shape in it is the value (`first_value`).

A ranking measured on one kind can break on another (a profile that kept every digit key lost RULER's UUID
needle at 0.875), so `duocal tune`'s default prompts mix all three.
"""

from __future__ import annotations

import random
import re
import uuid

NUMBER, WORD, UUID = "number", "word", "uuid"
VALUE_KINDS = (NUMBER, WORD, UUID)
NUMBER_RANGE = (10000, 99999)  # five digits, as README's 71432

ADJECTIVES = (
    "amber", "bitter", "brisk", "calm", "crimson", "dusty", "eager", "faint", "gentle", "golden", "hollow", "icy",
    "jolly", "lunar", "misty", "noble", "olive", "pale", "quiet", "rapid", "rusty", "silver", "solemn", "tidal",
    "velvet", "wild", "woolen", "zesty",
)  # fmt: skip
NOUNS = (
    "anchor", "badger", "beacon", "cactus", "canyon", "falcon", "ferry", "garnet", "harbor", "heron", "island",
    "jigsaw", "kettle", "lantern", "meadow", "nectar", "orchard", "pebble", "quarry", "raven", "saddle", "thistle",
    "tunnel", "violin", "walrus", "willow", "yarrow", "zephyr",
)  # fmt: skip

SHAPES = {
    NUMBER: re.compile(r"\d+"),
    WORD: re.compile(r"[a-z]+-[a-z]+"),
    UUID: re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),
}


def check_kind(kind: str) -> str:
    if kind not in VALUE_KINDS:
        raise ValueError(f"a needle's value is one of {', '.join(VALUE_KINDS)}, got {kind!r}")
    return kind


def draw_value(kind: str, draw: random.Random) -> str:
    """A value of `kind` drawn from `draw` (the same seed gives the same values)."""
    if check_kind(kind) == NUMBER:
        return str(draw.randint(*NUMBER_RANGE))
    if kind == WORD:
        return f"{draw.choice(ADJECTIVES)}-{draw.choice(NOUNS)}"
    return str(uuid.UUID(int=draw.getrandbits(128), version=4))


def kind_of(value: object) -> str:
    """The kind a value has (an int is a number)."""
    text = str(value)
    for kind in VALUE_KINDS:
        if SHAPES[kind].fullmatch(text):
            return kind
    raise ValueError(f"{value!r} is not a needle value ({', '.join(VALUE_KINDS)})")


def first_value(kind: str, text: str) -> re.Match | None:
    """The first span of `kind`'s shape in `text` (case ignored for words and UUIDs)."""
    return SHAPES[check_kind(kind)].search(text if kind == NUMBER else text.lower())


def check_choices(option: str, given: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    """Refuse an option's list that is empty, names a choice twice or one not `allowed`."""
    bad = [g for g in given if g not in allowed]
    if bad or not given or len(set(given)) != len(given):
        raise ValueError(
            f"{option} takes {', '.join(allowed)}, each once (e.g. {','.join(allowed)}), "
            f"got {','.join(given) or 'none'}"
        )
