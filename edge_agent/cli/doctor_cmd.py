"""`edge-agent doctor`: what this box can run, and what stops it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from edge_agent.doctor import DoctorReport, collect
from edge_agent.errors import EdgeAgentError


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "doctor", help="list engines, devices, GPU/NPU access and the model cache"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = collect(Path(args.cache_dir))
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        Console().print(render(report))
    if not report.usable:
        raise EdgeAgentError(
            "no usable inference engine or device found: " + "; ".join(report.problems),
            "reinstall with `make install` and check `pip show openvino onnxruntime`",
        )
    return 0


def render(report: DoctorReport) -> Table:
    table = Table(title="edge-agent doctor", show_header=False)
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
    table.add_row("model cache", f"{report.cache_dir} ({report.cache_bytes / 1e6:.1f} MB)")
    for name in report.cached_models:
        table.add_row("", name)
    for problem in report.problems:
        table.add_row("[red]problem[/]", problem)
    return table
