"""What `edge-fleet status`, `watch` and `deploy` print: rich tables, and the same as JSON.

Pure: records in, tables and dicts out; the caller picks the console. Every word a box
supplies (its id, group, versions, model and pipeline names, details, error codes and
messages) goes through `printable` before it reaches a terminal: a box writes its own
state and answers under any ACL, and a terminal obeys the escape sequences in what it
prints (a title change, a clipboard write, a cleared screen). JSON escapes them itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from edge_agent.fleet import clock
from edge_agent.fleet.console import error_of
from edge_agent.fleet.group import DeviceResult
from edge_agent.fleet.roster import DeviceRecord
from edge_agent.fleet.trouble import (
    SILENT_MIN_S,
    all_flags,
    device_flags,
    in_trouble,
    pipeline_flags,
)

DETAIL_WIDTH = 48
"""A pipeline's detail in a table, past which it is cut (in full in --json): a failed
camera's reason runs to 100 characters, and a row must still fit a terminal."""


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 control characters, and DEL: ESC starts a sequence, and 0x9b is CSI alone.
And the bidirectional marks and overrides: U+202E showed a box's `gnissim` as `missing`,
and could turn a row's cells around."""


def printable(text: object) -> str:
    """`text` as one line a terminal only shows: every control character removed (tabs and
    line breaks become spaces), runs of spaces made one.

    rich's `escape` keeps a box's `[red]` from being read as markup; this keeps its
    `\\x1b]52;...` from being obeyed by the terminal.
    """
    spaced = _CONTROL.sub(lambda c: " " if c.group().isspace() else "", str(text))
    return " ".join(spaced.split())


def cell(text: object) -> str:
    """A box's word as a rich table cell: printable, and not taken for markup."""
    return escape(printable(text))


def age(ts: float | None, now: float | None = None) -> str:
    """`ts` as a short age against `now` (the console's clock): 4s, 3m, 2h, 5d."""
    if ts is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"


def short(text: str, width: int = DETAIL_WIDTH) -> str:
    """`text` on one printable line, cut to `width` with an ellipsis."""
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def device_age(record: DeviceRecord, ts: float, now: float | None = None) -> str:
    """The age of a time the box stamped, or `?` when its clock is known to be off (a box
    a year ahead would read 0s forever)."""
    return "?" if clock.off(record.skew_s) else age(ts, now)


def standing(record: DeviceRecord) -> str:
    """The state cell: online, offline, or unknown when the broker no longer holds the
    state this console last had (its own link came back without it): shown as it was, an
    `online` gone from the broker read as a box running fine."""
    if record.unknown:
        return "[yellow]unknown[/]"
    return "[green]online[/]" if record.online else "[red]offline[/]"


def seen(record: DeviceRecord, now: float | None = None) -> str:
    """When the box was last seen, worded for what the console really knows.

    An offline box the console saw go (its will or clean stop arrived live) went offline
    then. One known only from the retained will is dated by the will's `ts`, made when
    the box connected: that, and not its going, is what the age says.
    """
    state = record.state
    if state is not None and not state.online:
        if record.state_arrived is not None:
            return f"offline {age(record.state_arrived, now)}"
        return f"connected {device_age(record, state.ts, now)} ago"
    return age(record.last_seen, now)


# --- status ---------------------------------------------------------------------------------
def status_table(records: Iterable[DeviceRecord], now: float | None = None) -> Table:
    table = Table(title="devices (retained state)", expand=False)
    columns = ("device", "state", "group", "seq", "since", "agent", "models", "pipelines", "flags")
    for column in columns:
        table.add_column(column, no_wrap=column in ("device", "state"))
    for record in records:
        state = record.state
        if state is None:
            continue
        # One entry per compile: a model on two devices or engines is listed twice, the
        # engine said so that the two can be told apart (agents before it send none).
        models = ", ".join(
            cell(m.name)
            + (f" v{m.version}" if m.version else "")
            + (f" @{cell(m.device)}" if m.device else "")
            + (f" {cell(m.backend)}" if m.backend else "")
            + (" (fallback)" if m.fallback else "")
            for m in state.models
        )
        pipelines = ", ".join(
            # escaped: a box's words (`refused [errno 111]`) are not rich markup
            f"{cell(p.id)} {p.status}" + (f": {escape(short(p.detail))}" if p.detail else "")
            for p in state.pipelines
        )
        table.add_row(
            cell(record.device),
            standing(record),
            cell(state.group or "-"),
            str(state.seq),
            seen(record, now) if not state.online else device_age(record, state.ts, now),
            # The build tells builds of one version apart; boxes before it send none.
            cell(" ".join(filter(None, (state.agent_version, state.agent_build))) or "-"),
            models or "-",
            pipelines or "-",
            ", ".join(device_flags(record)) or "-",
        )
    return table


