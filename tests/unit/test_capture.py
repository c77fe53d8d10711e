"""The capture sink: a uniform reservoir of frames on disk, under a quota."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_agent.pipelines.base import FrameResult
from edge_agent.pipelines.capture import SAVE_EVERY, CaptureSink, CaptureSinkSpec
from tests.disk_kit import files_capped_at

HIGH_STEP = 12
"""Grey levels per unit of the high byte: frames up to 21 * 256 fit in a uint8."""


def frame(index: int, ts: float, size: int = 32) -> FrameResult:
    # The frame number is written into the pixels (high byte left, low byte right),
    # in flat blocks JPEG keeps exactly enough to read it back.
    image = np.zeros((size, size, 3), dtype=np.uint8)
    image[:, : size // 2] = index // 256 * HIGH_STEP
    image[:, size // 2 :] = index % 256
    return FrameResult("cam", index, ts, [], [], {}, "m", image)


def kept(folder: Path) -> list[int]:
    found = []
    for path in sorted(folder.glob("slot-*.jpg")):
        image = cv2.imread(str(path))
        assert image is not None
        half = image.shape[1] // 2
        high = round(float(np.median(image[:, : half - 2])) / HIGH_STEP)
        low = round(float(np.median(image[:, half + 2 :])))
        found.append(high * 256 + low)
    return found


def test_keeps_a_uniform_sample_of_the_whole_stream(tmp_path: Path) -> None:
    counts = np.zeros(10)
    for seed in range(10):
        folder = tmp_path / str(seed)
        sink = CaptureSink(CaptureSinkSpec(frames=50, min_interval_s=0.0, seed=seed), folder)
        for i in range(1000):
            sink.emit(frame(i, i / 30))
        assert sink.offered == 1000
        indices = kept(folder)
        assert len(indices) == 50
        assert len(set(indices)) == 50
        for index in indices:
            counts[index // 100] += 1
    # 500 kept frames over ten spans of 100: about 50 each if the sample is uniform (a
    # binomial's spread is 7); keeping the first frames, or the last, would put them all in
    # one span.
    assert counts.min() > 28
    assert counts.max() < 72


def test_min_interval_spreads_the_sample_over_time(tmp_path: Path) -> None:
    sink = CaptureSink(CaptureSinkSpec(frames=1000, min_interval_s=1.0, seed=1), tmp_path)
    for i in range(300):  # 10 s at 30 fps
        sink.emit(frame(i, i / 30))
    assert sink.offered == 10
    assert len(list(tmp_path.glob("slot-*.jpg"))) == 10


def test_quota_stops_writing(tmp_path: Path) -> None:
    spec = CaptureSinkSpec(frames=100, min_interval_s=0.0, max_mb=0.01, seed=1)
    sink = CaptureSink(spec, tmp_path)
    for i in range(100):
        sink.emit(frame(i, i, size=64))
    total = sum(p.stat().st_size for p in tmp_path.glob("slot-*.jpg"))
    assert total <= 0.01 * 1e6
    assert sink.over_quota > 0
    assert not list(tmp_path.glob("*.tmp"))


def test_a_quota_reached_while_filling_keeps_sampling_the_whole_stream(tmp_path: Path) -> None:
    # Reached before the slots were filled, every later frame was refused for the same
    # next slot: the sample stayed the stream's first frames for good.
    spec = CaptureSinkSpec(frames=100, min_interval_s=0.0, max_mb=0.01, seed=1)
    sink = CaptureSink(spec, tmp_path)
    for i in range(2000):
        sink.emit(frame(i, i, size=64))
    indices = kept(tmp_path)
    assert 3 < len(indices) < 100  # the quota holds only some of the slots
    assert sum(p.stat().st_size for p in tmp_path.glob("slot-*.jpg")) <= 0.01 * 1e6
    assert max(indices) > 1000  # frames from the whole stream, not its first ones
    assert sorted(p.name for p in tmp_path.glob("slot-*.jpg")) == [
        f"slot-{slot:05d}.jpg" for slot in range(len(indices))
    ]


def test_resumes_the_sample_it_had(tmp_path: Path) -> None:
    spec = CaptureSinkSpec(frames=5, min_interval_s=0.0, seed=1)
    first = CaptureSink(spec, tmp_path)
    for i in range(3):
        first.emit(frame(i, i))
    second = CaptureSink(spec, tmp_path)
    for i in range(3, 6):
        second.emit(frame(i, i))
    assert len(list(tmp_path.glob("slot-*.jpg"))) == 5


def test_a_restart_resumes_the_count_and_keeps_the_sample_uniform(tmp_path: Path) -> None:
    # 50 slots sampled from 5,000 frames, a restart, then 200 more: a uniform sample of
    # all 5,200 holds about 50 * 200 / 5,200 = 1.9 of the new frames. Restarting the
    # count at 0 made them replace about 44.
    replaced = []
    for seed in range(4):
        folder = tmp_path / str(seed)
        spec = CaptureSinkSpec(frames=50, min_interval_s=0.0, seed=seed)
        first = CaptureSink(spec, folder)
        for i in range(5000):
            first.emit(frame(i, i))
        first.close()
        second = CaptureSink(spec, folder)
        assert second.offered == 5000
        for i in range(5000, 5200):
            second.emit(frame(i, i))
        second.close()
        indices = kept(folder)
        assert len(set(indices)) == 50
        replaced.append(sum(index >= 5000 for index in indices))
        assert CaptureSink(spec, folder).offered == 5200
    assert max(replaced) <= 8, replaced
    assert sum(replaced) <= 20, replaced


def test_a_crash_loses_little_of_the_count(tmp_path: Path) -> None:
    spec = CaptureSinkSpec(frames=10, min_interval_s=0.0, seed=3)
    sink = CaptureSink(spec, tmp_path)
    for i in range(1234):
        sink.emit(frame(i, i))
    # No close(): the process died. The count on disk is at most SAVE_EVERY behind.
    resumed = CaptureSink(spec, tmp_path).offered
    assert 1234 - SAVE_EVERY <= resumed <= 1234


def test_a_write_the_disk_refuses_leaves_no_hole_in_the_slots(tmp_path: Path) -> None:
    # The slot was taken before its file was written: a refused write left a hole, and
    # after a restart (which counts the files) the next frame replaced the last slot's.
    spec = CaptureSinkSpec(frames=5, min_interval_s=0.0, seed=1)
    sink = CaptureSink(spec, tmp_path)
    sink.emit(frame(0, 0.0))
    with files_capped_at(100), pytest.raises(OSError, match="too large"):
        sink.emit(frame(1, 1.0))  # the disk is full: the guard around sinks logs it
    for i in (2, 3):
        sink.emit(frame(i, float(i)))
    sink.close()
    assert sorted(p.name for p in tmp_path.glob("slot-*.jpg")) == [
        f"slot-{slot:05d}.jpg" for slot in range(3)
    ]
    assert kept(tmp_path) == [0, 2, 3]
    again = CaptureSink(spec, tmp_path)
    again.emit(frame(4, 4.0))
    assert kept(tmp_path) == [0, 2, 3, 4]


def test_lowering_frames_deletes_the_slots_past_the_new_count(tmp_path: Path) -> None:
    # Going from 10 frames to 4 left slot-00004..00009 on disk for good: never replaced,
    # counted against the quota, and read by calibration beside the sample.
    first = CaptureSink(CaptureSinkSpec(frames=10, min_interval_s=0.0, seed=1), tmp_path)
    for i in range(10):
        first.emit(frame(i, i))
    first.close()
    second = CaptureSink(CaptureSinkSpec(frames=4, min_interval_s=0.0, seed=1), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("slot-*.jpg")) == [
        f"slot-{slot:05d}.jpg" for slot in range(4)
    ]
    for i in range(10, 40):
        second.emit(frame(i, i))
    assert len(list(tmp_path.glob("slot-*.jpg"))) == 4
