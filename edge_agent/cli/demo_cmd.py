"""`edge-agent demo`: broker, fleet and agent on this machine, person detection over MQTT.

The terminal (stderr) shows each step, live telemetry and events, and a
summary; stdout carries one JSON line, the summary, for scripts. Ctrl-C or
SIGTERM stops the pipeline, prints the summary so far and exits 130 (143).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from edge_agent.cli.stopping import SIGNALS, exit_code


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="the agent end to end on this machine: broker, fleet, deploy, pipeline",
        description="Start an MQTT broker (a private mosquitto, or --broker URL, or the "
        "embedded amqtt), sign and publish person-ssdlite from a fleet, deploy it to an agent "
        "over MQTT, run a pipeline on a video made from sample photos, and show the agent's "
        "telemetry and events until the video ends.",
    )
    parser.add_argument(
        "--broker", metavar="URL", default=None, help="use this broker (mqtt://host:port)"
    )
    parser.add_argument(
        "--mqtt-version",
        choices=["5", "3.1.1"],
        default=None,
        help="protocol for every session (none: 5; 3.1.1 on the embedded amqtt)",
    )
    parser.add_argument(
        "--embedded-broker",
        action="store_true",
        help="use the embedded pure-Python broker (amqtt, MQTT 3.1.1) even if mosquitto is "
        "installed",
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=600,
        help="length of the video in frames at 30 fps (the walk, over and over)",
    )
    parser.add_argument("--device", default="CPU", help="inference device or priority list")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (video, keys, agent state)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from edge_agent.demo.run import Demo, DemoOptions
    from edge_agent.demo.summary import print_summary
    from edge_agent.errors import EdgeAgentError

    if args.frames < 10:
        raise EdgeAgentError("--frames must be 10 or more", code="input.invalid")
    options = DemoOptions(
        broker=args.broker,
        mqtt_version=args.mqtt_version,
        frames=args.frames,
        device=args.device,
        embedded_broker=args.embedded_broker,
        keep=args.keep,
    )
    out = Console(stderr=True)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # Only a flag: the demo's own loop stops the pipeline and prints the summary.
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    try:
        summary = Demo(options, args.layout, out).run(stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print_summary(out, summary)
    print(json.dumps({"summary": summary.model_dump(mode="json")}), file=sys.stdout, flush=True)
    return exit_code(received[-1]) if received else 0