def status_json(records: Iterable[DeviceRecord]) -> list[dict[str, Any]]:
    """The retained states, each with the device's flags: the table's `flags` column, which
    a script (a nightly audit of `unverified` boxes) had to recompute from the state."""
    return [
        {
            "device": r.device,
            **r.state.model_dump(mode="json", exclude_none=True),
            "flags": device_flags(r),
        }
        for r in records
        if r.state is not None
    ]


# --- watch ----------------------------------------------------------------------------------
def pipeline_figures(record: DeviceRecord) -> dict[str, dict[str, Any]]:
    """Each pipeline's status and detail (from state), last interval's FPS and end-to-end
    p95, and its flags."""
    figures: dict[str, dict[str, Any]] = {}
    for pipeline in record.state.pipelines if record.state else []:
        figures[pipeline.id] = {
            "status": pipeline.status,
            "detail": pipeline.detail,
            "fps": None,
            "p95_ms": None,
        }
    for name, stats in record.telemetry.pipelines.items() if record.telemetry else []:
        e2e = stats.stages.get("end_to_end")
        entry = figures.setdefault(name, {"status": None, "detail": ""})
        entry["fps"] = stats.fps
        entry["p95_ms"] = e2e.p95_ms if e2e else None
    flags = pipeline_flags(record)
    for name, entry in figures.items():
        entry["flags"] = flags.get(name, [])
    return figures


def _height(record: DeviceRecord) -> int:
    """The rows `record` takes in `watch_table`: one per pipeline, one if it has none."""
    named = {p.id for p in record.state.pipelines} if record.state else set()
    named.update(record.telemetry.pipelines if record.telemetry else ())
    return max(1, len(named))


def watch_json(
    records: Iterable[DeviceRecord],
    now: float | None = None,
    *,
    silent_min_s: float = SILENT_MIN_S,
) -> list[dict[str, Any]]:
    """`last_seen` is the console's clock when `last_seen_from` is `arrival`; `device_clock`
    is the box's own (for an offline box heard of only retained: when it connected).
    `online` is null for a device whose state is unknown (flag `unconfirmed since
    reconnect`). `silent_min_s` as in `trouble.silent_at`."""
    now = time.time() if now is None else now
    return [
        {
            "device": r.device,
            # null when unknown: false would say the box went offline, which no one knows.
            "online": None if r.unknown else r.online,
            "seq": r.state.seq if r.state else None,
            "last_seen": r.last_seen,
            "last_seen_from": (
                "arrival" if r.last_heard is not None else "device_clock" if r.last_seen else None
            ),
            "clock_skew_s": round(r.skew_s, 1) if r.skew_s is not None else None,
            "outbox_depth": r.telemetry.agent.outbox_depth if r.telemetry else None,
            "in_trouble": in_trouble(r, now, silent_min_s=silent_min_s),
            "flags": all_flags(r, now, silent_min_s=silent_min_s),
            "pipelines": pipeline_figures(r),
        }
        for r in records
    ]


