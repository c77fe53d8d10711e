"""A pipeline under faults: full disks, sinks that raise or hang, heads that raise, sources
stuck in read(). Each ends cleanly, is counted, and stop() returns within 2 s."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

import pytest

from edge_agent.catalog.catalog import Catalog
from edge_agent.clips import WalkVideo, write_walk
from edge_agent.comms.local_broker import free_port
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Outputs, Result
from edge_agent.pipelines import vision
from edge_agent.pipelines.active import ActiveModel
from edge_agent.pipelines.base import Event, Frame, FrameResult
from edge_agent.pipelines.live_sources import LiveSource
from edge_agent.pipelines.runner import PipelineHandle, runtime_options
from edge_agent.pipelines.sinks import CallbackSink, JsonLinesSinkSpec
from edge_agent.pipelines.sources import FileSourceSpec, StreamSourceSpec, open_source
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.stopping import STOP_BUDGET_S
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.runtime.base import CompiledModel, Done, Failed, Tensor, Tensors
from edge_agent.runtime.openvino_backend import _failed
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats

# Generous: a hang shows as a timeout here instead of a stuck suite.
HANG_S = 60.0


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> WalkVideo:
    return write_walk(tmp_path_factory.mktemp("video") / "walk.avi")


@pytest.fixture
def pool(catalog: Catalog) -> Iterator[ModelPool]:
    pool = ModelPool(catalog)
    yield pool
    assert len(pool) == 0, "every model went back to the pool"


def spec_for(walk: WalkVideo, **update: object) -> PipelineSpec:
    spec = PipelineSpec(
        id="dock",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=walk.path),
        sinks=[],
    )
    return spec.model_copy(update=update)


class Runner:
    """Runs a handle on a thread and times how long `run` takes to return after `stop`."""

    def __init__(self, handle: PipelineHandle) -> None:
        self.handle = handle
        self.stats: PipelineStats | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.stats = self.handle.run()

    def stop_and_time(self) -> float:
        t0 = time.monotonic()
        self.handle.stop()
        self._thread.join(HANG_S)
        assert not self._thread.is_alive(), "run() did not return after stop()"
        return time.monotonic() - t0

    def join(self) -> PipelineStats:
        self._thread.join(HANG_S)
        assert not self._thread.is_alive(), "run() hung"
        assert self.stats is not None
        return self.stats


def wait_for(condition: threading.Event) -> None:
    assert condition.wait(HANG_S), "the pipeline never got there"


def test_a_full_disk_is_one_warning_and_a_clean_end(
    walk: WalkVideo, pool: ModelPool, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []
    spec = spec_for(walk, sinks=[JsonLinesSinkSpec(path=Path("/dev/full"))])
    handle = PipelineHandle(spec, pool, extra_sinks=[CallbackSink(lambda r: seen.append(r.frame))])
    with caplog.at_level(logging.WARNING):
        try:
            stats = handle.run()
        finally:
            handle.close()
    # The other sink got every frame; the failing one failed on each, and at close.
    assert seen == list(range(walk.frames))
    assert stats.frames == walk.frames
    assert stats.sink_failures == walk.frames + 1
    failed = [r for r in caplog.records if r.getMessage() == "sink_failed"]
    assert len(failed) == 1
    assert failed[0].exc_info is None
    assert "No space left" in str(getattr(failed[0], "fields", {})["error"])
    assert all(r.exc_info is None for r in caplog.records)


def test_a_full_disk_through_the_cli_ends_cleanly_and_fails(
    walk: WalkVideo, tmp_path: Path
) -> None:
    spec = tmp_path / "full.json"
    spec.write_text(
        spec_for(walk, sinks=[JsonLinesSinkSpec(path=Path("/dev/full"))]).model_dump_json()
    )
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run-pipeline", str(spec), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # The run ends on its own, says once what failed, prints its summary, and does not
    # exit 0: every result was lost.
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sum("sink_failed" in line for line in proc.stderr.splitlines()) == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("edge-agent: error: pipeline ")
    assert last.endswith("[sink.failed]")
    summary = json.loads(proc.stdout.splitlines()[-1])["summary"]
    assert summary["sink_failures"] == walk.frames + 1


def test_a_sink_raising_on_an_event_does_not_hang_the_pipeline(
    walk: WalkVideo, pool: ModelPool
) -> None:
    # Events sent between frames (a live source reconnecting, say) used to reach the
    # sinks unguarded: the emitter died and the reader waited for a free slot forever.
    frames: list[int] = []
    box: list[PipelineHandle] = []

    def collect(result: FrameResult) -> None:
        frames.append(result.frame)
        if result.frame == 10:
            assert isinstance(box[0].pipeline, VisionPipeline)
            box[0].pipeline.notify(Event(kind="source_reconnecting", ts=0.0, detail="test"))

    def on_events_only(result: FrameResult) -> None:
        if result.frame < 0:
            raise RuntimeError("this sink cannot take events")

    sinks = [CallbackSink(collect), CallbackSink(on_events_only)]
    box.append(PipelineHandle(spec_for(walk), pool, extra_sinks=sinks))
    runner = Runner(box[0])
    try:
        stats = runner.join()
    finally:
        box[0].close()
    assert [f for f in frames if f >= 0] == list(range(walk.frames))
    assert -1 in frames, "the other sink still got the event"
    assert stats.sink_failures >= 1


class StuckSource:
    """A real video for `frames` frames, then a read() that blocks until released."""

    def __init__(self, walk: WalkVideo, frames: int) -> None:
        self._inner = open_source(FileSourceSpec(path=walk.path))
        self._left = frames
        self.release = threading.Event()
        self.blocked = threading.Event()

    def read(self) -> Frame | None:
        if self._left == 0:
            self.blocked.set()
            self.release.wait()
            return None
        self._left -= 1
        return self._inner.read()

    @property
    def dropped(self) -> int:
        return self._inner.dropped

    def close(self) -> None:
        self._inner.close()


def test_stop_returns_in_time_while_the_source_is_stuck_in_read(
    walk: WalkVideo, pool: ModelPool
) -> None:
    source = StuckSource(walk, frames=20)
    handle = PipelineHandle(spec_for(walk), pool, frames=source)
    runner = Runner(handle)
    try:
        wait_for(source.blocked)
        assert runner.stop_and_time() < STOP_BUDGET_S
        stats = runner.join()
        assert stats.frames == 20
        assert stats.dropped_on_stop == 0
    finally:
        source.release.set()
        handle.close()


def test_a_pipeline_stopped_while_its_camera_is_down_stops_reconnecting(
    walk: WalkVideo, pool: ModelPool
) -> None:
    # run() returns within its budget and leaves the reader in the source's read(); the
    # source was left open and went on reconnecting to the camera for up to its give-up
    # time (here 10 minutes), beside the one a restart of the pipeline opens.
    port = free_port()  # nothing listens: every connect is refused
    source = StreamSourceSpec(
        url=f"http://127.0.0.1:{port}/video.mjpg",
        hw_decode=False,
        reconnect_min_s=0.1,
        reconnect_max_s=0.2,
        give_up_after_s=600,
    )
    handle = PipelineHandle(spec_for(walk, source=source), pool)
    source_threads = f"source:stream http://127.0.0.1:{port}/"

    def threads() -> list[str]:
        names = [t.name for t in threading.enumerate()]
        return [n for n in names if n.startswith(source_threads) or n == "read-dock"]

    runner = Runner(handle)
    try:
        deadline = time.monotonic() + HANG_S
        live = handle.pipeline.source
        assert isinstance(live, LiveSource)
        while live.status != "reconnecting" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threads(), "the source never ran"
        assert runner.stop_and_time() < STOP_BUDGET_S
        runner.join()
    finally:
        handle.close()
    deadline = time.monotonic() + 5.0
    while threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threads() == []


def test_stop_returns_in_time_while_a_sink_sleeps(walk: WalkVideo, pool: ModelPool) -> None:
    asleep = threading.Event()
    wake = threading.Event()

    def slow(result: FrameResult) -> None:
        if result.frame == 15:
            asleep.set()
            wake.wait(30.0)

    handle = PipelineHandle(spec_for(walk), pool, extra_sinks=[CallbackSink(slow)])
    runner = Runner(handle)
    try:
        wait_for(asleep)
        time.sleep(0.2)  # let the reader fill every slot behind the sleeping sink
        assert runner.stop_and_time() < STOP_BUDGET_S
        stats = runner.join()
    finally:
        wake.set()
        handle.close()
    # Frames 0-14 were out; the one in the sink and those queued behind it were dropped.
    assert stats.frames == 15
    assert stats.dropped_on_stop >= 2


class RaisingHead:
    """A head with a bug: every frame raises."""

    def decode(self, outputs: Outputs, frame_size: tuple[int, int]) -> list[Result]:
        raise ValueError("bug in decode")


def test_a_head_that_raises_counts_failures_and_stops_in_time(
    walk: WalkVideo, pool: ModelPool, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_for(walk)
    handle = PipelineHandle(spec, pool)
    # A second user of the same compiled model, decoded by the broken head.
    model, resolved = pool.acquire(spec.model.name, "openvino", runtime_options(spec.model, pool))
    active = ActiveModel.build(model, resolved.manifest, "broken")
    broken = ActiveModel(model, resolved.manifest, "broken", RaisingHead(), active.image)
    assert isinstance(handle.pipeline, VisionPipeline)
    handle.pipeline.request_swap(broken)
    with caplog.at_level(logging.WARNING):
        runner = Runner(handle)
        try:
            time.sleep(0.5)
            assert runner.stop_and_time() < STOP_BUDGET_S
            stats = runner.join()
        finally:
            handle.close()
            pool.release(model)
    assert stats.frames == 0
    assert stats.frame_failures > 0
    failed = [r for r in caplog.records if r.getMessage() == "frame_failed"]
    # Said once, not per frame: a head failing at 30 FPS for a week wrote 18 M lines.
    assert len(failed) == 1
    assert stats.frame_failures > 1
    assert all(r.exc_info is None for r in failed)


def test_stop_from_a_signal_handler_on_the_running_thread(walk: WalkVideo, pool: ModelPool) -> None:
    # The CLI and the service stop pipelines from SIGINT/SIGTERM handlers, which Python
    # runs on the main thread: the very thread blocked in run().
    source = StuckSource(walk, frames=30)
    handle = PipelineHandle(spec_for(walk), pool, frames=source)
    sent: list[float] = []

    def send() -> None:
        wait_for(source.blocked)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: handle.stop())
    killer = threading.Thread(target=send, daemon=True)
    killer.start()
    try:
        stats = handle.run()
        returned = time.monotonic()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        source.release.set()
        killer.join(HANG_S)
        handle.close()
    assert stats.frames == 30
    assert returned - sent[0] < STOP_BUDGET_S


def test_a_swapped_out_model_is_released_before_the_run_ends(
    walk: WalkVideo, pool: ModelPool
) -> None:
    pool_sizes: dict[int, int] = {}
    box: list[PipelineHandle] = []

    def watch(result: FrameResult) -> None:
        pool_sizes[result.frame] = len(pool)
        if result.frame == 20:
            box[0].swap_model(ModelRef(name="face-blazeface"))

    box.append(PipelineHandle(spec_for(walk), pool, extra_sinks=[CallbackSink(watch)]))
    try:
        box[0].run()
    finally:
        box[0].close()
    assert pool_sizes[0] == 1
    assert max(pool_sizes.values()) == 2, "both models held while frames of each were in flight"
    # The old model went back to the pool while the video was still playing.
    assert pool_sizes[walk.frames - 1] == 1


class GatedPool(ModelPool):
    """A real pool whose acquires after the first wait for `gate`: a slow compile."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__(catalog)
        self.gate = threading.Event()
        self._calls = 0

    def acquire(self, *args: object, **kwargs: object) -> Any:
        self._calls += 1
        if self._calls > 1:
            assert self.gate.wait(HANG_S), "the test never opened the gate"
        return super().acquire(*args, **kwargs)  # type: ignore[arg-type]


