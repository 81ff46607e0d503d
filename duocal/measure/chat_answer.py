"""A chat answer and its rule, one for `profile`, `tune` and `eval`: an answer is `exact` when the first span shaped
like the key (its first number, for a number) is the key, and `clean` when no phrase of three words comes twice
before that span (a garbled answer repeats itself: "The pass key is the pass key is 71432"). `right`, exact and
clean, is what `profile` and `tune` count as a right answer; `eval` reports exact and clean apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from duocal.data.chat_prompts import CHAT_HAYSTACKS
from duocal.data.needle_values import NUMBER, first_value, kind_of

PHRASE_WORDS = 3
NEW_TOKENS = 16  # greedy tokens of a free answer


@dataclass(frozen=True)
class ChatAnswer:
    """A greedy answer to one prompt (named by its haystack) and key, and how it scores."""

    prompt: str
    key: int | str  # a number, a word pair or a UUID (duocal/data/needle_values.py)
    text: str

    @property
    def given(self) -> re.Match | None:
        """The first span of the key's shape in the answer (its first number, for a number)."""
        return first_value(kind_of(self.key), self.text)

    @property
    def exact(self) -> bool:
        found = self.given
        if found is None:
            return False
        if kind_of(self.key) == NUMBER:
            return int(found.group()) == int(self.key)
        return found.group() == str(self.key).lower()

    @property
    def clean(self) -> bool:
        """No phrase of PHRASE_WORDS words twice before the first span of the key's shape (without one: before the
        first digit, else in the whole answer)."""
        found = self.given or re.search(r"\d", self.text)
        return not repeats_a_phrase(self.text[: found.start()] if found else self.text)

    @property
    def right(self) -> bool:
        """Exact and clean: what `profile` (whether full attention's own answer is scored) and `tune` (the answers a
        plan loses) count as a right answer; `eval` reports exact and clean apart."""
        return self.exact and self.clean


def repeats_a_phrase(text: str, words: int = PHRASE_WORDS) -> bool:
    """Whether some run of `words` consecutive words (case and punctuation ignored) occurs twice."""
    tokens = re.findall(r"[a-z']+", text.lower())
    phrases = [tuple(tokens[i : i + words]) for i in range(len(tokens) - words + 1)]
    return len(phrases) != len(set(phrases))


def check_chat(depths, answer_tokens: int, protocol: str, questions: str, haystack) -> None:
    """Raise `ValueError` for options the chat format cannot take (cheap: no tokenizer)."""
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad or not depths:
        raise ValueError(
            f"depths must be in [0, 1] (where the key sits in the haystack: 0 its start, 1 its end), "
            f"got {', '.join(map(str, bad)) or 'none'}"
        )
    if answer_tokens < 1:
        raise ValueError(f"answer tokens must be at least 1, got {answer_tokens}")
    if protocol != "query-aware" or questions != "one":
        raise ValueError("the chat format asks one question after its document: leave --protocol and --questions out")
    if not (isinstance(haystack, str) and (haystack in CHAT_HAYSTACKS or haystack.lower().endswith(".txt"))):
        raise ValueError(
            f"the chat format's haystack must be {', '.join(CHAT_HAYSTACKS)} or a .txt file, got {haystack!r}"
        )
