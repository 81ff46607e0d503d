"""How passkeys are written: the text of a needle, of a question and of its answer.

A format is two templates with ``{key}`` and ``{value}`` placeholders: ``needle`` is inserted into
the haystack, ``question`` is appended after it and its ``{value}`` is the answer the model must
produce. Everything before the answer's first token is the prompt.

Presets (``FORMATS``, keyed by the names users type):

- ``"nato"``: upstream DuoAttention's calibration data (``duo_attn/data.py``): keys are ordinals,
  values are sequences of NATO alphabet words, "Remember this sequence of words, it's the {key}
  passkey to the vault".
- ``"digits"``: the classic passkey task (Mohtashami & Jaggi, 2023, arXiv 2305.16300) with several
  named keys: values are digit strings.
- ``"demo"``: the symbolic format the bundled demo model is trained on: one character per token,
  ``#`` key value ``;`` in the haystack and ``?`` key → value at the end. Keys are drawn from the
  value alphabet and every symbol is distinct within a sample.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NATO_ALPHABET = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliett",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)
ORDINALS = (
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
    "thirteenth",
    "fourteenth",
    "fifteenth",
    "sixteenth",
    "seventeenth",
    "eighteenth",
    "nineteenth",
    "twentieth",
)
DIGITS = tuple("0123456789")
# Demo symbols: one character (= one token of the demo tokenizer) each, disjoint from the
# lowercase letters of the synthetic filler, so a copied symbol occurs once in the context.
DEMO_PASSKEY_FORMAT = "demo"  # the format the bundled demo model was trained on
DEMO_VALUES = tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
# Separate key symbols, used only early in the demo model's curriculum (see recipes/demo_model.yaml).
DEMO_KEYS = tuple("αβγδεζηθικλμνξοπρστυφχψω")


@dataclass(frozen=True)
class PasskeyFormat:
    """Templates and alphabets of one way of writing passkeys.

    needle / question: text with ``{key}`` and ``{value}``; ``question``'s ``{value}`` is the answer.
    keys: the names needles are asked by (distinct within a sample); ``None`` draws them from
        ``values`` like a one-symbol value.
    values, value_length, joiner: a value is ``value_length`` symbols of ``values`` joined by ``joiner``.
    distinct: no symbol occurs twice in a sample (keys included when they share the alphabet).
    prefix / suffix: text before the haystack and between the haystack and the questions.
    """

    needle: str
    question: str
    values: tuple[str, ...]
    value_length: int
    keys: tuple[str, ...] | None = None
    joiner: str = ""
    distinct: bool = False
    prefix: str = ""
    suffix: str = ""

    def __post_init__(self):
        if self.needle.count("{key}") != 1 or self.needle.count("{value}") != 1:
            raise ValueError(f"format needle needs exactly one {{key}} and one {{value}}: {self.needle!r}")
        if self.question.count("{value}") != 1 or "{key}" not in self.question.split("{value}")[0]:
            raise ValueError(f"format question needs a {{key}} and then exactly one {{value}}: {self.question!r}")
        if self.value_length < 1 or not self.values:
            raise ValueError("format needs a non-empty value alphabet and value_length >= 1")
        if self.distinct and self.value_length > len(set(self.values)):
            raise ValueError(f"distinct values of length {self.value_length} need at least that many symbols")

    def replace(self, **changes) -> PasskeyFormat:
        return dataclasses.replace(self, **changes)

    def max_passkeys(self) -> int:
        """How many needles one sample can hold with distinct keys (and symbols, if ``distinct``)."""
        key_pool = len(self.keys) if self.keys is not None else len(self.values)
        if not self.distinct:
            return key_pool
        if self.keys is None:
            return len(set(self.values)) // (self.value_length + 1)
        shared = set(self.keys) & set(self.values)
        if not shared:
            return min(key_pool, len(set(self.values)) // self.value_length)
        return len(set(self.keys) | set(self.values)) // (self.value_length + 1)


FORMATS: dict[str, PasskeyFormat] = {
    "nato": PasskeyFormat(
        prefix="This is a very long story book: <book> ",
        needle="\n\nRemember this sequence of words, it's the {key} passkey to the vault: {value}\n\n",
        suffix=" </book>.\n\n",
        question="Based on the content of the book, what is the {key} passkey to the vault?\nPasskey: {value}\n\n",
        keys=ORDINALS,
        values=NATO_ALPHABET,
        value_length=8,
        joiner=" ",
    ),
    "digits": PasskeyFormat(
        prefix="There is important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.\n",
        needle=" The {key} pass key is {value}. Remember it. ",
        suffix="\n",
        question="What is the {key} pass key? The {key} pass key is {value}.\n",
        keys=ORDINALS,
        values=DIGITS,
        value_length=5,
    ),
    "demo": PasskeyFormat(
        needle="#{key}{value};",
        question="?{key}{value};",
        values=DEMO_VALUES,
        value_length=5,
        keys=None,
        distinct=True,
    ),
}


def get_format(name_or_format: str | PasskeyFormat) -> PasskeyFormat:
    if isinstance(name_or_format, PasskeyFormat):
        return name_or_format
    if name_or_format not in FORMATS:
        raise ValueError(f"unknown passkey format {name_or_format!r}; choose one of {sorted(FORMATS)}")
    return FORMATS[name_or_format]
