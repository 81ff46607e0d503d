"""Haystacks: where the text between the needles comes from.

A haystack is a stream of documents; the passkey generator tokenizes documents until it holds a pool
of enough tokens, then cuts every sample's filler out of that pool. Sources: the built-in synthetic
filler, the classic repeated filler of the passkey task (`"repeated"`), a plain-text file, a JSON-
lines file, or a ``datasets`` dataset (load it from local files yourself, e.g.
``datasets.load_dataset("json", data_files=...)``; nothing is fetched).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duocal.data.filler import SyntheticFiller
from duocal_runtime.files.regular_files import check_regular

_CHUNK_CHARS = 1 << 16  # plain text is tokenized in pieces of about this many characters
# The passkey task's filler (Mohtashami & Jaggi 2023, arXiv 2305.16300): pretrained LLMs read past it.
REPEATED_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@dataclass(frozen=True)
class Haystack:
    """A named, re-readable stream of text documents (``documents()`` starts it from the beginning)."""

    name: str
    documents: Callable[[], Iterable[str]] = field(repr=False)

    @classmethod
    def synthetic(cls, filler: SyntheticFiller | None = None, text_seed: int = 0) -> Haystack:
        filler = filler or SyntheticFiller()
        return cls(f"synthetic(seed={filler.seed}, words={filler.num_words})", lambda: filler.documents(text_seed))

    @classmethod
    def repeated(cls, sentence: str = REPEATED_FILLER) -> Haystack:
        return cls("repeated", lambda: iter(lambda: sentence * 64, None))

    @classmethod
    def from_texts(cls, texts: Iterable[str], name: str = "texts") -> Haystack:
        texts = list(texts)
        return cls(name, lambda: iter(texts))

    @classmethod
    def from_file(cls, path: str | Path, text_field: str = "text") -> Haystack:
        """A ``.jsonl`` file (one JSON object per line, text in ``text_field``) or any plain-text file."""
        path = check_regular(path, "haystack file")
        if path.suffix == ".jsonl":
            return cls(str(path), lambda: _jsonl_texts(path, text_field))
        return cls(str(path), lambda: _text_chunks(path))

    @classmethod
    def from_dataset(cls, dataset: Any, text_field: str = "text") -> Haystack:
        """A ``datasets.Dataset`` or ``IterableDataset`` (or any iterable of dicts) with a text column."""
        if hasattr(dataset, "keys") and not hasattr(dataset, "column_names") and not isinstance(dataset, dict):
            raise ValueError(
                f"pass one split of the dataset (one of {list(dataset.keys())}), not the whole DatasetDict"
            )
        names = getattr(dataset, "column_names", None)
        if names is not None and text_field not in names:
            raise ValueError(f"dataset has no text field {text_field!r}; its columns are {names}")
        return cls(f"dataset({text_field})", lambda: (_field(row, text_field, "dataset row") for row in dataset))

    def token_pool(self, tokenizer: Any, num_tokens: int) -> list[int]:
        """At least ``num_tokens`` tokens (fewer only if the haystack ends first), documents in order."""
        pool: list[int] = []
        for text in self.documents():
            if text and not text.isspace():
                pool.extend(tokenizer.encode(text, add_special_tokens=False, verbose=False))
            if len(pool) >= num_tokens:
                break
        if not pool:
            raise ValueError(f"haystack {self.name} is empty: it has no text to put between the passkeys")
        return pool


def load_haystack(source: Any = "synthetic", text_field: str = "text") -> Haystack:
    """``"synthetic"``, ``"repeated"``, a ``Haystack``, a ``SyntheticFiller``, a file path, a dataset, or a
    list of strings."""
    if isinstance(source, Haystack):
        return source
    if isinstance(source, SyntheticFiller):
        return Haystack.synthetic(source)
    if isinstance(source, str) and source == "synthetic":
        return Haystack.synthetic()
    if isinstance(source, str) and source == "repeated":
        return Haystack.repeated()
    if isinstance(source, (str, Path)):
        return Haystack.from_file(source, text_field)
    if isinstance(source, (list, tuple)) and all(isinstance(t, str) for t in source):
        return Haystack.from_texts(source)
    return Haystack.from_dataset(source, text_field)


def _field(row: Any, text_field: str, where: str) -> str:
    if not isinstance(row, dict) or text_field not in row:
        keys = list(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"{where} has no text field {text_field!r} (it has {keys})")
    text = row[text_field]
    if not isinstance(text, str):
        raise ValueError(f"{where}: field {text_field!r} is {type(text).__name__}, not text")
    return text


def _read(file, path: Path) -> str:
    try:
        return file.read(_CHUNK_CHARS)
    except UnicodeDecodeError:
        raise ValueError(f"haystack file {path} is not UTF-8 text (a binary file?)") from None


def _jsonl_texts(path: Path, text_field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(_decoded(lines, path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"haystack file {path}, line {number}, is not a JSON object: {err}") from None
            yield _field(row, text_field, f"{path}:{number}")


def _decoded(lines, path: Path):
    """The lines of a text file, or ValueError naming it when it is not UTF-8."""
    try:
        yield from lines
    except UnicodeDecodeError:
        raise ValueError(f"haystack file {path} is not UTF-8 text (a binary file?)") from None


def _text_chunks(path: Path) -> Iterator[str]:
    # Cut at whitespace so no word is split between two tokenizer calls.
    with path.open(encoding="utf-8") as file:
        rest = ""
        while chunk := _read(file, path):
            text = rest + chunk
            cut = max(text.rfind(" "), text.rfind("\n"))
            if cut <= 0:
                rest = text
                continue
            yield text[:cut]
            rest = text[cut:]
        if rest:
            yield rest
