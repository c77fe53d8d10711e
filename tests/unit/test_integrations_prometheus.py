"""Prometheus exposition: real histograms from the fixed-memory ones, parsed back strictly."""

from __future__ import annotations

import math
import os
import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from edge_agent.integrations import http_server
from edge_agent.integrations.http_server import MetricsServer
from edge_agent.integrations.prometheus import (
    CONTENT_TYPE,
    LATENCY_BUCKETS_S,
    Metric,
    PrometheusExporter,
    Totals,
    build_metrics,
    render,
    write_atomically,
)
from edge_agent.protocol.agent import (
    AgentTelemetry,
    ModelState,
    PipelineState,
    PipelineTelemetry,
    State,
    Telemetry,
)
from edge_agent.telemetry.histogram import LatencyHistogram

# --- a strict parser of the text format (0.0.4), written from the format's spec ----------------
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')

Series = tuple[tuple[str, str], ...]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        match = _LABEL.match(text, pos)
        assert match, f"bad labels at {text[pos:]!r}"
        value = match[2].replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        labels[match[1]] = value
        pos = match.end()
    return labels


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """Types by family and samples by metric name; asserts the format's rules."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: Samples = {}
    family = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            family = line.split(" ", 3)[2]
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}
            assert name == family, "TYPE follows the family's HELP"
            assert name not in types, "one TYPE per family"
            types[name] = kind
            continue
        match = _SAMPLE.match(line)
        assert match, f"bad sample line {line!r}"
        name, labels, value = match[1], _labels(match[2] or ""), float(match[3])
        assert family is not None
        assert name == family or (
            types[family] == "histogram"
            and name in {f"{family}_{s}" for s in ("bucket", "sum", "count")}
        ), f"{name} outside its family {family}"
        samples.setdefault(name, []).append((labels, value))
    return types, samples


def check_histogram(samples: Samples, family: str) -> dict[Series, list[float]]:
    """Buckets ascend in `le`, counts never fall, +Inf equals _count; returns buckets per series."""
    series: dict[Series, list[tuple[float, float]]] = {}
    for labels, value in samples[f"{family}_bucket"]:
        le = float(labels.pop("le"))
        series.setdefault(tuple(sorted(labels.items())), []).append((le, value))
    counts = {tuple(sorted(lab.items())): v for lab, v in samples[f"{family}_count"]}
    out = {}
    for key, buckets in series.items():
        bounds = [le for le, _ in buckets]
        values = [v for _, v in buckets]
        assert bounds == sorted(bounds)
        assert math.isinf(bounds[-1])
        assert values == sorted(values), "cumulative counts never fall"
        assert values[-1] == counts[key]
        out[key] = values
    return out


# --- the histogram method ---------------------------------------------------------------------
def test_counts_at_most_matches_exact_counts_within_one_bucket() -> None:
    rng = np.random.default_rng(3)
    samples = rng.lognormal(mean=math.log(0.02), sigma=1.2, size=5000)
    histogram = LatencyHistogram()
    for s in samples:
        histogram.record(float(s))
    counts, total = histogram.counts_at_most(LATENCY_BUCKETS_S)
    assert total == len(samples)
    for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=True):
        exact = int(np.sum(samples <= bound))
        # Over-counts at most the samples in the same 2%-wide bucket, never under-counts.
        slack = int(np.sum((samples > bound) & (samples <= bound * 1.02)))
        assert exact <= count <= exact + slack, (bound, exact, count)
    assert counts == sorted(counts)


def test_counts_at_most_is_exact_at_the_ends_and_when_empty() -> None:
    histogram = LatencyHistogram()
    assert histogram.counts_at_most([0.1, 1.0]) == ([0, 0], 0)
    for s in (0.003, 0.004, 0.004):
        histogram.record(s)
    assert histogram.counts_at_most([0.0029, 0.004, 0.0041, 1e9]) == ([0, 3, 3, 3], 3)
    assert histogram.counts_at_most([0.003])[0] == [1]


# --- rendering --------------------------------------------------------------------------------
def _telemetry(frames: int, fps: float, dropped: int = 0) -> Telemetry:
    return Telemetry(
        ts=1700000000.5,
        interval_s=10.0,
        pipelines={
            "dock": PipelineTelemetry(fps=fps, frames=frames, dropped_frames=dropped, stages={})
        },
        models={},
        agent=AgentTelemetry(
            cpu_percent=12.5,
            rss_bytes=123456789,
            temperature_c=None,
            outbox_depth=3,
            outbox_bytes=900,
            outbox_dropped=1,
            reconnects=2,
            uptime_s=20.0,
        ),
    )


def _histograms() -> dict[str, dict[str, LatencyHistogram]]:
    infer, end = LatencyHistogram(), LatencyHistogram()
    for ms in (4, 6, 8, 30, 700):
        infer.record(ms / 1e3)
        end.record(ms / 1e3 + 0.002)
    return {"dock": {"infer": infer, "end_to_end": end, "sink": LatencyHistogram()}}


def test_exposition_parses_back_with_real_histograms_in_seconds() -> None:
    totals = Totals()
    totals.add(_telemetry(frames=300, fps=30.0, dropped=2))
    totals.add(_telemetry(frames=290, fps=29.0, dropped=1))
    text = render(build_metrics("1.2.3", _telemetry(290, 29.0), totals, _histograms()))
    types, samples = parse(text)
    assert all(name.startswith("edge_agent_") for name in types)
    assert types["edge_agent_stage_latency_seconds"] == "histogram"
    assert types["edge_agent_frames_total"] == "counter"
    assert types["edge_agent_pipeline_fps"] == "gauge"
    buckets = check_histogram(samples, "edge_agent_stage_latency_seconds")
    infer = buckets[(("pipeline", "dock"), ("stage", "infer"))]
    les = [*LATENCY_BUCKETS_S, math.inf]
    assert infer[les.index(0.005)] == 1  # 4 ms
    assert infer[les.index(0.01)] == 3  # 4, 6, 8 ms
    assert infer[les.index(0.5)] == 4  # not the 700 ms one
    assert infer[-1] == 5
    assert (("pipeline", "dock"), ("stage", "sink")) not in buckets  # no samples, no series
    [(_, total_s)] = [
        (lab, v)
        for lab, v in samples["edge_agent_stage_latency_seconds_sum"]
        if lab["stage"] == "infer"
    ]
    assert total_s == pytest.approx(0.748)
    assert samples["edge_agent_frames_total"] == [({"pipeline": "dock"}, 590.0)]
    assert samples["edge_agent_dropped_frames_total"] == [({"pipeline": "dock"}, 3.0)]
    assert samples["edge_agent_pipeline_fps"] == [({"pipeline": "dock"}, 29.0)]
    assert samples["edge_agent_rss_bytes"] == [({}, 123456789.0)]
    assert samples["edge_agent_cpu_ratio"] == [({}, 0.125)]
    assert samples["edge_agent_reconnects_total"] == [({}, 2.0)]
    assert samples["edge_agent_build_info"] == [({"version": "1.2.3"}, 1.0)]
    assert "edge_agent_temperature_celsius" not in types  # the box has no sensor: no sample


def test_counters_of_pipelines_long_gone_are_forgotten() -> None:
    # A console naming a pipeline afresh each day: without forgetting, three series per id
    # for the life of the process. A camera back within its retry waits keeps its count.
    now = [0.0]
    totals = Totals(clock=lambda: now[0])

    def interval(**frames: int) -> Telemetry:
        pipes = {
            p: PipelineTelemetry(fps=1.0, frames=n, dropped_frames=0, stages={})
            for p, n in frames.items()
        }
        return _telemetry(0, 0.0).model_copy(update={"pipelines": pipes})

    for day in range(30):
        for _ in range(144):  # a telemetry interval every 10 minutes
            totals.add(interval(**{"camera": 10, f"job-{day}": 5}))
            now[0] += 600.0
    _, samples = parse(render(build_metrics("1", None, totals, {})))
    frames = {lab["pipeline"]: v for lab, v in samples["edge_agent_frames_total"]}
    assert frames == {"camera": 30 * 144 * 10.0, "job-29": 144 * 5.0}
    assert len(samples["edge_agent_dropped_frames_total"]) == 2
    # Away for five minutes more (a camera's longest retry wait): the counts go on.
    now[0] += 300.0
    totals.add(interval(camera=1))
    assert totals.frames == {"camera": 30 * 144 * 10 + 1, "job-29": 144 * 5}
    # An hour's interval (the longest there is): what runs is counted on, not forgotten.
    now[0] += 3601.0
    totals.add(interval(camera=7))
    assert totals.frames == {"camera": 30 * 144 * 10 + 8}
    assert set(totals.seen) == set(totals.dropped) == set(totals.sink_failures) == {"camera"}
    # Away for over an hour while others report: forgotten, and back from 0.
    now[0] += 3601.0
    totals.add(interval(other=1))
    totals.add(interval(camera=2))
    assert totals.frames == {"other": 1, "camera": 2}


def test_label_values_and_help_are_escaped() -> None:
    metric = Metric("edge_agent_x", "gauge", "line one\nback\\slash")
    metric.add(1.5, (("pipeline", 'a"b\\c\nd'),))
    text = render([metric])
    assert "# HELP edge_agent_x line one\\nback\\\\slash\n" in text
    _, samples = parse(text)
    assert samples["edge_agent_x"] == [({"pipeline": 'a"b\\c\nd'}, 1.5)]


# --- outputs ----------------------------------------------------------------------------------
def test_textfile_is_replaced_atomically_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "edge_agent.prom"
    write_atomically(path, "old\n")
    before = path.stat().st_ino
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n"
    assert path.stat().st_ino != before  # a new file renamed over, not rewritten in place
    umask = os.umask(0o027)  # the unit's
    try:
        write_atomically(path, "newer\n")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644  # node_exporter runs as another user
    assert [p.name for p in tmp_path.iterdir()] == ["edge_agent.prom"]


def test_exporter_rewrites_the_textfile_each_interval(tmp_path: Path) -> None:
    path = tmp_path / "edge_agent.prom"
    exporter = PrometheusExporter("1.2.3", path, None)
    assert "edge_agent_build_info" in path.read_text()
    exporter.update(_telemetry(10, 1.0), _histograms())
    exporter.update(_telemetry(20, 2.0), _histograms())
    _, samples = parse(path.read_text())
    assert samples["edge_agent_frames_total"] == [({"pipeline": "dock"}, 30.0)]
    assert exporter.text() == path.read_text()


def test_textfile_failures_are_logged_not_raised(tmp_path: Path) -> None:
    exporter = PrometheusExporter("1", tmp_path / "missing" / "x.prom", None)
    exporter.update(_telemetry(1, 1.0), {})  # folder does not exist: logged, agent goes on
    assert "edge_agent_frames_total" in exporter.text()


def test_metrics_endpoint_serves_on_loopback() -> None:
    exporter = PrometheusExporter("1.2.3", None, ("127.0.0.1", 0))
    assert exporter.server is not None
    try:
        exporter.update(_telemetry(5, 0.5), _histograms())
        url = f"http://127.0.0.1:{exporter.server.port}"
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            body = response.read().decode()
        assert body == exporter.text()
        parse(body)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "/", timeout=5)
        assert err.value.code == 404
        err.value.close()
    finally:
        exporter.close()


def test_a_taken_port_is_logged_and_the_exporter_still_works() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        exporter = PrometheusExporter("1", None, ("127.0.0.1", taken.getsockname()[1]))
        assert exporter.server is None
        assert "edge_agent_build_info" in exporter.text()


def test_server_closes_and_frees_its_port() -> None:
    server = MetricsServer(("127.0.0.1", 0), lambda: "x 1\n", CONTENT_TYPE)
    port = server.port
    server.close()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


def test_a_failed_pipeline_a_fallback_and_no_trusted_keys_are_metrics() -> None:
    # Telemetry names running pipelines only: a failed camera left edge_agent_pipeline_fps
    # without a word, and an alert on low FPS never fired for it. Where a model runs, why
    # not where it was asked to, and an agent installing unverified were JSON-only.
    state = State(
        online=True,
        seq=1,
        ts=1700000000.0,
        unverified=True,
        models=[
            ModelState(
                name="person",
                digest="d" * 64,
                device="CPU",
                precision="bf16",
                fallback="NPU: not present on this machine",
                backend="openvino",
            ),
            ModelState(name="idle", digest="e" * 64),  # installed, not loaded: no device
        ],
        pipelines=[
            PipelineState(id="dock", model="person", status="running"),
            PipelineState(id="gate", model="person", status="failed", detail="camera gone"),
        ],
    )
    types, samples = parse(
        render(build_metrics("1.2.3", _telemetry(290, 29.0), Totals(), {}, state))
    )
    assert types["edge_agent_pipeline_up"] == "gauge"
    assert samples["edge_agent_pipeline_up"] == [({"pipeline": "dock"}, 1.0),
                                                 ({"pipeline": "gate"}, 0.0)]  # fmt: skip
    assert samples["edge_agent_pipeline_fps"] == [({"pipeline": "dock"}, 29.0)]
    assert samples["edge_agent_model_info"] == [
        (
            {"model": "person", "device": "CPU", "precision": "bf16",
             "fallback": "NPU: not present on this machine", "backend": "openvino"},
            1.0,
        )
    ]  # fmt: skip
    assert samples["edge_agent_unverified"] == [({}, 1.0)]


def _scrape_within(url: str, limit_s: float) -> bytes:
    give_up = time.monotonic() + limit_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body: bytes = r.read()
                return body
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > give_up:
                raise
            time.sleep(0.05)


def test_held_connections_are_bounded_and_cut_and_resets_say_nothing(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # One client holding ~1,000 half-sent requests (a byte every few seconds passed the
    # per-read timeout) used up the agent's descriptors, and with them its MQTT link,
    # sqlite and cameras; every reset connection printed a 23-line traceback to the journal.
    monkeypatch.setattr(http_server, "REQUEST_S", 1.0)
    server = MetricsServer(("127.0.0.1", 0), lambda: "x 1\n", CONTENT_TYPE)
    address = ("127.0.0.1", server.port)
    before = threading.active_count()
    held: list[socket.socket] = []
    try:
        for _ in range(http_server.MAX_CONNECTIONS + 20):
            client = socket.create_connection(address, timeout=5)
            client.sendall(b"GET /metr")  # and never the rest
            held.append(client)
        time.sleep(0.3)
        # A thread and a deadline per connection served, none for the rest.
        assert threading.active_count() - before <= 2 * http_server.MAX_CONNECTIONS
        # Each is cut by its deadline, whole: the server closed it (a read sees the end).
        for client in held[: http_server.MAX_CONNECTIONS]:
            assert client.recv(100) == b""
        # Then scrapes are served again, once the cut handlers have given back their slots
        # (the client sees the end a moment before its handler's thread returns).
        assert _scrape_within(f"http://127.0.0.1:{server.port}/metrics", 5.0) == b"x 1\n"
        for _ in range(5):  # reset before the request is whole
            client = socket.create_connection(address, timeout=5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.sendall(b"GET /metrics HTTP/1.1\r\n")
            client.close()
        time.sleep(0.5)
    finally:
        for client in held:
            client.close()
        server.close()
    assert "Traceback" not in capfd.readouterr().err
