"""Where tables are printed: how wide (80 columns when piped) and whether box lines may be UTF-8.

Python turns on its UTF-8 mode by itself when the locale is C or POSIX (PEP 540), so it writes
UTF-8 box lines to a terminal that shows them as garbage; there, and on any stream whose encoding
is not UTF-8, tables are drawn in ASCII.
"""

from __future__ import annotations

import os
import sys

from rich import box
from rich.console import Console

PIPED_WIDTH = 80  # a pipe or file has no width; 80 columns reads everywhere

# box.SIMPLE_HEAD with '-' for its one line: a rule under the header, nothing else
ASCII_SIMPLE_HEAD = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def utf8_mode_from_c_locale() -> bool:
    """Python's UTF-8 mode that nobody asked for: the locale was C or POSIX (the terminal's too)."""
    asked = os.environ.get("PYTHONUTF8") == "1" or "utf8" in getattr(sys, "_xoptions", {})
    return bool(sys.flags.utf8_mode) and not asked


def ascii_only(stream=None) -> bool:
    """Whether box-drawing characters would come out mangled on `stream` (default: stdout)."""
    encoding = (getattr(stream or sys.stdout, "encoding", None) or "ascii").lower().replace("-", "").replace("_", "")
    return not encoding.startswith("utf8") or utf8_mode_from_c_locale()


def table_console() -> Console:
    """A console on stdout: the terminal's width, or 80 columns when piped."""
    console = Console()
    return console if console.is_terminal else Console(width=PIPED_WIDTH)


def simple_head_box(console: Console) -> box.Box:
    """A rule under the header: '─' where the output shows UTF-8, '-' elsewhere."""
    return ASCII_SIMPLE_HEAD if ascii_only(console.file) else box.SIMPLE_HEAD
