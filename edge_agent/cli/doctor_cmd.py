"""`edge-agent doctor`: what this box can run, and what stops it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.cli.common import layout
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import SERVICE_DIRS, Layout

if TYPE_CHECKING:
    from rich.table import Table

    from edge_agent.doctor import DoctorReport


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "doctor",
        help="list engines, devices, GPU/NPU access, and check the cache and state folders",
        description="Exits non-zero when no engine works or a folder edge-agent writes "
        "to is not writable.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--config",
        type=Path,
        help="check the folders the agent of this config uses under its systemd unit "
        "(/var/lib/edge-agent and /var/cache/edge-agent, or the config's own), not this "
        "shell's",
    )
    parser.set_defaults(run=run)


def _layout(args: argparse.Namespace) -> Layout:
    """The folders to check: the flags', else the service's for --config, else this shell's.

    Run by hand on an installed box, doctor checked root's ~/.cache, or, as the service's
    user, folders the service never uses (and, missing, found their parent writable).
    """
    if args.config is None:
        return layout(args)
    from edge_agent.config.agent import load_agent_config

    config = load_agent_config(args.config, os.environ, secrets=False)
    own = {"EDGE_AGENT_CACHE", "EDGE_AGENT_STATE_DIR"}  # this shell's, not the service's
    env = {k: v for k, v in os.environ.items() if k not in own} | SERVICE_DIRS
    found = config.layout(env)
    return Layout(
        cache=getattr(args, "cache_dir", None) or found.cache,
        state=getattr(args, "state_dir", None) or found.state,
    )


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from edge_agent.doctor import collect

    report = collect(_layout(args))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        Console().print(render(report))
    if not report.usable:
        raise EdgeAgentError(
            "no usable inference engine or device found: " + "; ".join(report.problems),
            "reinstall with `make install` and check `pip show openvino onnxruntime`",
            code="device.unavailable",
        )
    if not (report.cache_writable and report.state_writable):
        raise EdgeAgentError(
            "; ".join(p for p in report.problems if "not writable" in p),
            "fix the folder's permissions, or point --cache-dir/--state-dir "
            "($EDGE_AGENT_CACHE/$EDGE_AGENT_STATE_DIR) at folders you can write",
            code="path.unwritable",
        )
    return 0


def render(report: DoctorReport) -> Table:
    from rich.table import Table

    table = Table(title="edge-agent doctor", show_header=False)
    table.add_row("edge-agent", report.edge_agent)
    table.add_row("OpenVINO", report.openvino or "[red]missing[/]")
    table.add_row(
        "ONNX Runtime",
        f"{report.onnxruntime} ({', '.join(report.onnxruntime_providers)})"
        if report.onnxruntime
        else "[red]missing[/]",
    )
    for device in report.devices:
        table.add_row(
            f"device {device.name}", f"{device.full_name} [{', '.join(device.capabilities)}]"
        )
    table.add_row("/dev/dri", ", ".join(report.dri_nodes) or "none (no iGPU exposed)")
    table.add_row("render access", "yes" if report.render_access else "no")
    table.add_row("NPU driver", "present" if report.npu_driver else "absent (/dev/accel)")
    cache = [f"{report.cache_bytes / 1e6:.1f} MB", *_folder(report.cache_free_bytes, report)]
    table.add_row("model cache", f"{report.cache_dir} ({', '.join(cache)})")
    for name in report.cached_models:
        table.add_row("", name)
    state = _folder(report.state_free_bytes, report, state=True)
    table.add_row("state", report.state_dir + (f" ({', '.join(state)})" if state else ""))
    for problem in report.problems:
        table.add_row("[red]problem[/]", problem)
    return table


def _folder(free_bytes: int | None, report: DoctorReport, state: bool = False) -> list[str]:
    """A folder's free space, and whether it is writable, for its row."""
    writable = report.state_writable if state else report.cache_writable
    notes = [] if free_bytes is None else [f"{free_bytes / 1e6:.0f} MB free"]
    return notes if writable else [*notes, "[red]not writable[/]"]
