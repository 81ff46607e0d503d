"""The built-in synthetic haystack: pseudo-words drawn from a small lexicon.

Letters inside a word are predictable from the word's beginning, so a model trained on it gains
from local attention; which word comes next is not, so nothing far away helps. That is the
split DuoAttention needs: local (streaming) heads for the filler, retrieval heads for passkeys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class SyntheticFiller:
    """Space-separated words, each drawn uniformly from a lexicon of ``num_words`` pseudo-words.

    The lexicon is a function of ``seed`` only; the text of a haystack of its ``text_seed``.
    """

    num_words: int = 48
    letters: str = "abcdefghijklmnopqrstuvwxyz"
    min_word_length: int = 2
    max_word_length: int = 6
    seed: int = 0

    def __post_init__(self):
        if self.num_words < 1 or not self.letters:
            raise ValueError("SyntheticFiller needs num_words >= 1 and some letters")
        if not 1 <= self.min_word_length <= self.max_word_length:
            raise ValueError("SyntheticFiller needs 1 <= min_word_length <= max_word_length")
        possible = sum(len(set(self.letters)) ** n for n in range(self.min_word_length, self.max_word_length + 1))
        if possible < self.num_words:
            raise ValueError(f"only {possible} distinct words exist for these letters and lengths")

    @cached_property
    def lexicon(self) -> tuple[str, ...]:
        rng = random.Random(f"duocal-filler-lexicon:{self.seed}")
        letters = sorted(set(self.letters))
        words: list[str] = []
        seen: set[str] = set()
        while len(words) < self.num_words:
            length = rng.randint(self.min_word_length, self.max_word_length)
            word = "".join(rng.choice(letters) for _ in range(length))
            if word not in seen:
                seen.add(word)
                words.append(word)
        return tuple(words)

    def text(self, num_words: int, rng: random.Random) -> str:
        """``num_words`` words joined (and ended) by single spaces."""
        lexicon = self.lexicon
        return "".join(lexicon[rng.randrange(len(lexicon))] + " " for _ in range(num_words))

    def documents(self, text_seed: int = 0, words_per_document: int = 4096):
        """An endless, deterministic stream of filler documents."""
        rng = random.Random(f"duocal-filler-text:{self.seed}:{text_seed}")
        while True:
            yield self.text(words_per_document, rng)
