"""Sinks: JSON lines, a callback, and annotated JPEG snapshots on events.

A sink may raise when it cannot do its job (a bad callback, a full disk). The
pipeline wraps every sink in a `guard.GuardedSink`, the one place that turns a
failure into a count and a rate-limited log line, so the other sinks are still
served and the pipeline runs on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal, TextIO, get_args

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from edge_agent.config_files import is_recorded
from edge_agent.heads.base import Classification, Detection, Result, TextBox
from edge_agent.logs import log_event
from edge_agent.pipelines.base import Event, FrameResult, Sink
from edge_agent.pipelines.capture import CaptureSink, CaptureSinkSpec

_log = logging.getLogger(__name__)

Image = npt.NDArray[np.uint8]

# BGR colours, cycled by class id so neighbouring classes differ.
_PALETTE: tuple[tuple[int, int, int], ...] = (
    (0, 255, 0),
    (0, 128, 255),
    (255, 0, 255),
    (255, 255, 0),
    (0, 0, 255),
    (255, 0, 0),
)
_TEXT_BOX_COLOUR = (0, 255, 255)
_TEXT_COLOUR = (255, 255, 255)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def annotate(image: Image, results: Sequence[Result], scale: int = 1) -> Image:
    """Draw detections (box, label, score, keypoints), text regions and the top class.

    Args:
        image: H x W x 3 BGR frame; left untouched.
        results: The frame's results, in the frame's pixel coordinates.
        scale: `image` is the frame decoded at 1/scale (`FrameResult.scale`), so the
            results' coordinates are divided by it.

    Returns:
        An annotated copy of `image`.
    """
    out: Image = image.copy()
    height, width = out.shape[:2]
    # Lines a couple of pixels wide on a 640-pixel frame, and still visible on 4K.
    thickness = max(1, round(min(height, width) / 320))
    font_scale = 0.4 * thickness
    top_class: Classification | None = None
    for result in results:
        if isinstance(result, Detection):
            colour = _PALETTE[result.class_id % len(_PALETTE)]
            x0, y0, x1, y1 = (round(v / scale) for v in result.box)
            cv2.rectangle(out, (x0, y0), (x1, y1), colour, thickness)
            _label(out, f"{result.label} {result.score:.2f}", (x0, y0), colour, font_scale)
            for x, y in result.keypoints:
                cv2.circle(out, (round(x / scale), round(y / scale)), thickness + 1, colour, -1)
        elif isinstance(result, TextBox):
            polygon = np.array(result.polygon, dtype=np.float64) / scale
            points = np.round(polygon).astype(np.int32)
            cv2.polylines(out, [points.reshape(-1, 1, 2)], True, _TEXT_BOX_COLOUR, thickness)
        elif isinstance(result, Classification) and (
            top_class is None or result.score > top_class.score
        ):
            top_class = result
    if top_class is not None:
        text = f"{top_class.label} {top_class.score:.2f}"
        _label(out, text, (0, 0), _PALETTE[0], font_scale, inside=True)
    return out


def _label(
    image: Image,
    text: str,
    corner: tuple[int, int],
    colour: tuple[int, int, int],
    font_scale: float,
    *,
    inside: bool = False,
) -> None:
    """Write `text` on a filled tag above `corner`, or below it when there is no room."""
    (text_w, text_h), baseline = cv2.getTextSize(text, _FONT, font_scale, 1)
    x, y = corner
    tag_h = text_h + baseline + 2
    top = y if inside or y - tag_h < 0 else y - tag_h
    cv2.rectangle(image, (x, top), (x + text_w + 2, top + tag_h), colour, -1)
    cv2.putText(
        image, text, (x + 1, top + text_h + 1), _FONT, font_scale, (0, 0, 0), 1, cv2.LINE_AA
    )


class JsonLinesSink:
    """One JSON object per frame, one per line: to stdout, a stream or a file.

    A file is capped: past `max_bytes` it becomes `<name>.1` (replacing the one before) and
    a new one starts. Uncapped, a pipeline's file grew until the state disk was full, with
    the outbox, the records and the model store on it: 100 bytes at 30 frames a second is
    250 MB a day.

    Args:
        stream: Where to write; stdout when neither this nor `path` is given.
        path: File to append to (line-buffered, so a crash loses at most a line).
        max_bytes: The file's cap; None for none. Not for a device such as /dev/null.
    """

    def __init__(
        self, stream: TextIO | None = None, path: Path | None = None, max_bytes: int | None = None
    ) -> None:
        if stream is not None and path is not None:
            raise ValueError("give a stream or a path, not both")
        self._owned = path is not None
        self._path = path
        self._max_bytes = max_bytes if path is not None and not _is_device(path) else None
        self._size = 0
        if path is not None:
            self._stream: TextIO = self._open(path)
        else:
            self._stream = stream if stream is not None else sys.stdout
        self._closed = False

    def _open(self, path: Path) -> TextIO:
        stream = path.open("a", encoding="utf-8", buffering=1)
        self._size = path.stat().st_size
        return stream

    def emit(self, result: FrameResult) -> None:
        """Write the frame's JSON line."""
        line = json.dumps(result.to_json()) + "\n"
        if self._max_bytes is not None and self._path is not None:
            size = len(line.encode())
            if self._size and self._size + size > self._max_bytes:
                self._rotate(self._path)
            self._size += size
        self._stream.write(line)
        if not self._owned:
            # A pipe to `jq` or a log shipper should see each frame as it happens.
            self._stream.flush()

    def _rotate(self, path: Path) -> None:
        # One generation kept: the newest lines and the file before them, never more.
        self._stream.close()
        try:
            path.replace(path.with_name(path.name + ".1"))
        except OSError as exc:
            # Said once, and the file appended to as before the cap: raised, every later
            # line was lost, each trying the same rename again.
            self._max_bytes = None
            log_event(
                _log,
                logging.ERROR,
                "jsonl_rotate_failed",
                path=str(path),
                error=str(exc),
                fix="let this user rename files in that folder (and remove what stands at "
                f"{path.name}.1); until the sink restarts the file is not capped",
            )
        self._stream = self._open(path)

    def close(self) -> None:
        """Flush, and close the file if this sink opened it.

        Raises:
            OSError: the last lines could not be written; an owned file is closed anyway.
        """
        if self._closed:
            return
        self._closed = True
        if self._owned:
            # close() flushes, and releases the file even when that flush fails.
            self._stream.close()
        else:
            self._stream.flush()


