"""Prometheus metrics in the text exposition format (0.0.4), named `edge_agent_*`.

Latencies are real histograms in seconds, read from each pipeline's whole-run
fixed-memory `LatencyHistogram` (cumulative, as Prometheus expects); frame,
drop and failure counters are the telemetry intervals summed since the agent
started (a pipeline's forgotten an hour after it last ran, `FORGET_AFTER_S`);
the rest are gauges from the latest telemetry. Two outputs, either or both:
- a node_exporter textfile, rewritten atomically (a temporary file in the same
  folder, then a rename), so the collector never reads half a file;
- an HTTP `/metrics` endpoint, bound to 127.0.0.1 unless told otherwise
  (`http_server.MetricsServer`).

`render` and `build_metrics` are pure; `PrometheusExporter` does the I/O.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.integrations.http_server import MetricsServer
from edge_agent.logs import error_text, log_event
from edge_agent.protocol.agent import State, Telemetry
from edge_agent.telemetry.histogram import LatencyHistogram

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds (`le`) of the latency buckets: a stage takes from well under a
millisecond (a sink) to seconds (a CPU inference of a big model)."""

Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Metric:
    """One metric family: its samples are (name suffix, labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def add(self, value: float, labels: Labels = (), suffix: str = "") -> None:
        self.samples.append((suffix, labels, value))


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(metrics: Sequence[Metric]) -> str:
    """The exposition text of `metrics`; a family without samples is left out."""
    lines = []
    for metric in metrics:
        if not metric.samples:
            continue
        lines.append(f"# HELP {metric.name} {_escape_help(metric.help)}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for suffix, labels, value in metric.samples:
            text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            selector = f"{{{text}}}" if text else ""
            lines.append(f"{metric.name}{suffix}{selector} {format_value(value)}")
    return "\n".join(lines) + "\n" if lines else ""


def add_histogram(
    metric: Metric,
    histogram: LatencyHistogram,
    labels: Labels,
    bounds_s: Sequence[float] = LATENCY_BUCKETS_S,
) -> None:
    """Cumulative `_bucket` samples, then `_sum` and `_count`, of one histogram."""
    counts, total = histogram.counts_at_most(bounds_s)
    for bound, count in zip(bounds_s, counts, strict=True):
        metric.add(count, (*labels, ("le", format_value(bound))), "_bucket")
    metric.add(total, (*labels, ("le", "+Inf")), "_bucket")
    metric.add(histogram.mean * total, labels, "_sum")
    metric.add(total, labels, "_count")


FORGET_AFTER_S = 3600.0
"""How long the counters of a pipeline absent from telemetry are kept. A console that
names its pipelines afresh (a job a day, a camera per shift) would otherwise add three
series per id for the life of the process: the text grows with every id ever run, and
Prometheus scrapes and stores all of it. An hour outlasts a live source's longest retry
wait (5 minutes), so a camera that comes back keeps its counters; one forgotten starts
them at 0 when it comes back, which Prometheus reads as a counter reset, as after a
restart."""


@dataclass(slots=True)
class Totals:
    """Counters summed over telemetry intervals since the agent started (or since the
    pipeline id last came back after `forget_after_s` away)."""

    frames: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    sink_failures: dict[str, int] = field(default_factory=dict)
    forget_after_s: float = FORGET_AFTER_S
    clock: Callable[[], float] = time.monotonic
    seen: dict[str, float] = field(default_factory=dict)
    """When each pipeline id was last in a telemetry interval (`clock`)."""

    def add(self, telemetry: Telemetry) -> None:
        now = self.clock()
        # Never one in this interval: at a telemetry interval of an hour (the longest
        # set_telemetry allows), every id would be forgotten just before it was counted.
        gone = [
            p
            for p, at in self.seen.items()
            if now - at > self.forget_after_s and p not in telemetry.pipelines
        ]
        for pipeline in gone:
            for counts in (self.seen, self.frames, self.dropped, self.sink_failures):
                counts.pop(pipeline, None)
        for pipeline, figures in telemetry.pipelines.items():
            self.seen[pipeline] = now
            self.frames[pipeline] = self.frames.get(pipeline, 0) + figures.frames
            self.dropped[pipeline] = self.dropped.get(pipeline, 0) + figures.dropped_frames
            self.sink_failures[pipeline] = (
                self.sink_failures.get(pipeline, 0) + figures.sink_failures
            )


def build_metrics(
    version: str,
    telemetry: Telemetry | None,
    totals: Totals,
    histograms: Mapping[str, Mapping[str, LatencyHistogram]],
    state: State | None = None,
) -> list[Metric]:
    """Every metric family from the latest telemetry, the totals and the live histograms.

    Args:
        version: edge-agent's version, for `edge_agent_build_info`.
        telemetry: The latest telemetry message; None before the first.
        totals: Counters summed over every interval so far.
        histograms: Whole-run latency histograms by pipeline, then stage.
        state: The agent's state as its birth says it (pipelines with their status,
            models with their device, trust), for the gauges telemetry lacks.
    """
    info = Metric("edge_agent_build_info", "gauge", "edge-agent build; the value is always 1.")
    info.add(1, (("version", version),))
    latency = Metric(
        "edge_agent_stage_latency_seconds",
        "histogram",
        "Seconds each pipeline stage took per frame, since the pipeline started.",
    )
    for pipeline in sorted(histograms):
        for stage, histogram in histograms[pipeline].items():
            if histogram.count:
                add_histogram(latency, histogram, (("pipeline", pipeline), ("stage", stage)))
    frames = Metric("edge_agent_frames_total", "counter", "Frames finished.")
    dropped = Metric("edge_agent_dropped_frames_total", "counter", "Frames dropped (too slow).")
    sinks = Metric("edge_agent_sink_failures_total", "counter", "Times a sink failed.")
    for metric, counts in (
        (frames, totals.frames),
        (dropped, totals.dropped),
        (sinks, totals.sink_failures),
    ):
        for pipeline in sorted(counts):
            metric.add(counts[pipeline], (("pipeline", pipeline),))
    metrics = [info, latency, frames, dropped, sinks]
    if telemetry is not None:
        metrics.extend(_gauges(telemetry))
    if state is not None:
        metrics.extend(_state_gauges(state))
    return metrics


def _state_gauges(state: State) -> list[Metric]:
    # Telemetry names running pipelines only: a failed one left edge_agent_pipeline_fps
    # without a word, and an alert on low FPS never fired for it.
    up = Metric(
        "edge_agent_pipeline_up", "gauge", "1 while the pipeline runs; 0 failed or stopped."
    )
    for pipeline in sorted(state.pipelines, key=lambda p: p.id):
        up.add(1 if pipeline.status == "running" else 0, (("pipeline", pipeline.id),))
    models = Metric(
        "edge_agent_model_info",
        "gauge",
        "A loaded model, where it runs and why a requested device was passed over (fallback "
        "empty when none was); the value is always 1.",
    )
    for model in sorted(state.models, key=lambda m: m.name):
        if model.device is not None:
            labels = (
                ("model", model.name),
                ("device", model.device),
                ("precision", model.precision or ""),
                ("fallback", model.fallback or ""),
                # A model on both engines is two entries of the state, on the same device
                # at the same precision: without it they would be one series twice.
                ("backend", model.backend or ""),
            )
            models.add(1, labels)
    unverified = Metric(
        "edge_agent_unverified",
        "gauge",
        "1 when the agent has no trusted keys and installs releases unverified.",
    )
    unverified.add(1 if state.unverified else 0)
    return [up, models, unverified]


def _gauges(telemetry: Telemetry) -> list[Metric]:
    fps = Metric("edge_agent_pipeline_fps", "gauge", "Frames per second over the last interval.")
    for pipeline in sorted(telemetry.pipelines):
        fps.add(telemetry.pipelines[pipeline].fps, (("pipeline", pipeline),))
    agent = telemetry.agent

    def gauge(name: str, help_text: str, value: float | None, kind: str = "gauge") -> Metric:
        metric = Metric(name, kind, help_text)
        if value is not None:
            metric.add(value)
        return metric

    return [
        fps,
        gauge(
            "edge_agent_cpu_ratio",
            "Process CPU over the interval (1 = one core).",
            agent.cpu_percent / 100.0,
        ),
        gauge("edge_agent_rss_bytes", "Resident memory of the agent.", agent.rss_bytes),
        gauge(
            "edge_agent_temperature_celsius",
            "Hottest thermal zone of the box.",
            agent.temperature_c,
        ),
        gauge("edge_agent_outbox_depth", "Messages waiting in the outbox.", agent.outbox_depth),
        gauge("edge_agent_outbox_bytes", "Bytes waiting in the outbox.", agent.outbox_bytes),
        gauge(
            "edge_agent_outbox_dropped_total",
            "Messages the outbox dropped.",
            agent.outbox_dropped,
            "counter",
        ),
        gauge(
            "edge_agent_reconnects_total",
            "Links to the broker lost since start.",
            agent.reconnects,
            "counter",
        ),
        gauge("edge_agent_uptime_seconds", "Seconds since the agent started.", agent.uptime_s),
        gauge(
            "edge_agent_telemetry_timestamp_seconds",
            "Unix time of the latest telemetry.",
            telemetry.ts,
        ),
    ]


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old file or the new, never half.

    The temporary file starts with a dot and does not end in .prom, so node_exporter
    skips it; it is in the same folder, so the rename cannot cross file systems.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            # Readable by node_exporter, another user: the unit's UMask=0027 made it 0640.
            # Metrics hold nothing secret (no credentials, no results).
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class PrometheusExporter:
    """Keeps the exposition text current and serves it. Thread-safe.

    Args:
        version: edge-agent's version.
        textfile: node_exporter textfile to rewrite on every update, or None.
        address: (host, port) for the /metrics endpoint, or None.
    """

    def __init__(
        self, version: str, textfile: Path | None, address: tuple[str, int] | None
    ) -> None:
        self.version = version
        self.textfile = textfile
        self._totals = Totals()
        self._lock = threading.Lock()
        self._text = render(build_metrics(version, None, self._totals, {}))
        self._write_failed = False
        self.server: MetricsServer | None = None
        if address is not None:
            try:
                self.server = MetricsServer(address, self.text, CONTENT_TYPE)
            except OSError as exc:
                # Metrics are a convenience: a taken port must not stop the fleet's agent.
                log_event(
                    log,
                    logging.ERROR,
                    "metrics_listen_failed",
                    address=f"{address[0]}:{address[1]}",
                    error=error_text(exc),
                )
        if textfile is not None:
            self._write(self._text)

    def text(self) -> str:
        """The latest exposition text."""
        with self._lock:
            return self._text

    def update(
        self,
        telemetry: Telemetry,
        histograms: Mapping[str, Mapping[str, LatencyHistogram]],
        state: State | None = None,
    ) -> str:
        """Fold in one telemetry interval, re-render, rewrite the textfile; returns the text."""
        with self._lock:
            self._totals.add(telemetry)
            text = self._text = render(
                build_metrics(self.version, telemetry, self._totals, histograms, state)
            )
        if self.textfile is not None:
            self._write(text)
        return text

    def _write(self, text: str) -> None:
        assert self.textfile is not None
        try:
            write_atomically(self.textfile, text)
        except OSError as exc:
            if not self._write_failed:  # once per failure spell, not every interval
                log_event(
                    log,
                    logging.WARNING,
                    "metrics_textfile_failed",
                    path=str(self.textfile),
                    error=error_text(exc),
                )
            self._write_failed = True
        else:
            self._write_failed = False

    def close(self) -> None:
        """Stop serving /metrics; the textfile stays (node_exporter shows its age)."""
        if self.server is not None:
            self.server.close()
