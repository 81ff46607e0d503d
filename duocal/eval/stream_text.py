"""The tokens `duocal eval stream` reads: a text file, a fifo or stdin read a piece at a time (a multi-MB file
is never tokenized whole up front, a fifo streams until enough tokens came), or the default text.

The default text is built offline, in a fixed order, from what every install has: the docstrings of the
running Python's standard library (the PSF licence allows copying) and the texts in duocal/assets/texts,
cycled (about 300k SmolLM2 tokens before it repeats; a sink-window head never sees that far back).

Rows replay one `TokenTape`: the first row reads the source, later rows read what it recorded, so stdin
and fifos serve every row.
"""

from __future__ import annotations

import ast
import os
import re
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from importlib import resources
from itertools import cycle
from pathlib import Path

import numpy as np

from duocal_runtime.files.atomic import KINDS
from duocal_runtime.files.regular_files import file_mode

PIECE_CHARS = 1 << 16  # text is read and tokenized in pieces of about this many characters
SHORTEST_DOCSTRING = 200  # characters: shorter ones are mostly signatures


def text_pieces(source: str | None) -> Iterator[str]:
    """Pieces of the text: `source` a path (a regular file or a fifo), '-' for stdin, None for the default."""
    if source is None:
        return default_text_pieces()
    if source == "-":
        return _checked(_pieces_of(sys.stdin.buffer), "stdin")
    path = check_text_source(source)
    return _checked(_file_pieces(path), f"--text {path}")


def check_text_source(source: str) -> Path:
    """A regular file that is not empty, or a fifo; refused with what it is otherwise."""
    path = Path(source)
    mode = file_mode(path, "--text")
    if stat.S_ISDIR(mode):
        raise ValueError(f"--text {path} is a folder; give a text file, a fifo or '-' for stdin")
    if stat.S_ISREG(mode) and path.stat().st_size == 0:
        raise ValueError(f"--text {path} is empty; give a long text")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        kind = next((k for test, k in KINDS.items() if test(mode)), "not a file")
        raise ValueError(f"--text {path} is {kind}; give a text file, a fifo or '-' for stdin")
    return path


def _file_pieces(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        yield from _pieces_of(handle)


def _pieces_of(handle) -> Iterator[bytes]:
    """What the file, fifo or stdin has, up to a piece at a time: `read1` returns what is there (a slow writer
    is read as it writes; `read` would wait for a whole piece)."""
    while piece := handle.read1(PIECE_CHARS):
        yield piece


def _checked(pieces: Iterator[bytes], name: str) -> Iterator[str]:
    """UTF-8 text, refused where it holds NUL bytes (binary) or invalid UTF-8; a piece ends at whitespace
    (the rest goes to the next) so that no word is cut between two tokenizer calls, or anywhere once the text
    has had none for four pieces (text without spaces, e.g. CJK)."""
    import codecs

    decoder, carry = codecs.getincrementaldecoder("utf-8")(), ""
    for raw in pieces:
        if b"\x00" in raw:
            raise ValueError(f"{name} holds NUL bytes: it is a binary file, not text")
        try:
            text = carry + decoder.decode(raw)
        except UnicodeDecodeError:
            raise ValueError(f"{name} is not UTF-8 text") from None
        cut = _last_space(text)
        if cut <= 0 and len(text) < 4 * PIECE_CHARS:
            carry = text
            continue
        cut = cut if cut > 0 else len(text)
        yield text[:cut]
        carry = text[cut:]
    try:
        carry += decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text (it ends inside a character)") from None
    if carry:
        yield carry


def _last_space(text: str) -> int:
    """Where the last run of whitespace in `text` starts (-1: none)."""
    tail = text[-PIECE_CHARS:]
    runs = [match.start() for match in re.finditer(r"\s+", tail)]
    return -1 if not runs else len(text) - len(tail) + runs[-1]


def default_text_pieces() -> Iterator[str]:
    """The default text, cycled: stdlib docstrings, then duocal's shipped texts (see the module)."""
    return cycle(list(_default_documents()))


def _default_documents() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if {"test", "tests", "site-packages", "dist-packages", "idlelib"} & set(path.relative_to(stdlib).parts):
            continue
        yield from _docstrings(path)
    texts = resources.files("duocal") / "assets" / "texts"
    for entry in sorted(texts.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".txt"):
            yield entry.read_text(encoding="utf-8")


def _docstrings(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= SHORTEST_DOCSTRING:
                yield doc + "\n\n"


class TokenTape:
    """Token ids of a text, taken `n` at a time; the first pass reads (and tokenizes) the source lazily and
    records what it read in a temporary file, later passes (`rewind`) replay the record."""

    def __init__(self, tokenizer, pieces: Iterator[str], limit: int):
        self.tokenizer, self.pieces, self.limit = tokenizer, pieces, limit
        self.buffer: list[int] = []
        self.record = tempfile.TemporaryFile()
        self.recorded = 0  # tokens in the record
        self.position = 0  # tokens taken in this pass

    def take(self, n: int) -> list[int]:
        """The next `n` tokens (fewer where the text or the limit ends)."""
        n = min(n, self.limit - self.position)
        if self.position + n > self.recorded:
            self._read(self.position + n - self.recorded)
        end = min(self.position + n, self.recorded)
        self.record.seek(4 * self.position)
        ids = np.frombuffer(self.record.read(4 * (end - self.position)), dtype=np.int32).tolist()
        self.position = end
        return ids

    def rewind(self) -> None:
        self.position = 0

    def _read(self, wanted: int) -> None:
        while len(self.buffer) < wanted:
            piece = next(self.pieces, None)
            if piece is None:
                break
            self.buffer += self.tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"]
        taken, self.buffer = self.buffer[:wanted], self.buffer[wanted:]
        self.record.seek(0, os.SEEK_END)
        self.record.write(np.asarray(taken, dtype=np.int32).tobytes())
        self.recorded += len(taken)

    def close(self) -> None:
        self.record.close()