def _is_device(path: Path) -> bool:
    """Whether `path` is there and not a regular file (/dev/null, a FIFO): never rotated."""
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False  # not there yet: it is made as a file


class CallbackSink:
    """Hands each frame's result to a function, on the pipeline's thread.

    Args:
        fn: Called once per frame; what it raises is counted by the pipeline's guard.
    """

    def __init__(self, fn: Callable[[FrameResult], None]) -> None:
        self._fn = fn

    def emit(self, result: FrameResult) -> None:
        """Call the function."""
        self._fn(result)

    def close(self) -> None:
        """Nothing to release."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_EVENT_KINDS: tuple[str, ...] = get_args(Event.model_fields["kind"].annotation)
_SNAPSHOT = re.compile(
    r"[A-Za-z0-9_.-]+-(?:\d{8}-\d{6}\.\d{3}-)?\d{8}-"
    rf"(?:{'|'.join(_EVENT_KINDS)})(?:-[A-Za-z0-9_.-]+)?\.jpg"
)
"""A snapshot sink's file name (`SnapshotSink._name`, and the frame-only names written
before it carried a time): only these count toward its quota and are deleted by it. The
quota once took every JPEG in the folder: a sink pointed at a folder of someone's photos
deleted the photos, oldest first; and while any `-8 digits-` name matched, a phone's
`IMG-20240101-WA0001.jpg` still did. The event kind after the frame number tells ours."""


def _safe(name: str) -> str:
    """A file-name-safe form of a pipeline name or label."""
    return _UNSAFE.sub("_", name).strip("._") or "_"


class SnapshotSink:
    """Annotated JPEGs of frames that carry chosen events, rate-limited and under a quota.

    Files are named `{pipeline}-{YYYYmmdd-HHMMSS.mmm}-{frame:08d}-{kind}-{label}.jpg`
    (the time is the wall clock's, UTC; the label part is left out for events without
    one) and written atomically, so a reader never sees half a JPEG. The frame number
    alone started again at 0 in each run, and the agent starts a new run on each retry
    of a camera that keeps dropping: the snapshots of every run overwrote each other.

    Args:
        folder: Where snapshots go; created if missing. May be shared.
        min_interval_s: Stream seconds between two snapshots at least.
        kinds: Event kinds that trigger a snapshot.
        max_files: Snapshots kept in `folder` (files named as this sink names them, of
            any pipeline); the oldest go first, so the disk never fills. Other files,
            JPEGs included, are never touched.
        clock: Unix seconds, for the file names.
    """

    def __init__(
        self,
        folder: Path,
        min_interval_s: float = 10.0,
        kinds: tuple[str, ...] = ("appeared",),
        max_files: int = 500,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_files < 1:
            raise ValueError(f"max_files must be at least 1, got {max_files}")
        self.folder = folder
        self.min_interval_s = min_interval_s
        self.kinds = frozenset(kinds)
        self.max_files = max_files
        self._clock = clock
        self.written = 0
        self._last_ts: float | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def emit(self, result: FrameResult) -> None:
        """Write a snapshot if the frame has a triggering event and the rate limit allows.

        Raises:
            OSError: the JPEG could not be written (the next one is still rate-limited).
        """
        event = next((e for e in result.events if e.kind in self.kinds), None)
        if event is None or result.image is None:
            return
        # A timestamp that went backwards means the source restarted its clock.
        if (
            self._last_ts is not None
            and self._last_ts <= result.ts < self._last_ts + self.min_interval_s
        ):
            return
        # Counted as taken even if the write fails: a full disk should not be
        # retried on every event frame.
        self._last_ts = result.ts
        written = self._write(
            self._name(result, event), annotate(result.image, result.results, result.scale)
        )
        self._enforce_quota(written)

    def close(self) -> None:
        """Nothing to release: every snapshot is complete on disk when `emit` returns."""

    def _name(self, result: FrameResult, event: Event) -> str:
        tag = f"{event.kind}-{_safe(event.label)}" if event.label else event.kind
        now = self._clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        millis = int(now * 1000) % 1000
        return f"{_safe(result.pipeline)}-{stamp}.{millis:03d}-{result.frame:08d}-{tag}.jpg"

    def _write(self, name: str, image: Image) -> Path:
        ok, encoded = cv2.imencode(".jpg", image)
        if not ok:
            raise OSError(f"JPEG encoding failed for {name}")
        target = self.folder / name
        tmp = self.folder / f".{name}.{os.getpid()}.tmp"
        try:
            with tmp.open("wb") as f:
                f.write(encoded.tobytes())
                f.flush()
                # Edge boxes lose power; without fsync the rename can outlive the data.
                os.fsync(f.fileno())
            tmp.replace(target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self.written += 1
        return target

    def _enforce_quota(self, written: Path) -> None:
        with os.scandir(self.folder) as entries:
            jpegs = [
                (e.stat().st_mtime_ns, e.name, e.path)
                for e in entries
                if _SNAPSHOT.fullmatch(e.name) and e.is_file() and e.path != str(written)
            ]
        # The one just written is the newest, whatever the clock says. After the clock
        # stepped back (a box that booted in 1970 and synced later, or the reverse) it
        # would sort oldest and be deleted at once, every time: it takes the next tick
        # after the newest instead, so the order on disk stays the order of writing.
        mine = written.stat().st_mtime_ns
        newest = max((mtime for mtime, _, _ in jpegs), default=None)
        if newest is not None and mine <= newest:
            mine = newest + 1
            os.utime(written, ns=(mine, mine))
        jpegs.append((mine, written.name, str(written)))
        # Oldest first; names carry the time and the zero-padded frame number, so they
        # break ties between files written within one mtime tick.
        jpegs.sort()
        for _, _, path in jpegs[: max(0, len(jpegs) - self.max_files)]:
            Path(path).unlink(missing_ok=True)


class JsonLinesSinkSpec(BaseModel):
    """Write each frame's result as a JSON line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["jsonl"] = Field(default="jsonl", description="Sink type.")
    path: Path | None = Field(
        default=None, description="File to append to; standard output when unset."
    )
    max_mb: float = Field(
        default=64.0,
        gt=0,
        description="The file's cap in MB: past it the file becomes <path>.1 (replacing the "
        "one before) and a new one starts, so it never holds more than twice this.",
    )


