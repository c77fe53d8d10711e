"""`edge-fleet cmd | deploy | status | watch`: talk to devices over the command protocol.

- `cmd DEVICE TYPE [--arg k=v ...] [--args-file F]`: one command; the final answer as JSON
  on stdout, progress on stderr. Exit 0 ok, 1 an error answer, 2 usage or no broker,
  124 no answer in time (the command expires with the wait), 130 Ctrl-C.
- `deploy NAME VERSION --to DEVICE | --group G`: deploy_model to one device, or one group
  command answered by every online member; a per-device table, non-zero if any failed;
  Ctrl-C (SIGTERM) while it waits: the table so far, exit 130 (143).
- `status`: every device's retained state (the seq rule applied), as a table or --json.
- `watch`: a live table of state, FPS, end-to-end p95, outbox depth and last seen, from
  telemetry; Ctrl-C ends it; `--once S` prints one snapshot after S seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from edge_agent.arg_types import (
    command_type,
    device_id,
    group_name,
    positive_float,
    topic_prefix,
)
from edge_agent.comms.cli_args import add_broker_args, broker_settings
from edge_agent.comms.session import MqttSession, connect
from edge_agent.config_files import first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet import clock, tables
from edge_agent.fleet.console import DeviceConsole, Interrupted, NoAnswerError, error_of
from edge_agent.fleet.group import DeviceResult, Outcome, send_group
from edge_agent.fleet.roster import DeviceRecord, Roster, unsettled
from edge_agent.fleet.trouble import SILENT_MIN_S, in_trouble, next_silence, trouble_kinds
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import DEFAULT_PREFIX, Topics

EXIT_FAILED = 1
EXIT_TIMEOUT = 124
SHORT_TIMEOUT_S = 30.0
LONG_TIMEOUT_S = 600.0
"""deploy_model, calibrate and activate_model pull, compile and gate: minutes, not seconds."""
SETTLE_S = 5.0
"""How long a verb that reads the retained states waits for them by default (`--wait`)."""


def add_console_verbs(verbs: Any) -> None:
    """Add cmd, deploy, status, watch and forget to `edge-fleet`'s sub-command parsers."""

    def wait_flag(sub: argparse.ArgumentParser) -> None:
        # Every verb that reads the fleet's retained states: on a slow console link 5,000
        # of them take longer than 5 s, and only `status` could be told to wait.
        sub.add_argument(
            "--wait",
            type=positive_float,
            default=SETTLE_S,
            help=f"longest wait for the broker's retained states (default {SETTLE_S:g} s)",
        )

    def verb(name: str, help_text: str, description: str | None = None) -> argparse.ArgumentParser:
        # -h is the broker host, as in mosquitto_sub: help is --help only.
        sub: argparse.ArgumentParser = verbs.add_parser(
            name, help=help_text, description=description, add_help=False
        )
        sub.add_argument("--help", action="help", help="show this help and exit")
        add_broker_args(sub)
        sub.add_argument("--prefix", type=topic_prefix, default=DEFAULT_PREFIX, help="topic prefix")
        return sub

    cmd = verb("cmd", "send one command to a device and print its answer")
    cmd.add_argument("device", type=device_id, help="device id")
    cmd.add_argument(
        "type", type=command_type, help="command type: ping, get_status, start_pipeline, ..."
    )
    cmd.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an argument; VALUE is JSON when it parses (3, true, {...}), else a string",
    )
    cmd.add_argument("--args-file", type=Path, help="arguments as a JSON or TOML file")
    cmd.add_argument(
        "--timeout", type=positive_float, help="seconds to wait (default 30; long: 600)"
    )
    cmd.add_argument(
        "--no-check",
        action="store_true",
        help="send the type and arguments as they are, for an agent newer than this "
        "client (by default they are checked against this client's protocol first)",
    )
    cmd.set_defaults(run=run_cmd)

    deploy = verb("deploy", "deploy a published model to a device or a group")
    deploy.add_argument("name", help="model name as published")
    deploy.add_argument("version", help="release version, or `latest`")
    where = deploy.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="DEVICE", type=device_id, help="one device")
    where.add_argument(
        "--group", metavar="G", type=group_name, help="every online device of group G"
    )
    deploy.add_argument("--no-activate", action="store_true", help="install only")
    deploy.add_argument(
        "--timeout", type=positive_float, default=LONG_TIMEOUT_S, help="seconds to wait"
    )
    deploy.add_argument("--json", action="store_true", help="results as JSON")
    wait_flag(deploy)
    deploy.set_defaults(run=run_deploy)

    status = verb("status", "every device's retained state")
    status.add_argument("--json", action="store_true", help="as JSON")
    wait_flag(status)
    status.set_defaults(run=run_status)

    watch = verb(
        "watch",
        "a live table of every device's state, FPS, p95 and outbox",
        "On a terminal, a live screenful, devices in trouble first. Piped or logged, the "
        "whole table once, then, at most every 2 s, a line counting the fleet and the rows "
        "of the devices whose standing changed: came, went online or offline, a pipeline's "
        "status, in trouble or out of it, a trouble flag gained or lost (fps0, outbox-drops, "
        "clock, silent...; not their figures, which move every interval).",
    )
    watch.add_argument(
        "--once", type=positive_float, metavar="S", help="one snapshot after S seconds"
    )
    watch.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    watch.add_argument(
        "--silent-after",
        type=positive_float,
        default=SILENT_MIN_S,
        metavar="S",
        help="flag an online box `silent` once nothing of it came for 3 of its telemetry "
        f"intervals and at least S seconds (default {SILENT_MIN_S:g})",
    )
    wait_flag(watch)
    watch.set_defaults(run=run_watch)

    forget = verb("forget", "clear the retained state of retired devices")
    forget.add_argument("devices", nargs="+", metavar="DEVICE", help="device id")
    forget.add_argument(
        "--force",
        action="store_true",
        help="clear it even if the device says it is online (it returns at its next state)",
    )
    wait_flag(forget)
    forget.set_defaults(run=run_forget)


