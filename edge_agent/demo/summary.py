"""The demo's closing summary: a pydantic model (printed as one JSON line) and its table."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table


class DemoSummary(BaseModel):
    """The demo's outcome, printed as a table and as one JSON line on stdout."""

    model_config = ConfigDict(extra="forbid")

    broker: str = Field(description="mosquitto, amqtt or url.")
    mqtt_version: str = Field(description="MQTT protocol every session used.")
    model: str = Field(description="Model name.")
    model_version: int | None = Field(description="Store version the agent deployed.")
    device: str | None = Field(description="Device the model ran on, as the agent reported.")
    precision: str | None = Field(description="Precision it ran at.")
    fallback: str | None = Field(description="Why a requested device was passed over, if any.")
    video_frames: int = Field(description="Frames in the video.")
    results: int = Field(description="Result messages received (one per frame).")
    frames_with_person: int = Field(description="Frames with at least one detection.")
    events: int = Field(description="Events received.")
    event_kinds: dict[str, int] = Field(description="Events by kind.")
    fps: float = Field(description="Frames per second over the run, device timestamps.")
    telemetry_messages: int = Field(description="Telemetry messages received.")
    deploy_s: float = Field(description="Seconds for deploy_model (pull, verify, gate).")
    interrupted: bool = Field(description="Stopped by Ctrl-C/SIGTERM before the video ended.")


def print_summary(out: Console, summary: DemoSummary) -> None:
    """The closing table on the terminal."""
    table = Table(title="edge-agent demo: summary", show_header=False)
    table.add_column("what")
    table.add_column("value")
    ran = "-"
    if summary.device:
        ran = f"{summary.device} at {summary.precision}, " + (
            f"fallback: {summary.fallback}" if summary.fallback else "no fallback"
        )
    rows = [
        ("model", f"{summary.model} v{summary.model_version or '-'}"),
        ("deploy", f"{summary.deploy_s:.1f} s: pull over MQTT, verify, health gate"),
        ("ran on", ran),
        ("broker", f"{summary.broker}, MQTT {summary.mqtt_version}"),
        ("video", f"{summary.video_frames} frames"),
        ("results", f"{summary.results} frames, {summary.frames_with_person} with a person"),
        ("fps", f"{summary.fps:.1f}"),
        ("events", ", ".join(f"{k} x{v}" for k, v in sorted(summary.event_kinds.items()))),
        ("telemetry", f"{summary.telemetry_messages} messages"),
        ("ended", "interrupted (Ctrl-C or SIGTERM)" if summary.interrupted else "the video ended"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
