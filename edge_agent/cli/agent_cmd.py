"""`edge-agent run --config agent.toml`: the agent, as systemd runs it."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path("/etc/edge-agent/agent.toml")


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="run the agent: connect to the fleet's broker and serve its commands",
        description="Run the agent until SIGTERM or Ctrl-C. Config: TOML (see "
        "systemd/agent.example.toml); EDGE_AGENT_* variables override it.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("EDGE_AGENT_CONFIG", str(DEFAULT_CONFIG))),
        help="agent config file (default: $EDGE_AGENT_CONFIG or /etc/edge-agent/agent.toml)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edge_agent.agent.service import AgentService
    from edge_agent.config.agent import load_agent_config

    env = dict(os.environ)
    # The global --cache-dir/--state-dir win over the file, as everywhere in the CLI.
    config = load_agent_config(args.config, env)
    if args.cache_dir is not None or args.state_dir is not None:
        config = config.model_copy(
            update={
                "cache_dir": args.cache_dir or config.cache_dir,
                "state_dir": args.state_dir or config.state_dir,
            }
        )
    stop = threading.Event()
    received: list[int] = []
    services: list[AgentService] = []

    # The interpreter's C-level handler writes each signal's number to the wake-up socket,
    # and the watcher, asleep in recv() until then, sets `stop` (it polled 10 times a
    # second before). A Python handler must not: Event.set() takes a lock the interrupted
    # main thread may hold (inside a wait), which would deadlock.
    wakeup, wakeup_w = socket.socketpair()
    wakeup_w.setblocking(False)  # set_wakeup_fd requires it

    def watch() -> None:
        with wakeup:
            while not received:
                data = wakeup.recv(64)
                if not data:
                    return  # closed: the agent ended without a signal
                received.extend(n for n in data if n in _STOP_SIGNALS)
        stop.set()
        if services:  # else run() has not begun, and will see `stop` at once
            services[0].wake()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    previous_fd = signal.set_wakeup_fd(wakeup_w.fileno(), warn_on_full_buffer=False)
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _noted)
    try:
        service = AgentService(config, env)
        services.append(service)
        service.run(stop)
    finally:
        signal.set_wakeup_fd(previous_fd)
        wakeup_w.close()  # ends the watcher's recv if no signal came
    # systemd treats a clean stop on SIGTERM as success; a Ctrl-C says so by its code.
    return 130 if received and received[-1] == signal.SIGINT else 0


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _noted(signum: int, _frame: object) -> None:
    """Replaces the default actions (exit, KeyboardInterrupt); the watcher acts on the signal."""
