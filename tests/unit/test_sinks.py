"""Sinks: JSON lines, the guard around failing sinks, and snapshots under a rate limit
and a quota."""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import re
import time
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from pydantic import TypeAdapter, ValidationError

from edge_agent.heads.base import Classification, Detection, Result, TextBox
from edge_agent.pipelines.base import Event, FrameResult
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.guard import GuardedSink
from edge_agent.pipelines.sinks import (
    CallbackSink,
    JsonLinesSink,
    JsonLinesSinkSpec,
    SinkSpec,
    SnapshotSink,
    SnapshotSinkSpec,
    annotate,
    build_sink,
)

GREY = 128
BOX = (20.0, 30.0, 120.0, 90.0)


def grey_image() -> npt.NDArray[np.uint8]:
    return np.full((160, 200, 3), GREY, dtype=np.uint8)


def frame_result(
    frame: int, ts: float, events: list[Event] | None = None, *, image: bool = True
) -> FrameResult:
    results: list[Result] = [Detection(label="person", class_id=0, score=0.87, box=BOX)]
    return FrameResult(
        pipeline="door cam",
        frame=frame,
        ts=ts,
        results=results,
        events=events or [],
        timings={"infer": 0.01},
        model="yolo",
        image=grey_image() if image else None,
    )


def appeared(ts: float) -> Event:
    return Event(kind="appeared", rule="people", label="person", ts=ts)


def test_json_lines_round_trip_to_a_stream() -> None:
    stream = io.StringIO()
    sink = JsonLinesSink(stream=stream)
    first, second = frame_result(0, 0.0), frame_result(1, 0.1, [appeared(0.1)])
    sink.emit(first)
    sink.emit(second)
    sink.close()
    sink.close()
    lines = stream.getvalue().splitlines()
    assert [json.loads(line) for line in lines] == [first.to_json(), second.to_json()]
    assert not stream.closed  # not ours to close


def test_json_lines_appends_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    sink = JsonLinesSink(path=path)
    sink.emit(frame_result(3, 0.3, [appeared(0.3)]))
    # Line-buffered: the line is on disk before close.
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    sink.close()
    sink.close()
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"earlier": True}
    assert rows[1]["frame"] == 3
    assert rows[1]["events"][0]["kind"] == "appeared"
    assert rows[1]["results"][0]["box"] == list(BOX)


def test_json_lines_defaults_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    sink = JsonLinesSink()
    sink.emit(frame_result(7, 0.7))
    sink.close()
    assert json.loads(capsys.readouterr().out)["frame"] == 7


def test_json_lines_rejects_stream_and_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        JsonLinesSink(stream=io.StringIO(), path=tmp_path / "x.jsonl")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_guard_counts_failures_and_logs_one_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []
    failures: list[None] = []

    def flaky(result: FrameResult) -> None:
        if result.frame % 2:
            raise RuntimeError("boom")
        seen.append(result.frame)

    clock = FakeClock()
    sink = GuardedSink(
        CallbackSink(flaky), "callback#0", "door", lambda: failures.append(None), clock
    )
    with caplog.at_level(logging.WARNING):
        for frame in range(6):
            sink.emit(frame_result(frame, frame / 10))
            clock.now += 1.0
        clock.now += GuardedSink.LOG_EVERY_S
        sink.emit(frame_result(7, 0.7))
    sink.close()
    assert seen == [0, 2, 4]
    assert sink.failures == len(failures) == 4
    # One line for the first failure, one more after a minute; no traceback.
    assert len(caplog.records) == 2
    assert all(r.exc_info is None for r in caplog.records)
    assert [getattr(r, "fields", {}).get("failures") for r in caplog.records] == [1, 4]
    assert getattr(caplog.records[0], "fields", {})["error"] == "RuntimeError: boom"


def test_guard_swallows_close_errors_and_ignores_emits_after_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = JsonLinesSink(path=Path("/dev/full"))
    sink = GuardedSink(inner, "jsonl:/dev/full", "door")
    with caplog.at_level(logging.WARNING):
        sink.emit(frame_result(0, 0.0))
        sink.close()
        sink.close()
        sink.emit(frame_result(1, 0.1))
    # The write fails, then the close's flush of the same line: both counted, one line
    # logged, and the file is released all the same.
    assert sink.failures == 2
    assert len(caplog.records) == 1
    assert inner._stream.closed