_FRAMELESS = frozenset({"source_error", "source_reconnecting", "pipeline_error"})
"""Event kinds sent between frames (a result of frame -1, with no image): accepted as a
snapshot's kinds, they never took one, and nothing said so."""
_SNAPSHOT_KINDS = tuple(k for k in _EVENT_KINDS if k not in _FRAMELESS)


class SnapshotSinkSpec(BaseModel):
    """Save annotated JPEGs of frames with chosen events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["snapshot"] = Field(default="snapshot", description="Sink type.")
    folder: Path = Field(description="Folder for the JPEGs; created if missing.")
    min_interval_s: float = Field(
        default=10.0, ge=0.0, description="Stream seconds between two snapshots at least."
    )
    kinds: tuple[str, ...] = Field(
        default=("appeared",),
        min_length=1,
        description=f"Event kinds that trigger a snapshot, among: {', '.join(_SNAPSHOT_KINDS)}.",
    )
    max_files: int = Field(
        default=500, ge=1, description="JPEGs kept in the folder; the oldest are deleted."
    )

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        unknown = sorted(set(kinds) - set(_EVENT_KINDS))
        if unknown:
            raise ValueError(f"unknown event kinds {unknown}; known: {list(_EVENT_KINDS)}")
        frameless = sorted(set(kinds) & _FRAMELESS)
        if frameless and is_recorded(info):
            # Recorded by a build that accepted them: they never took a snapshot, and
            # refused, they kept the whole camera from coming back after the upgrade.
            return tuple(k for k in kinds if k not in _FRAMELESS)
        if frameless:
            raise ValueError(
                f"event kinds {frameless} come between frames and carry no image to save;"
                f" snapshots are taken for: {list(_SNAPSHOT_KINDS)}"
            )
        return kinds


SinkSpec = Annotated[
    JsonLinesSinkSpec | SnapshotSinkSpec | CaptureSinkSpec, Field(discriminator="type")
]


def sink_name(spec: JsonLinesSinkSpec | SnapshotSinkSpec | CaptureSinkSpec) -> str:
    """How logs and counts name a sink: its type and where it writes."""
    if isinstance(spec, JsonLinesSinkSpec):
        return f"jsonl:{spec.path or 'stdout'}"
    return f"{spec.type}:{spec.folder or 'default'}"


def build_sink(
    spec: JsonLinesSinkSpec | SnapshotSinkSpec | CaptureSinkSpec, capture_to: Path | None = None
) -> Sink:
    """The sink a spec describes (opens its file or creates its folder).

    Args:
        spec: the sink's spec.
        capture_to: folder for a capture sink that names none (the pipeline's default).
    """
    if isinstance(spec, JsonLinesSinkSpec):
        return JsonLinesSink(path=spec.path, max_bytes=int(spec.max_mb * 1e6))
    if isinstance(spec, CaptureSinkSpec):
        folder = spec.folder or capture_to
        if folder is None:
            raise ValueError("a capture sink needs a folder")
        return CaptureSink(spec, folder)
    return SnapshotSink(
        spec.folder,
        min_interval_s=spec.min_interval_s,
        kinds=spec.kinds,
        max_files=spec.max_files,
    )
