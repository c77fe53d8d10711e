"""What the demo shows on the terminal (stderr): live telemetry and events, then a summary.

On a terminal, a rich Live panel redrawn a few times a second; elsewhere (a
pipe, a CI log, the tests) one plain line per telemetry message and per event,
so the output reads as a log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from edge_agent.fleet.console import DeviceView
from edge_agent.protocol import agent as msg

REFRESH_HZ = 4.0
EVENTS_SHOWN = 8


def shown(event: msg.AgentEvent | msg.DetectionEvent) -> bool:
    """Updates of a tracked object come every frame it is seen: counted, not listed."""
    return not (isinstance(event, msg.DetectionEvent) and event.type == "update")


def event_line(event: msg.AgentEvent | msg.DetectionEvent) -> str:
    """One event as a short line: time, what, where."""
    if isinstance(event, msg.DetectionEvent):
        when = datetime.fromtimestamp(event.end_time or event.start_time).strftime("%H:%M:%S")
        box = ", ".join(f"{v:.0f}" for v in event.box)
        return (
            f"{when} detection {event.type:6s} {event.label} #{event.id} "
            f"score {event.score:.2f} box [{box}] ({event.pipeline})"
        )
    when = datetime.fromtimestamp(event.ts).strftime("%H:%M:%S")
    where = event.pipeline or event.model or ""
    version = f" v{event.version}" if event.version is not None else ""
    detail = f": {event.detail}" if event.detail else ""
    code = f" [{event.code}]" if event.code else ""
    return f"{when} {event.kind} {where}{version}{detail}{code}"


def telemetry_line(telemetry: msg.Telemetry, pipeline: str) -> str:
    """One telemetry message as a line: the pipeline's FPS and p95s, the agent's figures."""
    agent = telemetry.agent
    tail = (
        f"agent cpu {agent.cpu_percent:.0f}% rss {agent.rss_bytes / 2**20:.0f} MB "
        f"outbox {agent.outbox_depth}"
    )
    stats = telemetry.pipelines.get(pipeline)
    if stats is None:
        return f"telemetry: {pipeline} idle; {tail}"
    infer = stats.stages.get("infer")
    e2e = stats.stages.get("end_to_end")
    return (
        f"telemetry: {pipeline} {stats.fps:.1f} FPS, {stats.frames} frames, "
        f"dropped {stats.dropped_frames}, infer p95 {infer.p95_ms if infer else 0:.1f} ms, "
        f"end-to-end p95 {e2e.p95_ms if e2e else 0:.1f} ms; {tail}"
    )


def _panel(view: DeviceView, pipeline: str) -> Group:
    with view.lock:
        telemetry = view.telemetry
        events = [e for e in view.events if shown(e)][-EVENTS_SHOWN:]
        tally = view.pipelines.get(pipeline)
        stats = view.last_active.get(pipeline)
    table = Table(title=f"pipeline {pipeline} (telemetry, last interval)", expand=False)
    for column in ("FPS", "frames", "dropped", "infer p50", "infer p95", "e2e p95", "results"):
        table.add_column(column, justify="right")
    if stats is not None:
        infer = stats.stages.get("infer")
        e2e = stats.stages.get("end_to_end")
        table.add_row(
            f"{stats.fps:.1f}",
            str(stats.frames),
            str(stats.dropped_frames),
            f"{infer.p50_ms:.1f} ms" if infer else "-",
            f"{infer.p95_ms:.1f} ms" if infer else "-",
            f"{e2e.p95_ms:.1f} ms" if e2e else "-",
            str(tally.frames if tally else 0),
        )
    else:
        table.add_row("-", "-", "-", "-", "-", "-", str(tally.frames if tally else 0))
    agent = (
        Text(telemetry_line(telemetry, pipeline).split("; ", 1)[-1], style="dim")
        if telemetry
        else Text("waiting for telemetry ...", style="dim")
    )
    lines = [Text(event_line(e)) for e in events] or [Text("no events yet", style="dim")]
    return Group(table, agent, Text("events:", style="bold"), *lines)


class LiveView:
    """Shows `view` until `done()` or `stop` is set."""

    def __init__(self, console: Console, view: DeviceView, pipeline: str) -> None:
        self.console = console
        self.view = view
        self.pipeline = pipeline

    def run(self, done: Callable[[], bool], stop: threading.Event) -> None:
        if self.console.is_terminal:
            self._live(done, stop)
        else:
            self._lines(done, stop)

    def _live(self, done: Callable[[], bool], stop: threading.Event) -> None:
        with Live(
            _panel(self.view, self.pipeline),
            console=self.console,
            refresh_per_second=REFRESH_HZ,
            transient=False,
        ) as live:
            while not done() and not stop.wait(1.0 / REFRESH_HZ):
                live.update(_panel(self.view, self.pipeline))
            live.update(_panel(self.view, self.pipeline))

    def _lines(self, done: Callable[[], bool], stop: threading.Event) -> None:
        seen_telemetry = 0
        seen_events = 0
        while True:
            finished = done() or stop.is_set()
            with self.view.lock:
                telemetry = self.view.telemetry
                count = self.view.telemetry_count
                events = list(self.view.events)
                total = self.view.event_count
            if telemetry is not None and count != seen_telemetry:
                seen_telemetry = count
                self.console.print(
                    telemetry_line(telemetry, self.pipeline), highlight=False, soft_wrap=True
                )
            fresh = min(total - seen_events, len(events))
            for event in events[len(events) - fresh :] if fresh > 0 else []:
                if not shown(event):
                    continue
                self.console.print(f"event: {event_line(event)}", highlight=False, soft_wrap=True)
            seen_events = total
            if finished:
                return
            stop.wait(1.0 / REFRESH_HZ)
