"""The VAD pipeline through the CLI, as a user runs it: real-time events, truncated files."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.outage import SourceOutage
from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.catalog.manifest import Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import SpeechSegment
from edge_agent.heads.vad import VadConfig
from edge_agent.infer import read_audio
from edge_agent.pipelines import audio as audio_module
from edge_agent.pipelines import audio_sources
from edge_agent.pipelines.audio import AudioPipeline
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSource, open_audio_source
from edge_agent.pipelines.base import AudioChunk, AudioSource, FrameResult, Sink
from edge_agent.pipelines.events import EventRule, EventTracker
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry
from tests.cli_kit import edge_agent_cli
from tests.conftest import CompileFn, espeak, write_wav
from tests.mic_kit import fake_arecord

RATE = 16000
# vad-silero's head, as its manifest sets it.
HEAD = VadConfig.model_validate(
    tomllib.loads((default_models_dir() / "vad-silero.toml").read_text())["head"]
)
WINDOW_S = HEAD.window / RATE
# How far an event may sit from the true edge: 100 ms plus the padding the head adds.
TOLERANCE_S = 0.1 + HEAD.speech_pad_s


def voiced(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The span of `samples` that carries voice, by 10 ms frame energy (espeak pads with quiet)."""
    hop = RATE // 100
    frames = samples[: len(samples) // hop * hop].reshape(-1, hop)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms > 0.05 * rms.max())
    return samples[loud[0] * hop : (loud[-1] + 1) * hop]


@dataclass(frozen=True)
class Clip:
    path: Path
    speech: list[tuple[float, float]]
    """True (start, end) of each utterance, seconds."""
    seconds: float


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Clip:
    """Silence, speech, silence, speech, silence; edges known to the sample."""
    tmp = tmp_path_factory.mktemp("speech")
    first = voiced(read_audio(espeak("turn on the lights in the dock", tmp / "a.wav"), RATE))
    second = voiced(read_audio(espeak("close the north gate now", tmp / "b.wav"), RATE))
    parts = [np.zeros(RATE, np.float32), first, np.zeros(3 * RATE // 2, np.float32), second]
    parts.append(np.zeros(RATE, np.float32))
    speech: list[tuple[float, float]] = []
    at = 0
    for k, part in enumerate(parts):
        if k % 2:
            speech.append((at / RATE, (at + len(part)) / RATE))
        at += len(part)
    path = tmp / "clip.wav"
    write_wav(path, np.concatenate(parts), RATE)
    return Clip(path, speech, at / RATE)


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    proc = edge_agent_cli(
        "run-pipeline", *args, "--json", timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc, [json.loads(line) for line in proc.stdout.splitlines()]


def test_speech_events_come_as_speech_starts_and_ends(clip: Clip, tmp_path: Path) -> None:
    spec = tmp_path / "vad.toml"
    spec.write_text(
        f"""
id = "vad"
sinks = []

[model]
name = "vad-silero"
hint = "latency"

[source]
type = "wav"
path = "{clip.path}"

[[events]]
name = "talk"
label = "speech"
gone_after_s = 0.0
"""
    )
    proc, lines = run_cli(str(spec))
    assert proc.returncode == 0, proc.stderr
    # (kind, when it happened, when the line carrying it was written) in stream seconds.
    seen = [(e["kind"], e["ts"], ln["ts"]) for ln in lines for e in ln.get("events", [])]
    assert [kind for kind, _, _ in seen] == ["appeared", "gone", "appeared", "gone"], seen
    for k, (start, end) in enumerate(clip.speech):
        (_, began, said_began), (_, ended, said_ended) = seen[2 * k], seen[2 * k + 1]
        assert abs(began - start) <= TOLERANCE_S, (began, start)
        assert abs(ended - end) <= TOLERANCE_S, (ended, end)
        # Real time: known within the hysteresis, not when the segment closes.
        assert said_began <= start + HEAD.min_speech_s + 0.1 + WINDOW_S, (said_began, start)
        assert said_began < end
        assert said_ended <= end + HEAD.min_silence_s + 0.1 + WINDOW_S, (said_ended, end)
    segments = [r for ln in lines for r in ln.get("results", []) if r["kind"] == "speech"]
    assert len(segments) == 2
    assert "summary" in lines[-1]


def test_truncated_wav_ends_with_source_error(clip: Clip, tmp_path: Path) -> None:
    data = clip.path.read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 2])  # the header still declares the whole clip
    proc, lines = run_cli("--model", "vad-silero", "--source", str(cut))
    assert proc.returncode != 0
    errors = [e for ln in lines for e in ln.get("events", []) if e["kind"] == "source_error"]
    assert len(errors) == 1
    assert "truncated" in errors[0]["detail"]
    assert "summary" in lines[-1]
    # Everything there was got processed before the error.
    windows = lines[-1]["summary"]["frames"]
    assert abs(windows * WINDOW_S - clip.seconds / 2) < 0.1
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("edge-agent: error:")]
    assert len(said) == 1, proc.stderr
    assert "truncated" in said[0]


def pipeline(
    compiled: CompileFn,
    source: AudioSource,
    fn: Callable[[FrameResult], None],
    gone: float = 0.0,
    pad: float = HEAD.speech_pad_s,
) -> AudioPipeline:
    model, resolved = compiled("vad-silero", hint="latency")
    head = HEAD.model_copy(update={"speech_pad_s": pad})
    manifest = resolved.manifest.model_copy(update={"head": head})
    rules = [EventRule(name="talk", label="speech", gone_after_s=gone)]
    sinks: list[Sink] = [CallbackSink(fn)]
    telemetry = PipelineTelemetry("vad")
    return AudioPipeline("vad", source, model, manifest, sinks, telemetry, EventTracker(rules))


def test_end_of_stream_lets_a_departure_finish(clip: Clip, compiled: CompileFn) -> None:
    pad = 0.05  # silence is then known only to `pad` before each window's end

    def events(gone: float) -> list[tuple[str, float, int]]:
        seen: list[FrameResult] = []
        source = WavSource(clip.path, RATE, HEAD.window)
        pipeline(compiled, source, seen.append, gone, pad).run()
        return [(e.kind, e.ts, r.frame) for r in seen for e in r.events]

    windows = math.ceil(clip.seconds * RATE / HEAD.window)
    end_ts = windows * WINDOW_S
    *_, (kind, ended, _) = events(gone=0.0)
    assert kind == "gone"
    # Absent for longer than the last window's mark shows, but not longer than the stream:
    # only the end-of-stream flush can see it.
    gone_after = end_ts - ended - pad / 2
    *_, (kind, ts, frame) = events(gone=gone_after)
    assert (kind, frame) == ("gone", -1)  # in the end-of-stream line, which has only events
    assert ts == pytest.approx(end_ts)


class StuckSource:
    """Three windows of quiet, then a read that never returns and a close that hangs."""

    dropped = 0

    def __init__(self) -> None:
        self.released = threading.Event()
        self._given = 0

    def read(self) -> AudioChunk | None:
        if self._given < 3:
            self._given += 1
            samples = np.zeros(HEAD.window, np.float32)
            return AudioChunk(self._given - 1, (self._given - 1) * WINDOW_S, samples, 0.0)
        self.released.wait(30)
        return None

    def close(self) -> None:
        self.released.wait(30)


def stop_after(audio: AudioPipeline, when: Callable[[], bool]) -> tuple[PipelineStats, float]:
    """Run `audio`, stop it once `when()` holds, return its stats and how long stop took."""
    box: list[PipelineStats] = []
    worker = threading.Thread(target=lambda: box.append(audio.run()), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while not when() and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    audio.stop()
    worker.join(5)
    took = time.monotonic() - start
    assert box, "run() did not return"
    return box[0], took


def test_stop_ends_run_whatever_the_source_and_sinks_do(compiled: CompileFn) -> None:
    source = StuckSource()
    calls: list[int] = []

    def broken_sink(result: FrameResult) -> None:
        calls.append(result.frame)
        raise OSError(28, "No space left on device")

    audio = pipeline(compiled, source, broken_sink)
    try:
        stats, took = stop_after(audio, lambda: len(calls) >= 3)
    finally:
        source.released.set()
    assert took < 2.0
    assert stats.frames == 3
    assert audio.failures == len(calls) >= 3


def test_stop_ends_run_while_the_microphone_sends_nothing(
    compiled: CompileFn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No microphone here: an arecord that starts and then sends nothing, as a wedged device.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "arecord"
    script.write_text(f"#!/bin/sh\necho $$ > {bin_dir}/pid\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = open_audio_source(MicSourceSpec(stall_timeout_s=30), RATE, HEAD.window)
    audio = pipeline(compiled, source, lambda _: None)
    stats, took = stop_after(audio, (bin_dir / "pid").exists)
    assert took < 2.0
    assert stats.frames == 0
    assert audio.error is None  # a stop is not a failure
    pid = int((bin_dir / "pid").read_text())
    deadline = time.monotonic() + 3
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "arecord outlived the pipeline"


def test_stop_ends_run_while_a_sink_sleeps(clip: Clip, compiled: CompileFn) -> None:
    # The window in the sink is left behind and counted; before, run() waited for the sink.
    asleep = threading.Event()
    wake = threading.Event()

    def slow(result: FrameResult) -> None:
        if result.frame == 5:
            asleep.set()
            wake.wait(30)

    audio = pipeline(compiled, WavSource(clip.path, RATE, HEAD.window), slow)
    try:
        stats, took = stop_after(audio, asleep.is_set)
    finally:
        wake.set()
    assert took < 2.0
    assert stats.frames == 5  # windows 0-4; the fifth is still in the sink
    assert stats.dropped_on_stop >= 1
    assert audio.error is None  # a stop is not a failure


class Counted:
    """A WAV source that counts the windows it returns, and can hold one read until close()
    (as a microphone's read returns what it had when arecord is stopped)."""

    def __init__(self, path: Path, hold_at: int | None = None) -> None:
        self._wav = WavSource(path, RATE, HEAD.window)
        self._hold_at = hold_at
        self.returned = 0
        self.holding = threading.Event()
        self._closed = threading.Event()

    @property
    def dropped(self) -> int:
        return self._wav.dropped

    def read(self) -> AudioChunk | None:
        chunk = self._wav.read()
        if self.returned == self._hold_at:
            self.holding.set()
            self._closed.wait(30)
        self.returned += chunk is not None
        return chunk

    def close(self) -> None:
        self._closed.set()
        self._wav.close()


class Overrun(Counted):
    """The clip with `lost_s` of audio lost before chunk `at`, as a microphone's overrun
    loses it: the chunks after it stand that much later in the stream."""

    def __init__(self, path: Path, at: int, lost_s: float) -> None:
        super().__init__(path)
        self._at, self._lost_s = at, lost_s

    def read(self) -> AudioChunk | None:
        chunk = super().read()
        if chunk is None or chunk.index < self._at:
            return chunk
        return AudioChunk(chunk.index, chunk.ts + self._lost_s, chunk.samples, chunk.read_s)


def test_speech_after_lost_audio_is_placed_where_it_is(clip: Clip, compiled: CompileFn) -> None:
    # The segments were placed by counting windows: after a mic's overrun, every one came
    # early by the audio lost, while the chunks themselves stood where they were.
    lost = 4.0
    results: list[FrameResult] = []
    source = Overrun(clip.path, at=5, lost_s=lost)  # in the silence before the first speech
    pipeline(compiled, source, results.append).run()
    segments = [r for res in results for r in res.results if isinstance(r, SpeechSegment)]
    assert len(segments) == len(clip.speech) == 2
    for found, (start, end) in zip(segments, clip.speech, strict=True):
        assert abs(found.start - (start + lost)) <= TOLERANCE_S, (found.start, start + lost)
        assert abs(found.end - (end + lost)) <= TOLERANCE_S, (found.end, end + lost)


def worker_of(audio: AudioPipeline) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == f"vad-{audio.name}")


def test_a_window_left_in_a_sleeping_sink_is_counted_once(clip: Clip, compiled: CompileFn) -> None:
    # Counted dropped when run() left it; the sink waking afterwards counted it done as well.
    asleep = threading.Event()
    wake = threading.Event()

    def slow(result: FrameResult) -> None:
        if result.frame == 5:
            asleep.set()
            wake.wait(30)

    source = Counted(clip.path)
    audio = pipeline(compiled, source, slow)
    try:
        stats, _ = stop_after(audio, asleep.is_set)
        worker = worker_of(audio)
    finally:
        wake.set()
    worker.join(5)
    assert not worker.is_alive()
    after = audio.telemetry.snapshot()
    assert (stats.frames, after.frames) == (5, 5)
    assert after.frames + after.dropped_on_stop == source.returned


def test_a_window_read_as_the_stop_closes_the_source_is_counted(
    clip: Clip, compiled: CompileFn
) -> None:
    # The reader's read returns once the stop has closed the source: that window was read,
    # then neither taken nor counted, and the counts came one short of what was read.
    source = Counted(clip.path, hold_at=8)
    audio = pipeline(compiled, source, lambda _: None)
    stats, took = stop_after(audio, source.holding.is_set)
    assert took < 2.0
    assert source.returned == 9
    assert stats.frames + stats.dropped_on_stop == source.returned


def on_the_clip(
    clip: Clip,
    engine: Any,
    manifest: Manifest,
    fn: Callable[[FrameResult], None],
    rules: list[EventRule] | None = None,
) -> AudioPipeline:
    """The clip through `engine` (the real VAD, or a face over it that fails), its results to
    `fn`, with the `talk` rule on speech unless `rules` says otherwise."""
    talk = [EventRule(name="talk", label="speech", gone_after_s=0.0)]
    return AudioPipeline(
        "vad",
        WavSource(clip.path, RATE, HEAD.window),
        engine,
        manifest,
        [CallbackSink(fn)],
        PipelineTelemetry("vad"),
        EventTracker(talk if rules is None else rules),
    )


class WedgedVad:
    """A compiled VAD's face over the real one, whose run after `wedge_after` never
    returns: an engine stuck inside C++, as far as the pipeline can tell."""

    def __init__(self, real: Any, wedge_after: int = 3) -> None:
        self.report = real.report
        self._real = real
        self._wedge_after = wedge_after
        self.runs = 0
        self.release = threading.Event()

    def infer(self, inputs: Any) -> Any:
        self.runs += 1
        if self.runs > self._wedge_after:
            self.release.wait(30)
        return self._real.infer(inputs)


def test_a_stuck_vad_engine_ends_the_pipeline_with_an_error(
    clip: Clip, compiled: CompileFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the bound, run() (and the CLI, and the agent's pipeline) waited for ever.
    monkeypatch.setattr(audio_module, "ENGINE_STALL_S", 1.0)
    model, resolved = compiled("vad-silero", hint="latency")
    wedged = WedgedVad(model)
    seen: list[FrameResult] = []
    audio = on_the_clip(clip, wedged, resolved.manifest, seen.append, rules=[])
    box: list[PipelineStats] = []
    runner = threading.Thread(target=lambda: box.append(audio.run()), daemon=True)
    start = time.monotonic()
    runner.start()
    runner.join(10)
    took = time.monotonic() - start
    wedged.release.set()
    assert box, "run() did not return"
    assert 1.0 < took < 5.0
    assert audio.error is not None
    assert audio.error.code == "inference.failed"
    assert "stuck" in audio.error.problem
    stats = box[0]
    assert stats.frames == 3
    assert stats.frame_failures == 1  # the window the engine kept
    kinds = [e.kind for r in seen for e in r.events]
    assert kinds[-1] == "pipeline_error"
    time.sleep(0.2)  # the released run returns into a pipeline that sends nothing more
    assert [e.kind for r in seen for e in r.events] == kinds


def test_a_vad_engine_stuck_mid_speech_closes_what_is_open_before_the_error(
    clip: Clip, compiled: CompileFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Left in the engine, the worker never closed the segment or the presence: the sinks
    # heard "appeared" and then the error, never "gone", and the speech so far was lost.
    monkeypatch.setattr(audio_module, "ENGINE_STALL_S", 1.0)
    model, resolved = compiled("vad-silero", hint="latency")
    start, end = clip.speech[0]
    done = int((start + end) / 2 / WINDOW_S)  # well inside the first utterance
    wedged = WedgedVad(model, wedge_after=done)
    seen: list[FrameResult] = []
    audio = on_the_clip(clip, wedged, resolved.manifest, seen.append)
    box: list[PipelineStats] = []
    runner = threading.Thread(target=lambda: box.append(audio.run()), daemon=True)
    runner.start()
    runner.join(10)
    wedged.release.set()
    assert box, "run() did not return"
    assert audio.error is not None
    assert "stuck" in audio.error.problem
    kinds = [e.kind for r in seen for e in r.events]
    assert kinds == ["appeared", "gone", "pipeline_error"], kinds
    segments = [s for r in seen for s in r.results if isinstance(s, SpeechSegment)]
    assert len(segments) == 1
    assert abs(segments[0].start - start) <= TOLERANCE_S
    assert segments[0].end == pytest.approx(done * WINDOW_S)
    time.sleep(0.2)  # the released run returns into a pipeline that sends nothing more
    assert [e.kind for r in seen for e in r.events] == kinds


class FailingVad:
    """The real compiled VAD, whose run `fail_at` raises as an engine does when its device
    goes away mid-stream."""

    def __init__(self, real: Any, fail_at: int) -> None:
        self.report = real.report
        self._real = real
        self._fail_at = fail_at
        self.runs = 0

    def infer(self, inputs: Any) -> Any:
        self.runs += 1
        if self.runs == self._fail_at:
            raise EdgeAgentError(
                "the GPU engine failed: device lost", "restart the box", code="inference.failed"
            )
        return self._real.infer(inputs)


def test_an_engine_error_mid_speech_fails_the_pipeline_and_closes_what_is_open(
    clip: Clip, compiled: CompileFn
) -> None:
    # Raised out of run() as a bug, it was an "internal" crash the agent never retried,
    # and the open segment and the "appeared" it never paired with "gone" were lost.
    model, resolved = compiled("vad-silero", hint="latency")
    start, end = clip.speech[0]
    fail_at = int((start + end) / 2 / WINDOW_S)  # well inside the first utterance
    seen: list[FrameResult] = []
    audio = on_the_clip(clip, FailingVad(model, fail_at), resolved.manifest, seen.append)
    stats = audio.run()
    assert audio.error is not None
    assert audio.error.code == "inference.failed"
    assert stats.frames == fail_at - 1
    assert stats.frame_failures == 1
    kinds = [e.kind for r in seen for e in r.events]
    assert kinds == ["appeared", "gone", "pipeline_error"], kinds
    segments = [s for r in seen for s in r.results if isinstance(s, SpeechSegment)]
    assert len(segments) == 1
    assert abs(segments[0].start - start) <= TOLERANCE_S
    assert segments[0].end == pytest.approx((fail_at - 1) * WINDOW_S)


def test_a_mic_that_comes_back_ends_its_outage_in_the_journal(
    clip: Clip,
    catalog: Catalog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Only video sources told the agent's outage record they were live again: a USB mic
    # unplugged and back was retried and ran, but its loss never ended in the journal.
    raw = tmp_path / "speech.raw"
    audio = read_audio(clip.path, RATE)
    raw.write_bytes((audio[: RATE // 2] * 32767).astype("<i2").tobytes())
    # Half a second of audio, then it ends.
    fake_arecord(tmp_path / "bin", raw, monkeypatch=monkeypatch)
    outage = SourceOutage("ears")
    outage.lost("source.failed")  # the last run's mic went away; this run is the retry
    spec = PipelineSpec(
        id="ears", model=ModelRef(name="vad-silero"), source=MicSourceSpec(), sinks=[]
    )
    pool = ModelPool(catalog)
    handle = PipelineHandle(spec, pool, on_live=outage.live)
    try:
        with caplog.at_level(logging.WARNING, logger="edge_agent.agent"):
            stats = handle.run()
    finally:
        handle.close()
    assert stats.frames == RATE // 2 // HEAD.window
    recovered = [r for r in caplog.records if getattr(r, "event", None) == "source_recovered"]
    assert len(recovered) == 1
    assert recovered[0].fields["pipeline"] == "ears"  # type: ignore[attr-defined]
    assert recovered[0].fields["code"] == "source.failed"  # type: ignore[attr-defined]
    assert outage.live() is None  # the outage is closed: the next return says nothing


def test_mic_overruns_are_counted_as_dropped_windows_and_said(
    compiled: CompileFn,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The mic keeps 10 s; a sink that holds the first window while 20 s arrive loses about
    # 10 s of it. That loss was in no counter: `dropped` stayed 0 in the summary and the
    # heartbeat.
    raw = tmp_path / "quiet.raw"
    sent = 20 * RATE // HEAD.window  # whole windows
    raw.write_bytes(bytes(2 * sent * HEAD.window))
    bin_dir = tmp_path / "bin"
    fake_arecord(bin_dir, raw, f"touch {bin_dir}/sent\nexec sleep 60", monkeypatch=monkeypatch)

    def hold_the_first(result: FrameResult) -> None:
        deadline = time.monotonic() + 10
        while result.frame == 0 and not (bin_dir / "sent").exists():
            assert time.monotonic() < deadline, "the fake arecord never sent its audio"
            time.sleep(0.01)
        time.sleep(0.1 if result.frame == 0 else 0)  # its last write reaches the ring

    # Each overrunning write said, as the minute's throttle would over a longer outage:
    # said once for the source's life, the overruns after the first went unsaid.
    monkeypatch.setattr(audio_sources, "_OVERRUN_LOG_EVERY_S", 0.0)
    source = open_audio_source(MicSourceSpec(stall_timeout_s=0.5), RATE, HEAD.window)
    audio = pipeline(compiled, source, hold_the_first)
    with caplog.at_level(logging.WARNING, logger="edge_agent.pipelines"):
        stats = audio.run()  # ends when the mic stalls, after what there was
    assert audio.error is not None
    assert "no audio" in audio.error.problem
    assert stats.dropped > sent // 3
    assert stats.frames + stats.dropped + stats.dropped_on_stop == sent
    overruns = [r for r in caplog.records if getattr(r, "event", None) == "mic_overrun"]
    assert len(overruns) > 1
    lost_s = sum(float(getattr(r, "fields", {})["lost_s"]) for r in overruns)
    assert lost_s == pytest.approx(stats.dropped * WINDOW_S, abs=WINDOW_S + 0.01 * len(overruns))
