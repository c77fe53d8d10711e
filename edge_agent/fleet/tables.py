"""What `edge-fleet status`, `watch` and `deploy` print: rich tables, and the same as JSON.

Pure: records in, tables and dicts out; the caller picks the console.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rich.table import Table

from edge_agent.fleet.roster import DeviceRecord, DeviceResult


def age(ts: float | None, now: float | None = None) -> str:
    """`ts` as a short age: 4s, 3m, 2h, 5d (the device's clock against ours)."""
    if ts is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


# --- status ---------------------------------------------------------------------------------
def status_table(records: Iterable[DeviceRecord]) -> Table:
    table = Table(title="devices (retained state)", expand=False)
    for column in ("device", "state", "group", "seq", "since", "agent", "models", "pipelines"):
        table.add_column(column)
    for record in records:
        state = record.state
        if state is None:
            continue
        models = ", ".join(
            m.name + (f" v{m.version}" if m.version else "") + (f" @{m.device}" if m.device else "")
            for m in state.models
        )
        pipelines = ", ".join(f"{p.id} {p.status}" for p in state.pipelines)
        table.add_row(
            record.device,
            "[green]online[/]" if state.online else "[red]offline[/]",
            state.group or "-",
            str(state.seq),
            age(state.ts),
            state.agent_version or "-",
            models or "-",
            pipelines or "-",
        )
    return table


def status_json(records: Iterable[DeviceRecord]) -> list[dict[str, Any]]:
    return [
        {"device": r.device, **r.state.model_dump(mode="json", exclude_none=True)}
        for r in records
        if r.state is not None
    ]


# --- watch ----------------------------------------------------------------------------------
def pipeline_figures(record: DeviceRecord) -> dict[str, dict[str, Any]]:
    """Each pipeline's status (from state) and last interval's FPS and end-to-end p95."""
    figures: dict[str, dict[str, Any]] = {}
    for pipeline in record.state.pipelines if record.state else []:
        figures[pipeline.id] = {"status": pipeline.status, "fps": None, "p95_ms": None}
    for name, stats in record.telemetry.pipelines.items() if record.telemetry else []:
        e2e = stats.stages.get("end_to_end")
        entry = figures.setdefault(name, {"status": None})
        entry["fps"] = stats.fps
        entry["p95_ms"] = e2e.p95_ms if e2e else None
    return figures


def watch_json(records: Iterable[DeviceRecord]) -> list[dict[str, Any]]:
    return [
        {
            "device": r.device,
            "online": r.online,
            "seq": r.state.seq if r.state else None,
            "last_seen": r.last_seen,
            "outbox_depth": r.telemetry.agent.outbox_depth if r.telemetry else None,
            "pipelines": pipeline_figures(r),
        }
        for r in records
    ]


def in_trouble(record: DeviceRecord) -> bool:
    """Offline, or with a pipeline that is not running: what an operator looks for first."""
    if not record.online:
        return True
    return any(f.get("status") not in (None, "running") for f in pipeline_figures(record).values())


def watch_table(
    records: Iterable[DeviceRecord], now: float | None = None, limit: int | None = None
) -> Table:
    """The fleet as a table; past `limit` devices, those in trouble first, the rest counted.

    A terminal shows a screenful: at 5,000 boxes sorted by name, an offline one was
    thousands of rows below it (and building every row took 3 s, twice a second).
    """
    records = list(records)
    hidden: list[DeviceRecord] = []
    if limit is not None and len(records) > limit:
        ordered = sorted(records, key=lambda r: (not in_trouble(r), r.device))
        records, hidden = ordered[:limit], ordered[limit:]
    caption = None
    if hidden:
        trouble = sum(in_trouble(r) for r in hidden)
        caption = f"{len(hidden)} more not shown ({trouble} of them offline or failing); " + (
            "--once S --json lists every device"
        )
    table = Table(title="fleet (telemetry, last interval)", expand=False, caption=caption)
    for column, justify in (
        ("device", "left"),
        ("state", "left"),
        ("pipeline", "left"),
        ("status", "left"),
        ("FPS", "right"),
        ("e2e p95", "right"),
        ("outbox", "right"),
        ("last seen", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for record in records:
        state = "[green]online[/]" if record.online else "[red]offline[/]"
        outbox = str(record.telemetry.agent.outbox_depth) if record.telemetry else "-"
        seen = age(record.last_seen, now)
        rows = list(pipeline_figures(record).items()) or [("-", {})]
        for i, (pipeline, figures) in enumerate(rows):
            fps = figures.get("fps")
            p95 = figures.get("p95_ms")
            table.add_row(
                record.device if i == 0 else "",
                state if i == 0 else "",
                pipeline,
                figures.get("status") or "-",
                f"{fps:.1f}" if fps is not None else "-",
                f"{p95:.1f} ms" if p95 is not None else "-",
                outbox if i == 0 else "",
                seen if i == 0 else "",
            )
    return table


# --- deploy ---------------------------------------------------------------------------------
def results_table(title: str, results: Iterable[DeviceResult]) -> Table:
    table = Table(title=title, expand=False)
    for column in ("device", "result", "version", "code", "detail"):
        table.add_column(column)
    for entry in results:
        if entry.outcome == "ok":
            outcome, version, code = "[green]ok[/]", str(entry.result.get("version", "-")), ""
            swapped = entry.result.get("pipelines_swapped") or []
            detail = "activated" if entry.result.get("activated") else "installed"
            detail += f", swapped {', '.join(swapped)}" if swapped else ""
        elif entry.outcome == "error" and entry.answer and entry.answer.error:
            outcome, version, code = "[red]error[/]", "-", entry.answer.error.code
            detail = entry.answer.error.message
        else:
            outcome, version, code = "[yellow]timeout[/]", "-", "command.timeout"
            last = entry.progress
            detail = f"no answer; last {last.stage} {last.fraction:.0%}" if last else "no answer"
        table.add_row(entry.device, outcome, version, code, detail)
    return table


def results_json(results: Iterable[DeviceResult]) -> dict[str, Any]:
    return {
        r.device: {
            "outcome": r.outcome,
            "answer": r.answer.model_dump(mode="json", exclude_none=True) if r.answer else None,
        }
        for r in results
    }