def test_json_lines_close_releases_the_file_when_the_flush_fails() -> None:
    sink = JsonLinesSink(path=Path("/dev/full"))
    stream = sink._stream
    with pytest.raises(OSError, match="No space"):
        sink.emit(frame_result(0, 0.0))
    with pytest.raises(OSError, match="No space"):
        sink.close()
    assert stream.closed


def test_annotate_draws_boxes_and_text_regions_on_a_copy() -> None:
    image = grey_image()
    results: list[Result] = [
        Detection(label="person", class_id=0, score=0.87, box=BOX, keypoints=((60.0, 60.0),)),
        TextBox(score=0.9, polygon=((140, 100), (190, 100), (190, 150), (140, 150))),
        Classification(label="street", class_id=3, score=0.7),
    ]
    out = annotate(image, results)
    assert np.all(image == GREY)  # the input is untouched
    assert out.shape == image.shape
    assert out.dtype == np.uint8
    # Box edges (right and bottom, away from the label tag) and the text polygon changed.
    assert tuple(out[60, 120]) != (GREY, GREY, GREY)
    assert tuple(out[90, 70]) != (GREY, GREY, GREY)
    assert tuple(out[125, 190]) != (GREY, GREY, GREY)
    assert tuple(out[60, 60]) != (GREY, GREY, GREY)  # keypoint
    # The inside of the box stays as it was.
    assert tuple(out[75, 100]) == (GREY, GREY, GREY)


def _jpegs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.jpg"))


_STAMP = re.compile(r"-\d{8}-\d{6}\.\d{3}-")


def _names(folder: Path) -> list[str]:
    """The JPEGs in `folder` by name, the wall-clock part of snapshot names left out."""
    return [_STAMP.sub("-", p.name) for p in _jpegs(folder)]


def test_a_snapshot_taken_after_the_clock_stepped_back_is_kept(tmp_path: Path) -> None:
    # Snapshots from before a clock step back (a box that ran on a wrong clock, then
    # synced; or the reverse) carry later mtimes than anything written now. Each new one
    # sorted oldest and was deleted right after it was written, for as long as that lasted.
    future = time.time_ns() + 10 * 365 * 86400 * 10**9
    old = ("door_cam-00000001-appeared-person.jpg", "door_cam-00000002-appeared-person.jpg")
    for i, name in enumerate(old):
        path = tmp_path / name
        path.write_bytes(b"jpeg")
        os.utime(path, ns=(future + i, future + i))
    sink = SnapshotSink(tmp_path, min_interval_s=0.0, max_files=2)
    for frame in (7, 8):
        sink.emit(frame_result(frame, frame / 10, [appeared(frame / 10)]))
    assert _names(tmp_path) == [f"door_cam-{frame:08d}-appeared-person.jpg" for frame in (7, 8)]
    # And the order on disk is the order of writing.
    mtimes = [p.stat().st_mtime_ns for p in _jpegs(tmp_path)]
    assert mtimes[0] < mtimes[1]


def test_snapshot_is_rate_limited_by_stream_time(tmp_path: Path) -> None:
    sink = SnapshotSink(tmp_path, min_interval_s=10.0)
    # An event every 2 s for 40 s: snapshots at 0, 10, 20, 30.
    for frame in range(0, 400, 20):
        sink.emit(frame_result(frame, frame / 10, [appeared(frame / 10)]))
    sink.close()
    assert _names(tmp_path) == [
        f"door_cam-{frame:08d}-appeared-person.jpg" for frame in (0, 100, 200, 300)
    ]
    assert sink.written == 4


def test_snapshots_are_valid_jpegs_with_boxes_drawn(tmp_path: Path) -> None:
    sink = SnapshotSink(tmp_path)
    sink.emit(frame_result(5, 0.5, [appeared(0.5)]))
    (path,) = _jpegs(tmp_path)
    image = cv2.imread(str(path))
    assert image is not None
    assert image.shape == (160, 200, 3)
    # JPEG is lossy: compare against grey with a tolerance, on the box's right edge.
    assert np.abs(image[60, 120].astype(int) - GREY).max() > 40
    assert np.abs(image[75, 100].astype(int) - GREY).max() < 10
    assert not list(tmp_path.glob("*.tmp"))


