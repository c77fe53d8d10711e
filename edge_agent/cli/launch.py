"""The `edge-agent` command's first module, and `python -m edge_agent`'s.

It imports nothing of the CLI's at the top, so a Ctrl-C while the CLI's modules load
lands in the `try` below: one `edge-agent: interrupted` line and exit 130, as at any later
moment (cli.main handles those), instead of a KeyboardInterrupt traceback.

A Ctrl-C handled while a native extension initialises does not always come out as a
KeyboardInterrupt: pybind11 (openvino) wraps it in an ImportError, and pyo3
(pydantic_core) panics with an ImportError of its own, the interrupt nowhere in the chain.
So SIGINT's handler here does what Python's default one does (raise KeyboardInterrupt)
and also records that it ran: whatever exception the interrupt turned into, `signalled`
says what it was. Commands that stop on signals (cli.stopping) put their own handler in
its place while they run, and put this one back.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import NoReturn

INTERRUPTED = "edge-agent: interrupted"
"""The one line a Ctrl-C before or outside a run ends with (cli.stopping says its own)."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT."""

_signalled = False


def signalled() -> bool:
    """Whether a SIGINT has reached this module's handler."""
    return _signalled


def say_interrupted() -> int:
    """Print the interrupted line; the exit code to leave with."""
    sys.stderr.write(INTERRUPTED + "\n")
    sys.stderr.flush()
    return EXIT_INTERRUPTED


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _signalled
    _signalled = True
    raise KeyboardInterrupt


def entry() -> NoReturn:
    """Load the CLI and run it (cli.main.entry); a Ctrl-C while it loads exits 130."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)  # not where the caller ignores SIGINT
    try:
        from edge_agent.cli.main import entry as run

        run()  # leaves the process itself; what comes back here never reached its try
    except SystemExit:
        raise  # argparse's exit, or a stop that has said its line
    except BaseException:
        if not _signalled:
            raise
        code = EXIT_INTERRUPTED
        try:
            code = say_interrupted()
        finally:
            os._exit(code)
