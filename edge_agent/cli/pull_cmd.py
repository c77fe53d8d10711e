"""`edge-agent models pull NAME`: pull a published release into this box's store over MQTT.

The same `delivery.pull` the agent's deploy_model command runs: resumes a
partial pull, verifies chunk by chunk and the whole file, installs, and with
--activate makes it current behind the health gate.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

from edge_agent.arg_types import device_id
from edge_agent.cli.common import layout, positive_float, positive_int, topic_prefix
from edge_agent.comms.cli_args import add_broker_args, broker_settings
from edge_agent.protocol.topics import DEFAULT_PREFIX


def register(verbs: Any) -> None:
    """Add `pull` to the `models` verbs."""
    from edge_agent.cli.models_cmd import _add_gate_args

    pull: argparse.ArgumentParser = verbs.add_parser(
        "pull", help="pull a published release over MQTT (resumes), verify, install"
    )
    pull.add_argument("name", help="model name as published by `edge-fleet publish-model`")
    pull.add_argument("--version", type=positive_int, help="version to pull (default: the latest)")
    pull.add_argument(
        "--trusted-key",
        type=Path,
        action="append",
        default=[],
        metavar="PUB.pem",
        help="fleet public key; repeatable. Without one, signatures are not checked",
    )
    pull.add_argument("--activate", action="store_true", help="activate behind the health gate")
    pull.add_argument(
        "--device-id", type=device_id, default=None, help="this box's id (default: host name)"
    )
    pull.add_argument("--prefix", type=topic_prefix, default=DEFAULT_PREFIX, help="topic prefix")
    pull.add_argument(
        "--timeout", type=positive_float, default=300.0, help="give up after this stall"
    )
    add_broker_args(pull, short=False)
    _add_gate_args(pull)
    pull.set_defaults(run=run_pull)


def run_pull(args: argparse.Namespace) -> int:
    from edge_agent.cli.models_cmd import _gate
    from edge_agent.comms.session import connect
    from edge_agent.delivery.pull import PullOptions, pull
    from edge_agent.protocol.topics import Topics
    from edge_agent.store.release import load_public_key
    from edge_agent.store.store import ModelStore

    keys = [load_public_key(path) for path in args.trusted_key]
    where = layout(args)
    shown: dict[str, int] = {}
    # Progress on a terminal only, drawn over itself and wiped at the end: a failed pull
    # then leaves its one error line, and a script reading stderr gets no meter lines.
    live = sys.stderr.isatty()

    def progress(stage: str, fraction: float) -> None:
        tenth = int(fraction * 10)
        if live and shown.get(stage) != tenth:
            shown[stage] = tenth
            print(f"\r{stage} {fraction:4.0%}\033[K", end="", file=sys.stderr, flush=True)

    session = connect(broker_settings(args))
    try:
        result = pull(
            session,
            ModelStore(where),
            where,
            args.name,
            device_id=args.device_id or socket.gethostname().split(".")[0],
            version=args.version,
            trusted_keys=keys,
            topics=Topics(args.prefix),
            activate=args.activate,
            gate=_gate(args) if args.activate else None,
            progress=progress,
            options=PullOptions(stall_s=args.timeout, release_timeout_s=min(10.0, args.timeout)),
        )
    finally:
        session.stop()
        if shown:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    release = result.release
    what = "pulled" if result.installed else "already installed"
    stats = result.stats
    print(
        f"{release.name} v{release.version}: {what}"
        f"{', active' if result.activated else ''} ({result.chunks} chunks, "
        f"{stats.resumed} resumed, {stats.repaired} repaired, {stats.duplicates} duplicate)"
    )
    return 0
