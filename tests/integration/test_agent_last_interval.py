"""A pipeline that ends between two telemetry ticks is still reported, once, with its model.

Telemetry is per interval. A file that plays out between two ticks (a short clip, a
fast model) used to vanish from telemetry: the tick after its end listed running
pipelines only, so its frames were never reported anywhere. Then it was reported without
its model: the run had given the model back to the pool, and with it the compile report
that says the model's device. Real pipeline, real model, real photos; the ticks are called
by hand so their timing is the test's, not a clock's.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.telemetry import model_telemetry
from edge_agent.clips import write_walk
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def _ending_pipelines(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> tuple[Pipelines, dict[str, Any], threading.Event]:
    """agent_kit's photo pipelines, and an event set whenever a run ends."""
    ended = threading.Event()

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        if event.kind in ("pipeline_failed", "pipeline_stopped"):
            ended.set()

    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    return pipelines, spec, ended


def test_the_last_interval_of_an_ended_run_is_reported_once_and_in_order(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    pipelines, spec, ended = _ending_pipelines(tmp_path, cache_dir, astronaut)
    try:
        assert pipelines.tick().stats == {}
        # Two whole runs of the same id, with no tick between them.
        for _ in range(2):
            ended.clear()
            pipelines.start(spec, persist=False)
            assert ended.wait(60), "the pipeline never ended"
            pipelines.stop("cam")
        assert pipelines.pool.reports() == {}  # both runs gave their model back
        first = pipelines.tick()
        assert list(first.stats) == ["cam"]
        # Both runs, together: one a tick once let runs that end faster than ticks come (a
        # camera retried every few seconds, an hour's interval) queue without bound.
        assert first.stats["cam"].frames == 6
        assert first.stats["cam"].interval
        assert first.stats["cam"].stages["infer"].count == 6
        # The model that served the ended runs, and where it ran, outlive the runs.
        assert first.models == {"cam": "face-blazeface"}
        assert first.reports["cam"].device == "CPU"
        second = pipelines.tick()
        assert (second.stats, second.models) == ({}, {})  # and each reported once only
    finally:
        pipelines.close()


def test_every_tick_names_the_model_of_each_pipeline_it_reports_and_loses_no_frame(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # Ticks taken without pause while runs end: a run closing (giving its model back to
    # the pool) while a tick read it as running once left that tick with figures and no
    # model, and no tick may miss or repeat a frame either.
    runs = 12
    pipelines, spec, ended = _ending_pipelines(tmp_path, cache_dir, astronaut)
    done = threading.Event()
    unnamed: list[str] = []
    frames = [0]

    def tick_once() -> None:
        tick = pipelines.tick()
        for pipeline_id, stats in tick.stats.items():
            frames[0] += stats.frames
            model = tick.models.get(pipeline_id)
            if stats.frames and (model is None or pipeline_id not in tick.reports):
                unnamed.append(f"{pipeline_id}: {stats.frames} frames, model {model}")

    def ticker() -> None:
        while not done.is_set():
            tick_once()

    thread = threading.Thread(target=ticker, name="ticker")
    thread.start()
    try:
        for _ in range(runs):
            ended.clear()
            pipelines.start(spec, persist=False)
            assert ended.wait(60), "the pipeline never ended"
            pipelines.stop("cam")
    finally:
        done.set()
        thread.join()
        tick_once()  # whatever ended after the ticker's last look
        pipelines.close()
    assert not unnamed, unnamed
    assert frames[0] == 3 * runs


def test_every_tick_names_the_model_of_a_pipeline_across_model_swaps(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # A swap retires the old model (the pool forgets its report with it) once its last
    # frame is out, and the next frame comes from the new model a moment later: a tick in
    # between named the model of the latest frame, the old one, and found no report for it.
    swaps = 8
    swapped = threading.Event()

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        if event.kind == "model_swapped":
            swapped.set()

    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    video = write_walk(tmp_path / "walk.avi", frames=60).path
    spec["source"] = {"type": "file", "path": str(video), "realtime": True, "loop": True}
    done = threading.Event()
    unnamed: list[str] = []
    reported = [0]

    def ticker() -> None:
        while not done.is_set():
            tick = pipelines.tick()
            for pipeline_id, stats in tick.stats.items():
                infer = stats.stages.get("infer")
                if infer is None or not infer.count:
                    continue
                reported[0] += infer.count
                model = tick.models.get(pipeline_id)
                if model is None or pipeline_id not in tick.reports:
                    unnamed.append(f"{pipeline_id}: {infer.count} runs, model {model}")

    thread = threading.Thread(target=ticker, name="ticker")
    try:
        pipelines.start(spec, persist=False)
        thread.start()
        for i in range(swaps):
            swapped.clear()
            name = "person-ssdlite" if i % 2 == 0 else "face-blazeface"
            pipelines.swap("cam", {"name": name})
            assert swapped.wait(60), f"the swap to {name} never landed"
            time.sleep(0.2)  # a few frames on the new model
    finally:
        done.set()
        if thread.is_alive():
            thread.join()
        pipelines.close()
    assert reported[0] > 0
    assert not unnamed, unnamed


def test_an_ended_run_lets_go_of_its_pipeline(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # A pipeline that played out stays listed until stop_pipeline, which may never come
    # (one-off jobs with fresh ids). Its entry once kept the whole dead handle: input
    # buffers for every frame in flight, histograms and sinks.
    pipelines, spec, ended = _ending_pipelines(tmp_path, cache_dir, astronaut)
    walk = write_walk(tmp_path / "walk.avi", empty=5, crossing=10)
    spec = {**spec, "source": {"type": "file", "path": str(walk.path)}}
    try:
        pipelines.start(spec, persist=False)
        handle = weakref.ref(pipelines.handles()["cam"])
        assert ended.wait(60), "the pipeline never ended"
        deadline = time.monotonic() + 10
        while handle() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert handle() is None, "the ended run's handle is still held"
        [state] = pipelines.states()
        assert (state.id, state.status) == ("cam", "stopped")
        assert pipelines.tick().stats["cam"].frames > 0  # its figures were kept
    finally:
        pipelines.close()


def test_a_model_on_two_engines_is_reported_with_the_engine_its_latency_came_from(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # One model name, two compiles: text-orientation on OpenVINO for one camera and on ONNX
    # Runtime for another (on a box with an iGPU: one on the CPU, one on the GPU). Reports
    # were kept per name, so both pipelines, and the model's telemetry, got the latest
    # compile's engine and device, beside the latency of whichever pipeline was busiest.
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    engines = {"ov": "openvino", "ort": "onnxruntime"}
    try:
        for pipeline_id, backend in engines.items():
            spec = {
                "id": pipeline_id,
                "model": {"name": "text-orientation", "backend": backend},
                "source": {
                    "type": "file",
                    "path": str(video),
                    "realtime": True,
                    "loop": True,
                    # The ONNX Runtime one busier, and compiled last: the latest compile
                    # of the name is neither's by accident.
                    "fps_cap": 25 if backend == "onnxruntime" else 5,
                },
            }
            pipelines.start(spec, persist=False)
        counts: dict[str, int] = dict.fromkeys(engines, 0)
        deadline = time.monotonic() + 60
        while min(counts.values()) < 5 and time.monotonic() < deadline:
            time.sleep(0.5)
            tick = pipelines.tick()
            for pipeline_id in engines:
                infer = tick.stats.get(pipeline_id)
                if infer is None or not infer.stages.get("infer"):
                    continue
                counts[pipeline_id] += infer.stages["infer"].count
                assert tick.models[pipeline_id] == "text-orientation"
                assert tick.reports[pipeline_id].backend == engines[pipeline_id]
            if all(tick.stats.get(p) and tick.stats[p].frames for p in engines):
                busiest = max(engines, key=lambda p: tick.stats[p].stages["infer"].count)
                model = model_telemetry(tick.stats, tick.models, tick.reports)
                assert model["text-orientation"].backend == engines[busiest]
        assert min(counts.values()) >= 5, counts
        # A run that has ended is reported once more, with its own compile too.
        pipelines.stop("ov")
        tick = pipelines.tick()
        assert tick.reports["ov"].backend == "openvino"
        assert tick.reports["ort"].backend == "onnxruntime"
    finally:
        pipelines.close()