def watch_table(
    records: Iterable[DeviceRecord],
    now: float | None = None,
    limit: int | None = None,
    offline_since: float | None = None,
    *,
    silent_min_s: float = SILENT_MIN_S,
) -> Table:
    """The fleet as a table; past `limit` rows, devices in trouble first, those that do not
    fit whole counted. A device takes a row per pipeline.

    A terminal shows a screenful: at 5,000 boxes sorted by name, an offline one was
    thousands of rows below it (and building every row took 3 s, twice a second).
    `offline_since`: when the console's own link to the broker went down, if it is down;
    the caption says so, since nothing below can change until it is back. `silent_min_s`
    as in `trouble.silent_at`.
    """

    def trouble(record: DeviceRecord) -> bool:
        return in_trouble(record, now, silent_min_s=silent_min_s)

    now = time.time() if now is None else now
    records = list(records)
    hidden: list[DeviceRecord] = []
    if limit is not None and sum(map(_height, records)) > limit:
        ordered = sorted(records, key=lambda r: (not trouble(r), r.device))
        used = fit = 0
        while fit < len(ordered) and used + _height(ordered[fit]) <= limit:
            used += _height(ordered[fit])
            fit += 1
        records, hidden = ordered[:fit], ordered[fit:]
    notes = []
    if offline_since is not None:
        lost = time.strftime("%H:%M:%S", time.localtime(offline_since))
        notes.append(f"[red]this console lost the broker at {lost}: the table is as of then[/]")
    if hidden:
        failing = sum(map(trouble, hidden))
        notes.append(
            f"{len(hidden)} more not shown ({failing} of them offline, failing or flagged); "
            "--once S --json lists every device"
        )
    caption = "\n".join(notes) or None
    rows: list[list[str | Text]] = []
    for record in records:
        state = standing(record)
        outbox = str(record.telemetry.agent.outbox_depth) if record.telemetry else "-"
        last = seen(record, now)
        own = device_flags(record, now, silent_min_s=silent_min_s)
        pipelines = list(pipeline_figures(record).items()) or [("-", {})]
        for i, (pipeline, figures) in enumerate(pipelines):
            fps = figures.get("fps")
            p95 = figures.get("p95_ms")
            flags = (own if i == 0 else []) + figures.get("flags", [])
            rows.append(
                [
                    cell(record.device) if i == 0 else "",
                    state if i == 0 else "",
                    cell(pipeline),
                    figures.get("status") or "-",
                    f"{fps:.1f}" if fps is not None else "-",
                    f"{p95:.1f} ms" if p95 is not None else "-",
                    outbox if i == 0 else "",
                    last if i == 0 else "",
                    Text(", ".join(flags), style="yellow"),
                    # One line, cut: a row per pipeline keeps a screenful a screenful.
                    Text(printable(figures.get("detail") or ""), no_wrap=True, overflow="ellipsis"),
                ]
            )
    table = Table(title="fleet (telemetry, last interval)", expand=False, caption=caption)
    columns = [
        ("device", "left"),
        ("state", "left"),
        ("pipeline", "left"),
        ("status", "left"),
        ("FPS", "right"),
        ("e2e p95", "right"),
        ("outbox", "right"),
        ("last seen", "right"),
        ("flags", "left"),
        ("detail", "left"),
    ]
    # flags and detail only when a row has one: a healthy fleet's table is as narrow as
    # it was. A narrow terminal narrows the detail first, then wraps the rest: a device's
    # name, state, pipeline and status stay whole.
    shown = [i for i in range(len(columns)) if i < 8 or any(str(row[i]) for row in rows)]
    for i in shown:
        column, justify = columns[i]
        table.add_column(
            column,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=i < 4,
            max_width=DETAIL_WIDTH if column == "detail" else None,
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
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
            if not isinstance(swapped, list):
                # A box's answer, not ours: a number in it ended the console after the
                # deploy had run, and a string was listed letter by letter.
                detail += ", swapped: malformed"
            elif swapped:
                detail += f", swapped {', '.join(map(str, swapped))}"
        elif entry.outcome == "error" and entry.answer is not None:
            error = error_of(entry.answer)
            outcome, version, code, detail = "[red]error[/]", "-", error.code, error.message
        elif entry.outcome == "interrupted":
            outcome, version, code = "[yellow]interrupted[/]", "-", ""
            detail = unfinished(entry, "when stopped")
        else:
            outcome, version, code = "[yellow]timeout[/]", "-", "command.timeout"
            detail = unfinished(entry, "when the wait ended")
        table.add_row(cell(entry.device), outcome, cell(version), cell(code), cell(detail))
    return table


def unfinished(entry: DeviceResult, when: str) -> str:
    """How far a device without a final answer had got `when` the console stopped waiting:
    one that had started may still be running the command."""
    last = entry.progress
    if last is not None:
        return f"in progress at {last.stage} {last.fraction:.0%} {when}"
    return f"accepted, no progress {when}" if entry.started else "no answer"


def results_json(results: Iterable[DeviceResult]) -> dict[str, Any]:
    """Each device's outcome and final answer; without one, whether it had started and its
    last progress (as the table's detail)."""
    return {
        r.device: {
            "outcome": r.outcome,
            "answer": r.answer.model_dump(mode="json", exclude_none=True) if r.answer else None,
            "started": r.started,
            "progress": r.progress.model_dump(mode="json") if r.progress else None,
        }
        for r in results
    }
