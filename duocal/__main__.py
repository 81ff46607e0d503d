"""`duocal` / `python -m duocal`: the command line, with Ctrl-C at any point (its imports included)
reported as one line and exit code 130, never a traceback."""

from __future__ import annotations

import signal
import sys

_interrupted = False


def _on_ctrl_c(signum, frame) -> None:
    """Python's own handler, remembered: a KeyboardInterrupt raised inside a library's import can leave
    that module half-made and surface later as another error (numpy's lazy `dtypes` recurses)."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # leave an inherited SIG_IGN alone
        signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        from duocal.cli import app

        app()
    except KeyboardInterrupt:
        _stop_interrupted()
    except SystemExit as exit_:
        if _interrupted and exit_.code != 130:  # an error the interrupt caused, reported as an error
            _stop_interrupted()
        raise
    except BaseException:
        if _interrupted:
            _stop_interrupted()
        raise


def _stop_interrupted() -> None:
    sys.stderr.write("interrupted\n")
    sys.exit(130)


if __name__ == "__main__":
    main()
