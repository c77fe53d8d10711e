"""`edge-agent`: the local command line, for running models on the box with no broker.

Every user mistake ends as one line on stderr and exit 2: an `EdgeAgentError`
carries its own fix and code, and argparse's own errors use the same shape.

Start-up is kept cheap: building the parser imports argparse-level modules
only; each command imports its engine, numpy, rich and so on when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from edge_agent.cli import launch
from edge_agent.cli.common import CliParser
from edge_agent.errors import EdgeAgentError, from_os_error
from edge_agent.paths import Layout

EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a writer whose reader left."""

COMMANDS = (
    "infer_cmd",
    "bench_cmd",
    "doctor_cmd",
    "models_cmd",
    "pipeline_cmd",
    "calibrate_cmd",
    "agent_cmd",
    "demo_cmd",
)
"""Modules under edge_agent.cli, each with a `register(subparsers)`."""


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="edge-agent", description="Inference runtime and agent for Intel edge boxes."
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the version and build, and exit"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="rebuildable files: fetched models, prepared IR, compiled blobs (default: "
        "$EDGE_AGENT_CACHE, then $CACHE_DIRECTORY, then $XDG_CACHE_HOME/edge-agent "
        "or ~/.cache/edge-agent)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="files that must survive: the model store, captures, calibrated models "
        "(default: $EDGE_AGENT_STATE_DIR, then $STATE_DIRECTORY, then "
        "$XDG_STATE_HOME/edge-agent or ~/.local/state/edge-agent)",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="folder of model manifests (*.toml) (default: the reference models)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more on stderr: -v for INFO (source live, model swapped), -vv for DEBUG",
    )
    parser.add_argument(
        "--log-format",
        choices=["kv", "json"],
        default="kv",
        help="log lines as key=value pairs or as JSON objects",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"edge_agent.cli.{name}").register(commands)
    return parser


class _VersionAction(argparse.Action):
    """`--version`: the version and the build id, which is worked out only when asked.

    Every build says version 0.1.0; the build id tells which code is installed.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS, help=help
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from edge_agent.build_id import version_line

        print(f"edge-agent {version_line()}")
        parser.exit()


def error_line(exc: EdgeAgentError) -> str:
    """The one line an operator sees: problem; fix [code]."""
    return f"edge-agent: error: {exc} [{exc.code}]"


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; an operator's mistake becomes one line and exit 2."""
    from edge_agent.logs import setup_logging
    from edge_agent.privacy import disable_usage_telemetry

    setup_logging(args.verbose, args.log_format, sys.stderr)
    disable_usage_telemetry()
    args.layout = Layout.from_env(os.environ, cache=args.cache_dir, state=args.state_dir)
    try:
        code: int = args.run(args)
        if launch.signalled():
            # A Ctrl-C that an extension's import swallowed into an error the command then
            # took in its stride (doctor reports openvino "unusable"): still a Ctrl-C.
            return launch.say_interrupted()
    except EdgeAgentError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        # The reader of stdout went away (`| head`): nothing to say, and no one to say it to.
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(error_line(from_os_error(exc)), file=sys.stderr)
        return EXIT_USER_ERROR
    except BaseException as exc:  # a Ctrl-C, plain or in disguise, or a real failure
        signalled = interrupted_code(exc)
        if signalled is None:
            raise
        return signalled
    return code


def interrupted_code(exc: BaseException) -> int | None:
    """The exit code when `exc` is a signal, plain or in disguise (saying the interrupted
    line for a SIGINT); None when it is a real failure.

    A signal handled while a native extension initialises comes out as that extension's
    own error: pybind11 (openvino) raises ImportError from a KeyboardInterrupt or from
    cli.stopping's SystemExit, and pyo3 (pydantic_core) a PanicException (a BaseException)
    that does not even chain it, which cli.launch's SIGINT handler records. The exit it was
    is the answer: the SystemExit's code (cli.stopping has said its line), or 130 and the
    interrupted line. SystemExit itself is never taken here: it is how a command or
    argparse leaves.
    """
    if isinstance(exc, SystemExit | GeneratorExit):
        return None
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        # Only an import turns a stop into an error; any other error raised while a
        # SystemExit was on its way out is a failure of its own, and keeps its traceback.
        code = link.code if isinstance(link, SystemExit) else None
        if isinstance(code, int) and isinstance(exc, ImportError):
            return code
        if isinstance(link, KeyboardInterrupt):
            return launch.say_interrupted()
        link = link.__cause__ or link.__context__
    if launch.signalled():  # a SIGINT whose KeyboardInterrupt an extension swallowed
        return launch.say_interrupted()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command; returns the exit code (callable in-process, e.g. by tests)."""
    return run_command(build_parser().parse_args(argv))


def entry() -> NoReturn:
    """The `edge-agent` and `python -m edge_agent` entry point: main(), then leave at once.

    Once a command has run, everything it opened is closed; its output is
    flushed here and the process ends with os._exit, skipping interpreter
    teardown. That teardown races OpenVINO's engine threads: a request's
    completion wrapper takes the GIL again just after our callback has returned,
    and a thread that asks for the GIL during finalization is ended with
    pthread_exit, which through C++ frames is std::terminate ("terminate called
    without an active exception", exit 134). --help and usage errors exit in
    parse_args, normally, before any engine is loaded.
    """
    try:
        _stacks_on_sigusr1()
        code = main()
    except BaseException as exc:  # Ctrl-C as the command's modules import, or in disguise
        found = interrupted_code(exc)
        if found is None:
            raise
        code = found
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe has nothing to flush to
            stream.flush()
    os._exit(code)


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` writes every thread's Python stack to stderr (the journal under
    systemd), and the process goes on: what an operator needs from a process that is
    stuck, without stopping it. faulthandler writes from C, so it works even when the
    thread that holds the GIL never gives it back.
    """
    with contextlib.suppress(ValueError, OSError, AttributeError):  # no usable stderr
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