def test_snapshot_of_a_reduced_frame_draws_camera_pixel_boxes_where_they_are(
    tmp_path: Path,
) -> None:
    # The frame was decoded at 1/2: its results are in the camera's pixels, twice BOX.
    result = frame_result(5, 0.5, [appeared(0.5)])
    result.results = [Detection(label="person", class_id=0, score=0.87, box=(40, 60, 240, 180))]
    result.scale = 2
    SnapshotSink(tmp_path).emit(result)
    (path,) = _jpegs(tmp_path)
    image = cv2.imread(str(path))
    assert image is not None
    assert image.shape == (160, 200, 3)
    assert np.abs(image[75, 120].astype(int) - GREY).max() > 40  # BOX's right edge
    assert np.abs(image[75, 100].astype(int) - GREY).max() < 10  # inside BOX
    # Where the camera-pixel box would be if drawn unscaled: its top edge, right of BOX.
    assert np.abs(image[60, 150].astype(int) - GREY).max() < 10


def test_snapshot_quota_deletes_the_oldest(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a snapshot", encoding="utf-8")
    # Someone's photos in the same folder, older than any snapshot: never the sink's to
    # count or delete (the quota once took every JPEG, oldest first).
    # A phone's dated name too, which looked like a snapshot's `-8 digits-` name.
    for name in ("holiday.jpg", "IMG_0001.jpg", "IMG-20240101-WA0001.jpg"):
        (tmp_path / name).write_bytes(b"\xff\xd8 a photo")
        os.utime(tmp_path / name, (1e9, 1e9))
    sink = SnapshotSink(tmp_path, min_interval_s=0.0, max_files=3)
    for frame in range(6):
        sink.emit(frame_result(frame, frame / 10, [appeared(frame / 10)]))
    assert _names(tmp_path) == [
        "IMG-20240101-WA0001.jpg",
        "IMG_0001.jpg",
        *(f"door_cam-{frame:08d}-appeared-person.jpg" for frame in (3, 4, 5)),
        "holiday.jpg",
    ]
    assert sink.written == 6
    assert (tmp_path / "notes.txt").exists()


def test_snapshot_ignores_other_events_and_frames_without_images(tmp_path: Path) -> None:
    sink = SnapshotSink(tmp_path, min_interval_s=0.0)
    gone = Event(kind="gone", rule="people", label="person", ts=1.0)
    sink.emit(frame_result(1, 0.1))
    sink.emit(frame_result(2, 0.2, [gone]))
    sink.emit(frame_result(3, 0.3, [appeared(0.3)], image=False))
    assert _jpegs(tmp_path) == []
    sink = SnapshotSink(tmp_path, min_interval_s=0.0, kinds=("gone",))
    sink.emit(frame_result(4, 0.4, [gone]))
    assert _names(tmp_path) == ["door_cam-00000004-gone-person.jpg"]


def test_snapshots_of_each_run_are_kept_though_frame_numbers_start_again(
    tmp_path: Path,
) -> None:
    # The agent starts a new run on each retry of a camera that keeps dropping; a person
    # in view is `appeared` at frame 2 of each. The three runs wrote one file.
    starts = (1_700_000_000.0, 1_700_000_005.25, 1_700_000_015.5)
    for start in starts:
        sink = SnapshotSink(tmp_path, min_interval_s=0.0, clock=itertools.repeat(start).__next__)
        sink.emit(frame_result(2, 0.2, [appeared(0.2)]))
        sink.close()
    assert [p.name for p in _jpegs(tmp_path)] == [
        "door_cam-20231114-221320.000-00000002-appeared-person.jpg",
        "door_cam-20231114-221325.250-00000002-appeared-person.jpg",
        "door_cam-20231114-221335.500-00000002-appeared-person.jpg",
    ]


@pytest.mark.parametrize("kind", ["source_error", "source_reconnecting", "pipeline_error"])
def test_a_snapshot_of_an_event_without_a_frame_is_refused(tmp_path: Path, kind: str) -> None:
    # Sent between frames, with no image: accepted, such a sink never wrote anything.
    with pytest.raises(
        ValidationError,
        match=rf"\['{kind}'\] come between frames.*\['appeared', 'gone', 'model_swapped'\]",
    ):
        SnapshotSinkSpec(folder=tmp_path, kinds=("appeared", kind))


def test_snapshot_write_failure_raises_for_the_guard_and_keeps_the_rate_limit(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "snaps"
    sink = SnapshotSink(folder, min_interval_s=10.0)
    folder.rmdir()  # the folder vanished (unmounted card, say)
    with pytest.raises(OSError, match="No such file"):
        sink.emit(frame_result(1, 0.1, [appeared(0.1)]))
    # The failed snapshot counts as taken: a dead disk is not retried on every event.
    sink.emit(frame_result(2, 0.2, [appeared(0.2)]))
    assert sink.written == 0


def test_specs_pick_the_sink_by_type(tmp_path: Path) -> None:
    adapter: TypeAdapter[JsonLinesSinkSpec | SnapshotSinkSpec | CaptureSinkSpec] = TypeAdapter(
        SinkSpec
    )
    jsonl = adapter.validate_python({"type": "jsonl", "path": str(tmp_path / "o.jsonl")})
    snapshot = adapter.validate_python(
        {"type": "snapshot", "folder": str(tmp_path / "s"), "kinds": ["appeared", "gone"]}
    )
    assert isinstance(jsonl, JsonLinesSinkSpec)
    assert isinstance(snapshot, SnapshotSinkSpec)
    jsonl_sink = build_sink(jsonl)
    snapshot_sink = build_sink(snapshot)
    assert isinstance(jsonl_sink, JsonLinesSink)
    assert isinstance(snapshot_sink, SnapshotSink)
    assert snapshot_sink.kinds == {"appeared", "gone"}
    assert (tmp_path / "s").is_dir()
    jsonl_sink.close()


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "kafka"},
        {"type": "snapshot", "folder": "/tmp/x", "kinds": ["exploded"]},
        {"type": "snapshot", "folder": "/tmp/x", "max_files": 0},
        {"type": "jsonl", "colour": "red"},
    ],
)
def test_specs_reject_bad_config(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(SinkSpec).validate_python(payload)


def test_a_json_lines_file_past_its_cap_keeps_one_rotated_generation(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    cap = 10 * (len(json.dumps(frame_result(0, 0.0).to_json())) + 1)
    sink = JsonLinesSink(path=path, max_bytes=cap)
    for i in range(40):
        sink.emit(frame_result(i, i / 10))
    sink.close()
    rotated = path.with_name("out.jsonl.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.1"]
    older, newer = ([json.loads(x)["frame"] for x in p.read_text().splitlines()]
                    for p in (rotated, path))  # fmt: skip
    # The newest lines and the file before them, none cut in two; the oldest are gone.
    assert older + newer == list(range(older[0], 40))
    assert older[0] > 0
    assert rotated.stat().st_size <= cap
    assert path.stat().st_size <= cap
    # A file already at its cap when opened is rotated at its first line.
    again = JsonLinesSink(path=path, max_bytes=path.stat().st_size)
    again.emit(frame_result(40, 4.0))
    again.close()
    assert [json.loads(x)["frame"] for x in path.read_text().splitlines()] == [40]
    assert [json.loads(x)["frame"] for x in rotated.read_text().splitlines()] == newer


def test_a_json_lines_spec_caps_its_file_at_64_mb_unless_told() -> None:
    assert JsonLinesSinkSpec(path=Path("x.jsonl")).max_mb == 64.0
    with pytest.raises(ValidationError):
        JsonLinesSinkSpec(path=Path("x.jsonl"), max_mb=0)


def test_a_device_is_never_rotated(tmp_path: Path) -> None:
    # Through a link, so that a wrong rename would move the link, never /dev/null itself.
    path = tmp_path / "null.jsonl"
    path.symlink_to("/dev/null")
    sink = JsonLinesSink(path=path, max_bytes=1)
    for i in range(3):
        sink.emit(frame_result(i, 0.0))
    sink.close()
    assert path.is_symlink()
    assert not path.with_name("null.jsonl.1").exists()


def test_a_rotation_the_folder_refuses_is_said_once_and_no_line_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What stands at the rotated name cannot be replaced (a folder with files in it): the
    # rename failed at every line after the cap, and every one of those lines was lost.
    path = tmp_path / "out.jsonl"
    blocked = tmp_path / "out.jsonl.1"
    blocked.mkdir()
    (blocked / "x").write_text("kept")
    cap = 3 * (len(json.dumps(frame_result(0, 0.0).to_json())) + 1)
    sink = JsonLinesSink(path=path, max_bytes=cap)
    with caplog.at_level(logging.ERROR, logger="edge_agent.pipelines.sinks"):
        for i in range(20):
            sink.emit(frame_result(i, i / 10))
    sink.close()
    assert [json.loads(x)["frame"] for x in path.read_text().splitlines()] == list(range(20))
    assert [r.getMessage() for r in caplog.records] == ["jsonl_rotate_failed"]