# --- arguments --------------------------------------------------------------------------------
def parse_arg(text: str) -> tuple[str, Any]:
    """`KEY=VALUE`, VALUE as JSON when it parses, else as the string it is."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise EdgeAgentError(
            f"--arg {text!r} is not KEY=VALUE",
            'e.g. --arg version=3, --arg name=orient, --arg \'spec={"id": "cam"}\'',
            code="input.invalid",
        )
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def load_args_file(path: Path) -> dict[str, Any]:
    """A JSON or TOML file of arguments (by suffix; JSON first when it has neither)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EdgeAgentError(
            f"cannot read {path}: {exc.strerror}", "check the path", code="input.not_found"
        ) from exc
    loaders: list[Any] = [json.loads, tomllib.loads]
    if path.suffix == ".toml":
        loaders = [tomllib.loads]
    elif path.suffix == ".json":
        loaders = [json.loads]
    for load in loaders:
        try:
            found = load(text)
        except ValueError:  # JSONDecodeError and TOMLDecodeError both are
            continue
        if isinstance(found, dict):
            return found
    raise EdgeAgentError(
        f"{path} is not a JSON object or a TOML table",
        "write the arguments as {...} in JSON, or key = value lines in TOML",
        code="input.invalid",
    )


def command_args(pairs: list[str], args_file: Path | None) -> dict[str, Any]:
    """The file's arguments, with each --arg on top."""
    found = load_args_file(args_file) if args_file is not None else {}
    found.update(parse_arg(pair) for pair in pairs)
    return found


def check_command(kind: str, arguments: dict[str, Any]) -> None:
    """Refuse, before anything is sent, a command type or arguments the device would refuse:
    a typo then costs no round trip, and no 30 s wait for a box that is offline.

    Raises:
        EdgeAgentError: command.unknown or command.invalid, as the device would answer.
    """
    if kind not in msg.COMMAND_ARGS:
        raise EdgeAgentError(
            f"unknown command type {kind!r}",
            f"use one of: {', '.join(sorted(msg.COMMAND_ARGS))}",
            code="command.unknown",
        )
    try:
        msg.validate_args(kind, arguments)
    except ValidationError as exc:
        where, message = first_error(exc, "args.")
        raise EdgeAgentError(
            f"{kind} arguments are invalid at {where}: {message}",
            "fix the --arg KEY=VALUE pairs or the --args-file (docs/PROTOCOL.md lists them)",
            code="command.invalid",
        ) from None