def test_a_swap_that_compiles_past_the_pipelines_end_gives_its_model_back(
    walk: WalkVideo, catalog: Catalog
) -> None:
    # A deploy swaps every pipeline of a model; a GPU compile takes 10-60 s. A pipeline
    # that ended meanwhile (stopped, its camera given up, its file played out) once took
    # the new model anyway, into a list nothing would release again: a compiled model
    # leaked for the life of the process with every such deploy.
    pool = GatedPool(catalog)
    handle = PipelineHandle(spec_for(walk, max_frames=5), pool)
    swap = handle.swap_model(ModelRef(name="face-blazeface"))
    try:
        handle.run()
    finally:
        handle.close()
    assert len(pool) == 0
    pool.gate.set()
    swap.join(HANG_S)
    assert not swap.is_alive()
    assert len(pool) == 0, "the swap's model was never given back"


def test_a_swap_replaced_before_it_ran_gives_its_model_back_at_once(
    walk: WalkVideo, pool: ModelPool
) -> None:
    # Two swaps landing before the reader takes the first (a camera reconnecting, a low
    # fps_cap): the first model never runs a frame, and was held until the pipeline stopped.
    handle = PipelineHandle(spec_for(walk, max_frames=5), pool)
    try:
        handle.swap_model(ModelRef(name="face-blazeface")).join(HANG_S)
        assert len(pool) == 2
        handle.swap_model(ModelRef(name="text-orientation")).join(HANG_S)
        assert len(pool) == 2, "the replaced swap's model is still held"
        stats = handle.run()
    finally:
        handle.close()
    assert stats.frames == 5


