"""`edge-agent run --config agent.toml`: the agent, as systemd runs it."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
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

    def on_signal(signum: int, _frame: object) -> None:
        # Only record it. Event.set() takes a lock the interrupted main thread may hold
        # (inside stop.wait), which would deadlock; a watcher thread sets it instead.
        received.append(signum)

    def watch() -> None:
        while not received:
            time.sleep(0.1)
        stop.set()

    threading.Thread(target=watch, name="signals", daemon=True).start()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    service = AgentService(config, env)
    service.run(stop)
    # systemd treats a clean stop on SIGTERM as success; a Ctrl-C says so by its code.
    return 130 if received and received[-1] == signal.SIGINT else 0