# --- progress ---------------------------------------------------------------------------------
MAX_BARS = 12
"""Past this many devices, one bar (or line) for them all: 5,000 bars took 1.2 s to draw,
ten times a second, on the thread that should be reading the devices' answers."""


class Bars:
    """Progress of long commands on stderr: bars on a terminal, a line per step elsewhere;
    past `MAX_BARS` devices, one for the whole group, counted by stage."""

    def __init__(self, err: Console, summary_every_s: float = 5.0) -> None:
        self.err = err
        self.summary_every_s = summary_every_s
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._last: dict[str, tuple[str, int]] = {}
        self._latest: dict[str, msg.Progress] = {}
        self._summarised = -math.inf

    def update(self, key: str, progress: msg.Progress) -> None:
        # A box's words (its id, its stage names) on the operator's terminal: printable only.
        key = tables.printable(key)
        progress = msg.Progress(stage=tables.printable(progress.stage), fraction=progress.fraction)
        self._latest[key] = progress
        many = len(self._latest) > MAX_BARS
        if not self.err.is_terminal:
            if many:
                now = time.monotonic()
                if now - self._summarised >= self.summary_every_s:
                    self._summarised = now
                    print(f"{len(self._latest)} devices: {self._summary()}", file=sys.stderr)
                return
            step = (progress.stage, int(progress.fraction * 10))
            if self._last.get(key) != step:
                self._last[key] = step
                # Plain lines: a log or a pipe keeps each step, unwrapped.
                print(f"{key}: {progress.stage} {progress.fraction:.0%}", file=sys.stderr)
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.fields[key]}", markup=False),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}% {task.description}", markup=False),
                console=self.err,
            )
            self._progress.start()
        if many:
            if "*" not in self._tasks:
                for task in self._tasks.values():
                    self._progress.remove_task(task)
                self._tasks = {"*": self._progress.add_task("", total=1.0, key="all")}
            now = time.monotonic()
            if now - self._summarised < 0.25:  # a sum over the group: not per answer
                return
            self._summarised = now
            self._progress.update(
                self._tasks["*"], completed=self._mean(), description=self._summary()
            )
            return
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(progress.stage, total=1.0, key=key)
        self._progress.update(
            self._tasks[key], completed=progress.fraction, description=progress.stage
        )

    def _summary(self) -> str:
        """'1200 transfer, 3800 install' and the mean: where the group is."""
        stages = Counter(p.stage for p in self._latest.values())
        counts = ", ".join(f"{n} {stage}" for stage, n in sorted(stages.items()))
        return f"{counts} ({self._mean():.0%} on average)"

    def _mean(self) -> float:
        return sum(p.fraction for p in self._latest.values()) / len(self._latest)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _session(args: argparse.Namespace, roster: Roster | None = None) -> tuple[MqttSession, Topics]:
    """The console's session; one that follows `roster` tells it of every (re)connect, so
    the states the broker does not send again after a reconnect show as unknown."""
    hook = roster.on_connected if roster is not None else None
    return connect(broker_settings(args), on_connected=hook), Topics(args.prefix)


