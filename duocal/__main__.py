"""`duocal` / `python -m duocal`: the command line, with Ctrl-C at any point (its imports included)
reported as one line and exit code 130, never a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from duocal.cli import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
