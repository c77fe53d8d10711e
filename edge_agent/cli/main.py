"""`edge-agent`: the local command line, for running models on the box with no broker.

Every user mistake ends as one line on stderr and a non-zero exit: an
`EdgeAgentError` carries its own fix; argparse errors exit 2 as usual.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from edge_agent import __version__
from edge_agent.errors import EdgeAgentError
from edge_agent.privacy import disable_usage_telemetry

EXIT_USER_ERROR = 2


def default_cache_dir() -> Path:
    """$EDGE_AGENT_CACHE, else the XDG cache folder; read when the CLI starts, not at import."""
    explicit = os.environ.get("EDGE_AGENT_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edge-agent"


def build_parser() -> argparse.ArgumentParser:
    from edge_agent.cli import (
        bench_cmd,
        calibrate_cmd,
        doctor_cmd,
        infer_cmd,
        models_cmd,
        pipeline_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Inference runtime and agent for Intel edge boxes."
    )
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="fetched models, prepared IR and compiled blobs (default: $EDGE_AGENT_CACHE "
        "or ~/.cache/edge-agent)",
    )
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="folder of model manifests (*.toml)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (infer_cmd, bench_cmd, doctor_cmd, models_cmd, pipeline_cmd, calibrate_cmd):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    disable_usage_telemetry()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cache_dir is None:
        args.cache_dir = default_cache_dir()
    try:
        code: int = args.run(args)
    except EdgeAgentError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("edge-agent: interrupted", file=sys.stderr)
        return 130
    return code