def _finite(data: Any) -> Any:
    """`data` with every float that is not finite as None: a box's state with `"ts":
    Infinity` (Python reads it) came out as `Infinity`, which is not JSON, and a strict
    reader (JSON.parse, Go) refused the whole fleet's document for it."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(value) for value in data]
    return data


def _print_json(data: Any) -> None:
    print(json.dumps(_finite(data), indent=2, sort_keys=False, allow_nan=False), flush=True)


def _error_line(text: str, code: str) -> None:
    print(f"edge-fleet: error: {text} [{code}]", file=sys.stderr, flush=True)


# --- cmd --------------------------------------------------------------------------------------
def run_cmd(args: argparse.Namespace) -> int:
    arguments = command_args(args.arg, args.args_file)
    if not args.no_check:
        check_command(args.type, arguments)
    long = args.type in msg.LONG_COMMANDS
    timeout = args.timeout or (LONG_TIMEOUT_S if long else SHORT_TIMEOUT_S)
    session, topics = _session(args)
    console = DeviceConsole(session, topics, args.device, follow=False)
    bars = Bars(Console(stderr=True))
    sent = time.time()
    try:
        answer = console.request(
            args.type,
            arguments,
            timeout=timeout,
            on_progress=lambda progress: bars.update(args.device, progress),
        )
        _say_skew(args.device, clock.skew_of_answer(answer.ts, sent, time.time()))
    except NoAnswerError as exc:
        bars.close()
        _error_line(str(exc), exc.code)
        return EXIT_TIMEOUT
    finally:
        bars.close()
        console.close()
        session.stop()
    _print_json(answer.model_dump(mode="json", exclude_none=True))
    if answer.status == "error":
        error = error_of(answer)  # the box's words, for the operator's terminal
        where = f" (field {tables.printable(error.field)})" if error.field else ""
        _error_line(
            f"{args.device}: {args.type} failed{where}: {tables.printable(error.message)}",
            tables.printable(error.code),
        )
        return EXIT_FAILED
    return 0


def _say_skew(device: str, skew: float) -> None:
    """One stderr line when the box's clock is far off: every time it stamps (state,
    telemetry, events, results) is off by as much, and nothing else would say so."""
    if clock.off(skew):
        ahead = "ahead of" if skew > 0 else "behind"
        print(
            f"edge-fleet: warning: {device}'s clock is {clock.span(skew)[1:]} {ahead} this "
            "console's (its answer's ts); its timestamps are off by as much: check its NTP",
            file=sys.stderr,
            flush=True,
        )


# --- deploy -----------------------------------------------------------------------------------
def _version(text: str) -> int | None:
    if text == "latest":
        return None
    # ASCII digits only, and no more than int() reads (0: no limit): isdigit() takes '²',
    # and int() refused it, and 5,000 digits, with a traceback.
    most = sys.get_int_max_str_digits() or len(text)
    digits = text.isascii() and text.isdigit() and len(text) <= most
    if digits and int(text) >= 1:
        return int(text)
    raise EdgeAgentError(
        f"version {tables.short(text, 24)!r} is not a number >= 1 or `latest`",
        "e.g. edge-fleet deploy person-det 3 --to dock-7",
        code="input.invalid",
    )


class _Stop:
    """While held, SIGINT and SIGTERM set `event` rather than end the process: a deploy
    stopped while it waited printed none of the answers it had gathered. `signum` is the
    first that came (0: none)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0
        self._before: dict[int, Any] = {}

    def _set(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum
        self.event.set()

    def __enter__(self) -> _Stop:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._before[signum] = signal.signal(signum, self._set)
        return self

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)