def test_a_swap_that_fails_with_a_bug_is_reported_not_lost(
    walk: WalkVideo, pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    def bug(*args: object) -> ActiveModel:
        raise ZeroDivisionError("division by zero")

    errors: list[EdgeAgentError] = []
    handle = PipelineHandle(spec_for(walk, max_frames=5), pool)
    # Fault injection: a bug in building the new model's head.
    monkeypatch.setattr(ActiveModel, "build", bug)
    try:
        handle.swap_model(ModelRef(name="face-blazeface"), on_error=errors.append).join(HANG_S)
        assert len(pool) == 1, "the new model went back to the pool"
        handle.run()
    finally:
        handle.close()
    assert len(errors) == 1
    assert errors[0].code == "internal"
    assert "ZeroDivisionError" in errors[0].problem


def test_a_sink_that_cannot_open_is_one_error_with_a_code(
    walk: WalkVideo, pool: ModelPool, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    spec = spec_for(
        walk,
        sinks=[
            JsonLinesSinkSpec(path=tmp_path / "ok.jsonl"),
            JsonLinesSinkSpec(path=blocked / "out.jsonl"),
        ],
    )
    with pytest.raises(EdgeAgentError, match="cannot be opened") as caught:
        PipelineHandle(spec, pool)
    assert caught.value.code == "sink.failed"


class WedgedModel:
    """A compiled model's face over a real one, whose submitted runs never come back:
    an engine stuck inside C++, as far as the pipeline can tell."""

    def __init__(self, real: CompiledModel) -> None:
        self.report = real.report
        self.submitted = 0

    def infer(self, inputs: Mapping[str, Tensor]) -> Tensors:
        raise AssertionError("the pipeline submits")

    def submit(
        self,
        inputs: Mapping[str, Tensor],
        done: Done,
        userdata: object,
        failed: Failed | None = None,
    ) -> None:
        self.submitted += 1  # and never calls `done`, nor `failed`

    def wait(self) -> None:
        raise AssertionError("nothing waits on a pipeline's model")

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_a_stuck_engine_ends_the_pipeline_with_an_error(
    walk: WalkVideo, pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the bound, the reader waits for a slot the engine never frees, the emitter
    # for a frame that never comes, and run() (and the CLI) for ever.
    monkeypatch.setattr(vision, "ENGINE_STALL_S", 1.0)
    spec = spec_for(walk)
    handle = PipelineHandle(spec, pool)
    model, resolved = pool.acquire(spec.model.name, "openvino", runtime_options(spec.model, pool))
    wedged = WedgedModel(model)
    active = ActiveModel.build(model, resolved.manifest, "wedged")
    assert isinstance(handle.pipeline, VisionPipeline)
    handle.pipeline.request_swap(
        ActiveModel(wedged, resolved.manifest, "wedged", active.head, active.image)
    )
    runner = Runner(handle)
    try:
        stats = runner.join()
    finally:
        handle.close()
        pool.release(model)
    error = handle.pipeline.error
    assert error is not None
    assert error.code == "inference.failed"
    assert "stuck" in error.problem
    assert wedged.submitted >= 1
    assert stats.frame_failures == wedged.submitted  # every frame it swallowed, counted


def _failing_runs(
    handle: PipelineHandle, monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], bool]
) -> list[int]:
    """Make the handle's real model raise, as a GPU lost mid-run does, on the runs (counted
    from 0) for which `fails` is true; the list it returns holds the runs that raised."""
    model = handle.model
    real = model._run  # type: ignore[attr-defined]
    lock, count, raised = threading.Lock(), [0], []

    def run(inputs: Mapping[str, Tensor]) -> Tensors:
        with lock:
            n = count[0]
            count[0] += 1
        if fails(n):
            raised.append(n)
            raise _failed(RuntimeError("[GPU] device lost"))
        result: Tensors = real(inputs)
        return result

    monkeypatch.setattr(model, "_run", run)
    return raised


def test_a_failed_run_is_one_failed_frame_said_at_once(
    walk: WalkVideo,
    pool: ModelPool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The worker kept the error for a `wait` no pipeline calls: the frame was owed until
    # STALL_S gave up on it (10 s of no output), and the engine's error was never said.
    monkeypatch.setattr(vision, "STALL_S", HANG_S * 2)
    handle = PipelineHandle(spec_for(walk, max_frames=40), pool)
    raised = _failing_runs(handle, monkeypatch, lambda n: n in (6, 7))
    try:
        stats = Runner(handle).join()
    finally:
        handle.close()
    assert raised == [6, 7]
    assert stats.frames == 38
    assert stats.frame_failures == 2
    assert handle.pipeline.error is None  # two failures in a row do not end it
    said = [vars(r)["fields"] for r in caplog.records if r.getMessage() == "frame_failed"]
    assert said
    assert "device lost" in str(said[0]["error"])


def test_an_engine_that_fails_every_run_ends_the_pipeline_with_its_error(
    walk: WalkVideo, pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every run failing (a device gone) filled the window, and 60 s later the pipeline
    # ended blaming a stuck engine, with the real error nowhere.
    monkeypatch.setattr(vision, "ENGINE_STALL_S", HANG_S * 2)
    handle = PipelineHandle(spec_for(walk), pool)
    raised = _failing_runs(handle, monkeypatch, lambda n: n >= 3)
    try:
        stats = Runner(handle).join()
    finally:
        handle.close()
    error = handle.pipeline.error
    assert error is not None
    assert error.code == "inference.failed"
    assert "device lost" in str(error)
    assert stats.frames == 3
    assert vision.ENGINE_FAILURES_END <= stats.frame_failures <= len(raised)
    assert len(raised) < 30  # it stopped submitting, not played the whole video


def test_a_camera_of_a_pipeline_that_never_ran_is_let_go_at_close(
    walk: WalkVideo, pool: ModelPool, camera: str
) -> None:
    # Only a run closed its source: a handle closed unrun (a stop while the agent started
    # it, a group whose next spec failed) left the camera's reader decoding for good.
    source = StreamSourceSpec(url=camera, hw_decode=False)
    handle = PipelineHandle(spec_for(walk, source=source), pool)
    live = handle.pipeline.source
    assert isinstance(live, LiveSource)
    deadline = time.monotonic() + HANG_S
    while live.status != "live" and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("source:")] == []


def test_frames_a_camera_replaced_before_the_run_are_not_its_drops(
    walk: WalkVideo, pool: ModelPool, camera: str
) -> None:
    # The camera counts replaced frames from its opening: those of the seconds before the
    # run (the other pipelines of a group built, a model compiled) read as the run's drops.
    source = StreamSourceSpec(url=camera, hw_decode=False)
    handle = PipelineHandle(spec_for(walk, source=source, max_frames=10), pool)
    live = handle.pipeline.source
    assert isinstance(live, LiveSource)
    deadline = time.monotonic() + HANG_S
    while live.status != "live" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)
    assert live.dropped >= 8  # 10 FPS, nothing reading
    try:
        stats = Runner(handle).join()
    finally:
        handle.close()
    assert stats.frames == 10
    assert stats.dropped <= 2
