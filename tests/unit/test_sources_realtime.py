"""Realtime file playback and reduced JPEG decode, on real files (small and fast)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from edge_agent.pipelines.decode import (
    JpegDecoder,
    jpeg_size,
    min_size_for_fit,
    min_size_for_tiles,
    reduction_for,
)
from edge_agent.pipelines.sources import (
    FileSource,
    FileSourceSpec,
    RealtimeFileSource,
    open_source,
)

Image = npt.NDArray[np.uint8]


def pattern(width: int, height: int, seed: int = 0) -> Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (max(1, height // 16), max(1, width // 16), 3), dtype=np.uint8)
    return np.asarray(cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR))


def jpeg(image: Image, *params: int) -> npt.NDArray[np.uint8]:
    ok, data = cv2.imencode(".jpg", image, list(params))
    assert ok
    return np.asarray(data, dtype=np.uint8).reshape(-1)


def write_video(path: Path, frames: int, fps: float, size: tuple[int, int] = (64, 48)) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, size)
    for i in range(frames):
        writer.write(pattern(*size, seed=i))
    writer.release()
    return path


# --- choosing and doing the reduction -------------------------------------------------------


@given(
    width=st.integers(1, 5000),
    height=st.integers(1, 5000),
    need_w=st.integers(1, 1000),
    need_h=st.integers(1, 1000),
)
def test_reduction_is_the_largest_that_still_covers_the_need(
    width: int, height: int, need_w: int, need_h: int
) -> None:
    k = reduction_for((width, height), (need_w, need_h))
    assert k in (1, 2, 4, 8)
    if k > 1:
        assert math.ceil(width / k) >= need_w
        assert math.ceil(height / k) >= need_h
    if k < 8:
        bigger = 2 * k
        assert math.ceil(width / bigger) < need_w or math.ceil(height / bigger) < need_h


@pytest.mark.parametrize(
    ("size", "params"),
    [
        ((640, 480), []),
        ((1921, 1079), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
        ((333, 2000), [cv2.IMWRITE_JPEG_QUALITY, 40]),
    ],
)
def test_jpeg_size_reads_the_frame_header(size: tuple[int, int], params: list[int]) -> None:
    assert jpeg_size(jpeg(pattern(*size), *params)) == size


def test_jpeg_size_of_what_is_not_a_jpeg_is_none() -> None:
    ok, png = cv2.imencode(".png", pattern(32, 32))
    assert ok
    assert jpeg_size(np.asarray(png, dtype=np.uint8)) is None
    assert jpeg_size(np.frombuffer(b"\xff\xd8\xff\xe0\x00", dtype=np.uint8)) is None
    assert jpeg_size(np.zeros(100, dtype=np.uint8)) is None


@pytest.mark.parametrize(("need", "scale"), [((300, 300), 4), ((600, 300), 2), ((2000, 10), 1)])
def test_decoder_reduces_as_far_as_the_need_allows(need: tuple[int, int], scale: int) -> None:
    data = jpeg(pattern(1920, 1280))
    decoder = JpegDecoder(lambda full: need)
    image = decoder.decode(data)
    assert image is not None
    assert decoder.scale == scale
    assert image.shape == (math.ceil(1280 / scale), math.ceil(1920 / scale), 3)


@pytest.mark.parametrize("need", [None, (300, 300)])
def test_a_header_claiming_too_many_pixels_is_a_corrupt_packet_not_a_crash(
    need: tuple[int, int] | None,
) -> None:
    # One bad packet of a live camera: whole, OpenCV raised out of read() and the pipeline
    # ended as a crash; reduced, 60000 x 60000 / 8 fit, and a 168 MB frame went on.
    data = jpeg(pattern(640, 480)).copy()
    sof = next(i for i in range(len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xC0)
    data[sof + 5 : sof + 9] = [0xEA, 0x60, 0xEA, 0x60]  # height, width: 60000 each
    assert jpeg_size(data) == (60000, 60000)
    decoder = JpegDecoder(None if need is None else (lambda full: need))
    assert decoder.decode(data) is None
    assert decoder.decode(jpeg(pattern(640, 480))) is not None  # and the next one decodes


def test_decoder_without_a_need_decodes_whole() -> None:
    decoder = JpegDecoder(None)
    image = decoder.decode(jpeg(pattern(1920, 1280)))
    assert image is not None
    assert image.shape == (1280, 1920, 3)
    assert decoder.scale == 1


def test_min_sizes_follow_the_fit_and_the_tiles() -> None:
    frame = (1280, 720)
    assert min_size_for_fit((300, 300), "stretch")(frame) == (300, 300)
    assert min_size_for_fit((300, 300), "letterbox")(frame) == (300, 169)
    assert min_size_for_fit((300, 300), "crop")(frame) == (534, 300)
    # 360 px tiles fed at 300 px: the frame may shrink to 300/360 of itself, not to half.
    assert min_size_for_tiles(300, 360)(frame) == (1067, 600)
    assert reduction_for(frame, min_size_for_tiles(300, 360)(frame)) == 1
    assert reduction_for(frame, min_size_for_fit((300, 300), "letterbox")(frame)) == 4


def test_file_source_decodes_mjpeg_packets_reduced(tmp_path: Path) -> None:
    video = write_video(tmp_path / "big.avi", frames=5, fps=30, size=(1280, 960))
    whole = FileSource(video)
    reduced = FileSource(video, min_size=min_size_for_fit((300, 300)))
    try:
        full_frames = [whole.read() for _ in range(5)]
        small_frames = [reduced.read() for _ in range(5)]
        assert whole.read() is None
        assert reduced.read() is None
    finally:
        whole.close()
        reduced.close()
    assert reduced.decoding.scale == 2
    assert whole.decoding.scale == 1
    for full, small in zip(full_frames, small_frames, strict=True):
        assert full is not None
        assert small is not None
        assert small.image.shape == (480, 640, 3)
        assert small.scale == 2
        assert full.image.shape == (960, 1280, 3)
        assert full.scale == 1
        # The same picture: the reduced decode is the full one, halved.
        halved = cv2.resize(full.image, (640, 480), interpolation=cv2.INTER_AREA)
        assert np.abs(halved.astype(int) - small.image.astype(int)).mean() < 6


# --- realtime playback ----------------------------------------------------------------------


def test_realtime_plays_at_the_files_rate_and_counts_what_a_slow_reader_misses(
    tmp_path: Path,
) -> None:
    video = write_video(tmp_path / "clip.avi", frames=20, fps=50)
    started = time.monotonic()
    source = RealtimeFileSource(video)
    taken = []
    try:
        while (frame := source.read()) is not None:
            taken.append(frame)
            time.sleep(0.07)  # slower than the file's 20 ms per frame
    finally:
        source.close()
    elapsed = time.monotonic() - started
    assert elapsed >= 0.38, "played faster than the file's own rate"
    assert source.played == 20
    assert len(taken) + source.dropped == 20
    assert source.dropped >= 5
    indices = [f.index for f in taken]
    assert indices == sorted(set(indices))
    assert [f.ts for f in taken] == pytest.approx([i / 50 for i in indices])


def test_a_phase_delays_every_frame_s_due_time_and_a_bad_one_is_refused(
    tmp_path: Path,
) -> None:
    video = write_video(tmp_path / "clip.avi", frames=4, fps=20)
    source = RealtimeFileSource(video, phase=0.3)
    try:
        started = time.monotonic()
        first = source.read()
        waited = time.monotonic() - started
        rest = [source.read() for _ in range(3)]
        elapsed = time.monotonic() - started
    finally:
        source.close()
    assert first is not None
    assert first.index == 0
    assert waited >= 0.29, "the first frame came due before its phase"
    assert [f.index for f in rest if f is not None] == [1, 2, 3]
    assert elapsed >= 0.29 + 3 / 20, "the later frames keep the file's rate after the phase"
    assert source.dropped == 0
    for bad in (-0.01, math.nan, math.inf):
        with pytest.raises(ValueError, match="phase"):
            RealtimeFileSource(video, phase=bad)


def test_realtime_drops_nothing_for_a_reader_that_keeps_up(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", frames=6, fps=10)
    source = RealtimeFileSource(video)
    try:
        taken = []
        while (frame := source.read()) is not None:
            taken.append(frame.index)
    finally:
        source.close()
    assert taken == list(range(6))
    assert source.dropped == 0


def test_realtime_loops_and_keeps_counting(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", frames=5, fps=50)
    source = open_source(FileSourceSpec(path=video, realtime=True, loop=True))
    assert isinstance(source, RealtimeFileSource)
    try:
        frames = [source.read() for _ in range(12)]
    finally:
        source.close()
    indices = [f.index for f in frames if f is not None]
    assert len(indices) == 12
    assert indices == sorted(set(indices))
    assert indices[-1] >= 11
    assert source.loops >= 2
    assert source.read() is None  # closed


def test_realtime_fps_cap_skips_frames_without_calling_them_dropped(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", frames=12, fps=20)
    source = open_source(FileSourceSpec(path=video, realtime=True, fps_cap=5))
    assert isinstance(source, RealtimeFileSource)
    try:
        indices = []
        while (frame := source.read()) is not None:
            indices.append(frame.index)
    finally:
        source.close()
    # Which frames are capped is decided on the file's clock: the same on every run. One
    # the player itself was late for (a starved CI machine) is dropped, never capped.
    assert source.capped == 9
    assert set(indices) <= {0, 4, 8}
    assert len(indices) + source.dropped == 3


def test_realtime_decodes_reduced_packets_on_the_readers_side(tmp_path: Path) -> None:
    video = write_video(tmp_path / "big.avi", frames=4, fps=50, size=(1280, 960))
    source = RealtimeFileSource(video, min_size=min_size_for_fit((300, 300)))
    try:
        frames = []
        while (frame := source.read()) is not None:
            frames.append(frame)
    finally:
        source.close()
    assert frames
    assert all(f.image.shape == (480, 640, 3) and f.scale == 2 for f in frames)
    assert source.decoding.scale == 2


def test_realtime_never_decodes_the_frames_it_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No reduction applies (no MinSize): the packets are decoded whole, and only when taken.
    video = write_video(tmp_path / "clip.avi", frames=20, fps=50, size=(320, 240))
    decoded: list[int] = []
    real = cv2.imdecode

    def counted(data: npt.NDArray[np.uint8], flags: int) -> object:
        decoded.append(flags)
        return real(data, flags)

    monkeypatch.setattr(cv2, "imdecode", counted)
    source = RealtimeFileSource(video)
    taken = []
    try:
        while (frame := source.read()) is not None:
            taken.append(frame)
            time.sleep(0.07)  # slower than the file's 20 ms per frame
    finally:
        source.close()
    assert source.dropped >= 5
    assert len(taken) + source.dropped == 20
    assert len(decoded) == len(taken), "a dropped frame was decoded, or a taken one was not"
    assert all(f.image.shape == (240, 320, 3) and f.scale == 1 for f in taken)
    assert source.decoding.hw == "cpu"


def test_a_whole_mjpeg_packet_decodes_at_least_as_true_as_ffmpeg(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", frames=4, fps=30, size=(640, 480))
    capture = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    try:
        by_ffmpeg = [capture.read()[1] for _ in range(4)]
    finally:
        capture.release()
    source = FileSource(video, hw_decode=False)
    try:
        frames = [source.read() for _ in range(4)]
    finally:
        source.close()
    for i, (frame, theirs) in enumerate(zip(frames, by_ffmpeg, strict=True)):
        assert frame is not None
        assert theirs is not None
        assert frame.image.shape == theirs.shape == (480, 640, 3)
        # Against the picture that was encoded: libjpeg-turbo's decode of the packet is
        # no further from it than FFmpeg's decode of the same frame (1.6-1.9 against
        # 3.0-3.3 grey levels on average here).
        painted = pattern(640, 480, seed=i).astype(int)
        ours = np.abs(frame.image.astype(int) - painted).mean()
        ffmpeg = np.abs(theirs.astype(int) - painted).mean()
        assert ours <= ffmpeg + 0.1
        assert ours < 2.5


def test_a_taken_frame_says_how_long_it_waited(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", frames=3, fps=5)
    source = RealtimeFileSource(video)
    try:
        first = source.read()
        time.sleep(0.1)
        second = source.read()  # due 200 ms after the first; taken when it comes
        time.sleep(0.25)
        third = source.read()  # came due while this reader slept
    finally:
        source.close()
    assert first is not None
    assert second is not None
    assert third is not None
    assert third.index == 2
    # Due 400 ms in, taken no sooner than 450 ms in: its age counts from its due time.
    assert third.read_s >= 0.045


def test_loop_and_fps_cap_need_realtime(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="realtime"):
        FileSourceSpec(path=tmp_path / "a.avi", loop=True)
    with pytest.raises(ValidationError, match="realtime"):
        FileSourceSpec(path=tmp_path / "a.avi", fps_cap=5)