def run_deploy(args: argparse.Namespace) -> int:
    deploy_args = {
        "name": args.name,
        "version": _version(args.version),
        "activate": not args.no_activate,
    }
    bars = Bars(Console(stderr=True))
    stop = _Stop()
    roster = None if args.to else Roster(Topics(args.prefix))
    session, topics = _session(args, roster)
    try:
        if args.to:
            console = DeviceConsole(session, topics, args.to, follow=False)
            try:
                with stop:
                    answer = console.request(
                        "deploy_model",
                        deploy_args,
                        timeout=args.timeout,
                        on_progress=lambda progress: bars.update(args.to, progress),
                        stop=stop.event,
                    )
                outcome: Outcome = "ok" if answer.status == "ok" else "error"
                results = [DeviceResult(args.to, outcome, answer)]
            except (NoAnswerError, Interrupted) as exc:
                if isinstance(exc, NoAnswerError):
                    print(f"edge-fleet: {exc}", file=sys.stderr, flush=True)
                # Shown as "no answer", a box that was running it passed for one that never
                # heard of it.
                started = exc.started
                progress = started.progress if started is not None else None
                outcome = "timeout" if isinstance(exc, NoAnswerError) else "interrupted"
                results = [DeviceResult(args.to, outcome, None, progress, started is not None)]
            finally:
                console.close()
        else:
            assert roster is not None  # made for a group, before the session
            roster.follow(session)
            not_known = unsettled(session, topics, args.wait)
            if not_known is not None:
                bars.close()
                _error_line(
                    f"{not_known.why}, so the group's members are not known; wait longer with "
                    "--wait, or run `edge-fleet status` to check the broker",
                    not_known.code,
                )
                return EXIT_TIMEOUT
            members = roster.members(args.group)
            if not members:
                bars.close()
                _error_line(
                    f"no online device says it is in group {args.group!r}; see `edge-fleet status`",
                    "input.invalid",
                )
                return EXIT_FAILED
            print(
                f"deploy_model to group {args.group}: {tables.printable(', '.join(members))}",
                file=sys.stderr,
                flush=True,
            )

            def shown(answer: msg.Response) -> None:
                if answer.progress is not None:
                    bars.update(answer.device_id, answer.progress)

            with stop:
                found = send_group(
                    session,
                    topics,
                    args.group,
                    "deploy_model",
                    deploy_args,
                    members,
                    timeout=args.timeout,
                    on_answer=shown,
                    stop=stop.event,
                )
            results = [found[d] for d in sorted(found)]
    finally:
        bars.close()
        session.stop()
    where = args.to or f"group {args.group}"
    if args.json:
        _print_json(tables.results_json(results))
    else:
        title = f"deploy {args.name} {args.version} to {where}"
        _table_console().print(tables.results_table(title, results))
    if stop.signum:
        unanswered = [r.device for r in results if r.outcome == "interrupted"]
        which = ", ".join(unanswered) if len(unanswered) <= 5 else f"{len(unanswered)} devices"
        print(
            f"edge-fleet: deploy_model stopped before every answer came: "
            f"{tables.printable(which)} may still run it (it expires {args.timeout:g} s after "
            "it was sent); see `edge-fleet status`",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stop.signum
    outcomes = {r.outcome for r in results}
    if "error" in outcomes:
        return EXIT_FAILED
    return EXIT_TIMEOUT if "timeout" in outcomes else 0


# --- status and watch -------------------------------------------------------------------------
def _roster(args: argparse.Namespace, *, telemetry: bool) -> tuple[MqttSession, Roster, bool]:
    """A session following the fleet's roster, and whether every retained state came
    within `--wait` (else it says so). The caller stops the session."""
    roster = Roster(Topics(args.prefix))
    session, topics = _session(args, roster)
    try:
        roster.follow(session, telemetry=telemetry)
        not_known = unsettled(session, topics, args.wait)
    except BaseException:
        session.stop()
        raise
    if not_known is not None:
        print(f"edge-fleet: {not_known.why}: states may be missing", file=sys.stderr)
    return session, roster, not_known is None


PIPE_WIDTH = 240
"""Columns a table may take in a pipe or a log, where nothing wraps it: at rich's default
80, a row with flags and a pipeline's detail was squeezed to `c…` cells."""


def _table_console() -> Console:
    out = Console(soft_wrap=True)
    return out if out.is_terminal else Console(soft_wrap=True, width=PIPE_WIDTH)


def run_status(args: argparse.Namespace) -> int:
    session, roster, settled = _roster(args, telemetry=False)
    topics = roster.topics
    try:
        records = roster.snapshot()
    finally:
        session.stop()
    if args.json:
        _print_json(tables.status_json(records))
    elif not records:
        print(f"no device has published a state under {topics.prefix}/", file=sys.stderr)
    else:
        _table_console().print(tables.status_table(records))
    # What came is shown; a script must still not take a part of the fleet for all of it.
    return 0 if settled else EXIT_TIMEOUT


def run_watch(args: argparse.Namespace) -> int:
    if args.json and args.once is None:
        # Taken in silence, it sent rich tables every 2 s, forever, into a JSON reader.
        raise EdgeAgentError(
            "watch --json prints one snapshot, so it needs --once S",
            "e.g. edge-fleet watch --once 5 --json",
            code="input.invalid",
        )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    session, roster, settled = _roster(args, telemetry=True)  # it keeps listening
    out = _table_console()
    link = _Link(session)
    try:
        if args.once is not None:
            # Looked at while waiting: a loss is dated when it came, not when the wait ended.
            ends = time.monotonic() + args.once
            while not stop.wait(min(0.5, max(0.0, ends - time.monotonic()))):
                link.lost_at()
                if time.monotonic() >= ends:
                    break
            records = roster.snapshot()
            if args.json:
                _print_json(tables.watch_json(records, silent_min_s=args.silent_after))
            else:
                table = tables.watch_table(
                    records, offline_since=link.lost_at(), silent_min_s=args.silent_after
                )
                out.print(table)
            if link.lost_at() is not None:
                print(
                    "edge-fleet: this console lost the broker during the watch: the snapshot "
                    "is as of then",
                    file=sys.stderr,
                )
            # As `status`: a script must not take a part of the fleet, or an old one, for
            # all of it as it is now.
            return 0 if settled and link.lost_at() is None else EXIT_TIMEOUT
        if out.is_terminal:

            def screen() -> Table:
                return screenful(out, roster.snapshot(), link.lost_at(), args.silent_after)

            with Live(screen(), console=out, auto_refresh=False) as live:
                while not stop.wait(0.5):
                    live.update(screen(), refresh=True)
        else:
            _snapshots(out, roster, stop, link, args.silent_after)
    finally:
        session.stop()
    return 0


def screenful(
    out: Console,
    records: list[DeviceRecord],
    offline_since: float | None,
    silent_min_s: float = SILENT_MIN_S,
) -> Table:
    """`watch`'s table cut to the terminal's height, its caption included.

    Measured as drawn: a device takes a row per pipeline, and a cell or the caption may
    wrap on a narrow terminal. Cut by a guess at the lines around the rows, 16 boxes of
    three cameras drew 48 rows on 24 lines, and the caption (what is hidden, a lost
    link) was what fell off the screen's foot.
    """
    rows = max(1, out.height - 7)  # title, header, 3 rules, 2 caption lines: mostly one pass
    while True:
        table = tables.watch_table(
            records, limit=rows, offline_since=offline_since, silent_min_s=silent_min_s
        )
        drawn = len(out.render_lines(table, pad=False))
        if drawn <= out.height or rows <= 1:
            return table
        rows = max(1, rows - (drawn - out.height))


class _Link:
    """When this console's own link to the broker went down, while it is down: the
    roster then stops changing, and a watch showed the fleet as it was, all green."""

    def __init__(self, session: MqttSession) -> None:
        self._session = session
        self._lost: float | None = None
        # Up as it comes from connect(): begun False, a loss was noticed only after a look
        # taken while up, and `watch --once` takes its first after its wait.
        self._was_up = session.connected.is_set()

    def lost_at(self) -> float | None:
        """When it went down (console clock), or None while it is up (or not up yet)."""
        if self._session.connected.is_set():
            self._was_up, self._lost = True, None
        elif self._was_up and self._lost is None:
            self._lost = time.time()
        return self._lost


def run_forget(args: argparse.Namespace) -> int:
    """Clear retired devices' retained states, so `status` and `watch` stop listing them.

    A box taken out of service leaves its last state retained on the broker for good: at
    5,000 boxes and a few retired a week, a growing part of every listing is the dead.
    Only a device the broker holds a state for is cleared (its id then names a real
    topic), and not one that says it is online, unless --force.
    """
    session, roster, settled = _roster(args, telemetry=False)
    topics = roster.topics
    failed = False
    cleared: list[str] = []
    try:
        known = {record.device: record for record in roster.snapshot()}
        refused_before = session.rejected  # the roster's own echo may be refused, too
        for device in dict.fromkeys(args.devices):
            record = known.get(device)
            if record is None:
                why = "it may be missing" if not settled else "see `edge-fleet status`"
                _error_line(f"the broker holds no state for {device!r}; {why}", "input.invalid")
                failed = True
            elif record.online and not args.force:
                _error_line(
                    f"{device} says it is online; stop its agent first, or pass --force "
                    "(a running agent publishes its state again at its next change)",
                    "input.invalid",
                )
                failed = True
            else:
                session.publish(topics.device(device, "state"), b"", qos=1, retain=True)
                cleared.append(device)
        if not session.flush(10.0):
            _error_line("the broker did not confirm within 10 s", "broker.unreachable")
            return EXIT_TIMEOUT
        refused = session.rejected - refused_before
        if refused:
            # An MQTT 5 broker acknowledges a clear its ACL refuses and says so: "forgot"
            # was printed, and the device stayed in every listing. (MQTT 3.1.1 brokers drop
            # a refused publish without a word.)
            reason = session.last_refusal.getName() if session.last_refusal else "refused"
            which = cleared[0] if len(cleared) == 1 else f"{refused} of {len(cleared)} devices"
            _error_line(
                f"the broker refused to clear the state of {which}: {reason}; forget as a "
                "user that may write <prefix>/<device>/state (the fleet's console user, "
                "`fleet` in systemd/mosquitto/fleet.acl), and see `edge-fleet status`",
                "error",
            )
            return EXIT_FAILED
        for device in cleared:
            print(f"forgot {device}", file=sys.stderr, flush=True)
    finally:
        session.stop()
    return EXIT_FAILED if failed else 0


def _standing(record: DeviceRecord, now: float, silent_min_s: float) -> tuple[Any, ...]:
    """What a piped watch prints a device again for: online or not, unknown or not, its
    pipelines' statuses, and which trouble flags it has (`silent`, `fps0`,
    `outbox-drops`...: a box already in trouble that gains or loses one is news too); not
    its figures, which move every interval (`trouble_kinds` leaves them out). In trouble
    or not follows from these (`in_trouble`), so it is not asked again: every flag of
    every device is worked out once a look, not twice."""
    statuses = tuple((p.id, p.status) for p in record.state.pipelines) if record.state else ()
    kinds = trouble_kinds(record, now, silent_min_s=silent_min_s)
    return record.online, record.unknown, statuses, kinds


def _snapshots(
    out: Console,
    roster: Roster,
    stop: threading.Event,
    link: _Link,
    silent_min_s: float,
    every_s: float = 2.0,
) -> None:
    """Not a terminal (a pipe, a log): the whole table once, then, at most every 2 s, a
    line counting the fleet and the rows of the devices whose standing changed (came,
    went online or offline, a pipeline's status, in trouble or out of it, a trouble flag
    gained or lost, silent among them);
    and a line when this console's link goes down or comes back. The whole table every
    time was up to 5,000 rows every 2 s, and a change in it was not to be found.

    A device is judged again at every roster change, and when the next one turns silent
    (`next_silence`): silence is the case where no message comes, and judged only at a
    change, a quiet box in a quiet fleet was never reported."""
    held: dict[str, tuple[Any, ...]] | None = None
    lost: float | None = None
    due: float | None = None
    while not stop.is_set():
        # The link is looked at every 0.5 s, as before; a silence due sooner is not waited
        # for past its time.
        wait = 0.5 if due is None else min(0.5, max(0.0, due - time.time()))
        changed = roster.changed.wait(wait)
        now_lost = link.lost_at()
        # Strictly past `due`: at `due` itself the box is not yet silent.
        silence = due is not None and time.time() > due
        if not changed and now_lost == lost and not silence:
            continue
        roster.changed.clear()
        now = time.time()
        records = roster.snapshot()
        standing = {r.device: _standing(r, now, silent_min_s) for r in records}
        if held is None:
            out.print(
                tables.watch_table(records, now, offline_since=now_lost, silent_min_s=silent_min_s)
            )
        else:
            moved = [r for r in records if held.get(r.device) != standing[r.device]]
            gone = sorted(set(held) - set(standing))
            if moved or gone or now_lost != lost:
                line = _fleet_line(records, now, now_lost, gone, silent_min_s)
                out.print(line, markup=False)
            if moved:
                table = tables.watch_table(
                    moved, now, offline_since=now_lost, silent_min_s=silent_min_s
                )
                out.print(table)
        held, lost = standing, now_lost
        due = next_silence(records, now, silent_min_s)
        stop.wait(every_s)


def _clock_time(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))  # the console's clock: in range


def _fleet_line(
    records: list[DeviceRecord],
    now: float,
    lost: float | None,
    gone: list[str],
    silent_min_s: float = SILENT_MIN_S,
) -> str:
    """'12:00:02 3 devices: 2 online, 1 offline, 1 in trouble (offline, failing or flagged)';
    `, N unknown` after offline when some are (see `DeviceRecord.stale_since`)."""
    online = sum(r.online for r in records)
    unknown = sum(r.unknown for r in records)
    offline = len(records) - online - unknown
    line = f"{_clock_time(now)} {len(records)} devices: {online} online, {offline} offline"
    if unknown:
        line += f", {unknown} unknown"
    trouble = sum(in_trouble(r, now, silent_min_s=silent_min_s) for r in records)
    line += f", {trouble} in trouble (offline, failing or flagged)"
    if gone:
        line += f"; forgotten: {tables.printable(', '.join(gone))}"
    if lost is not None:
        line += f"; this console lost the broker at {_clock_time(lost)}"
    return line
