"""Frame sources: video files, image folders, cameras and network streams.

Files and folders are read in the caller's thread and never drop a frame. Cameras
and streams are live: a reader thread keeps only the latest frame, reconnects with
exponential backoff when the feed is lost or stalls, and fails with a SourceError
once it has gone `give_up_after_s` without a frame.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_agent.pipelines.base import Frame, FrameSource, SourceError
from edge_agent.pipelines.live_sources import (
    FeedUnavailableError,
    LiveSource,
    LiveSpec,
    StateCallback,
)
from edge_agent.quiet import native_stderr_held

log = logging.getLogger(__name__)

_DEFAULT_FPS = 30.0
_STREAM_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://")


class FileSourceSpec(BaseModel):
    """A video file, read frame by frame without dropping any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["file"] = Field("file", description="Source kind.")
    path: Path = Field(description="Video file FFmpeg can decode (mp4, avi, mkv, ...).")


class FolderSourceSpec(BaseModel):
    """A folder of images, read in name order as if they were a video."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["folder"] = Field("folder", description="Source kind.")
    path: Path = Field(description="Folder holding the images.")
    pattern: str = Field("*", description="Glob selecting the images, e.g. '*.jpg'.")
    fps: float = Field(
        _DEFAULT_FPS, gt=0, description="Frame rate the images stand for; sets each frame's ts."
    )


class CameraSourceSpec(LiveSpec):
    """A V4L2 camera (USB or MIPI), by index or device path."""

    type: Literal["camera"] = Field("camera", description="Source kind.")
    device: int | str = Field(
        description="Camera index (0) or device path (/dev/video0, /dev/v4l/by-id/...)."
    )
    width: int | None = Field(None, gt=0, description="Requested frame width; None for default.")
    height: int | None = Field(None, gt=0, description="Requested frame height; None for default.")

    @field_validator("device")
    @classmethod
    def _index_or_dev_path(cls, value: int | str) -> int | str:
        if isinstance(value, str) and value.isdigit():
            return int(value)
        if isinstance(value, int) and value < 0:
            raise ValueError("camera index must be 0 or more")
        if isinstance(value, str) and not value.startswith("/dev/"):
            raise ValueError("camera device must be an index or a path under /dev/")
        return value


class StreamSourceSpec(LiveSpec):
    """A network stream: RTSP from an IP camera, or HTTP(S) MJPEG/HLS."""

    type: Literal["stream"] = Field("stream", description="Source kind.")
    url: str = Field(description="rtsp://, rtsps://, http:// or https:// URL of the stream.")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.lower().startswith(_STREAM_SCHEMES):
            raise ValueError(f"stream url must start with one of {', '.join(_STREAM_SCHEMES)}")
        return value


SourceSpec = Annotated[
    FileSourceSpec | FolderSourceSpec | CameraSourceSpec | StreamSourceSpec,
    Field(discriminator="type"),
]


def _redact(url: str) -> str:
    """The URL without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class FileSource:
    """Every frame of a video file, in order, decoded in the caller's thread."""

    def __init__(self, path: Path) -> None:
        """Open the file.

        Raises:
            SourceError: the file is missing or FFmpeg cannot open it.
        """
        self._path = path
        if not path.is_file():
            raise SourceError(
                f"video file {path} does not exist",
                fix="check the path (a folder needs type=folder)",
            )
        # OpenCV prints FFmpeg's parse errors to fd 2; the SourceError says it in one line.
        with native_stderr_held():
            cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
            if not cap.isOpened():
                cap.release()
                raise SourceError(
                    f"cannot open video {path}: not a video FFmpeg decodes, or cut short",
                    fix=f"check it with `ffprobe {path}`; re-copy the file if it was truncated",
                )
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        self._fps = fps if math.isfinite(fps) and 0 < fps <= 1000 else _DEFAULT_FPS
        count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self._expected = int(count) if math.isfinite(count) and count > 0 else None
        self._cap: cv2.VideoCapture | None = cap
        self._next = 0

    @property
    def dropped(self) -> int:
        """Always 0: a file waits for its reader."""
        return 0

    @property
    def fps(self) -> float:
        """The file's frame rate, or 30 when the container does not say."""
        return self._fps

    def read(self) -> Frame | None:
        """The next frame; None after the last.

        Raises:
            SourceError: decoding stopped before the frame count the container declares.
        """
        if self._cap is None:
            return None
        start = time.perf_counter()
        ok, image = self._cap.read()
        read_s = time.perf_counter() - start
        if not ok or image is None:
            self.close()
            # Counts estimated from duration x fps can be one over; more than that is
            # a file cut short (a copy interrupted, a recorder killed mid-write).
            if self._expected is not None and self._next < self._expected - 1:
                raise SourceError(
                    f"video {self._path} ended after {self._next} of {self._expected} frames: "
                    "the file is truncated or corrupt",
                    fix="re-copy the file, or re-encode what is left with "
                    f"`ffmpeg -i {self._path} -c:v libx264 fixed.mp4`",
                )
            return None
        pixels = np.asarray(image, dtype=np.uint8)  # already uint8; this only types it
        frame = Frame(index=self._next, ts=self._next / self._fps, image=pixels, read_s=read_s)
        self._next += 1
        return frame

    def close(self) -> None:
        """Release the file; safe to call twice."""
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()


class _UnreadableError(Exception):
    """Internal: raised inside native_stderr_held so OpenCV's warning is dropped."""


def _imread(path: Path) -> npt.NDArray[np.uint8] | None:
    try:
        with native_stderr_held():
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is None:
                raise _UnreadableError
    except _UnreadableError:
        return None
    return np.asarray(image, dtype=np.uint8)


class FolderSource:
    """The images of a folder in name order; unreadable files are skipped and counted."""

    def __init__(self, path: Path, pattern: str = "*", fps: float = _DEFAULT_FPS) -> None:
        """List the images.

        Raises:
            SourceError: the folder is missing or no file matches the pattern.
        """
        if not path.is_dir():
            raise SourceError(f"image folder {path} does not exist", fix="check the path")
        files = [p for p in path.glob(pattern) if p.is_file()]
        if not files:
            raise SourceError(
                f"no files match {pattern!r} in {path}", fix="check the folder and the pattern"
            )
        self._path = path
        self._files = sorted(files, key=lambda p: p.relative_to(path).as_posix())
        self._fps = fps
        self._pos = 0
        self._delivered = 0
        self._skipped = 0
        self._failed = False

    @property
    def dropped(self) -> int:
        """Always 0: a folder waits for its reader."""
        return 0

    @property
    def skipped(self) -> int:
        """Files passed over because they could not be decoded as images."""
        return self._skipped

    def read(self) -> Frame | None:
        """The next readable image; index and ts follow its position in the listing.

        Raises:
            SourceError: not one of the files could be read as an image.
        """
        while self._pos < len(self._files):
            file = self._files[self._pos]
            index = self._pos
            self._pos += 1
            start = time.perf_counter()
            image = _imread(file)
            if image is None:
                self._skipped += 1
                log.warning(
                    "source=folder event=image_skipped path=%s skipped=%d", file, self._skipped
                )
                continue
            self._delivered += 1
            read_s = time.perf_counter() - start
            return Frame(index=index, ts=index / self._fps, image=image, read_s=read_s)
        if self._delivered == 0 and self._skipped > 0 and not self._failed:
            self._failed = True  # raise once; a later read() just ends
            raise SourceError(
                f"none of the {self._skipped} files in {self._path} could be read as an image",
                fix="check the pattern selects image files (jpg, png, bmp, tiff)",
            )
        return None

    def close(self) -> None:
        """Nothing to release; safe to call twice."""
        self._pos = len(self._files)


def _camera_connector(spec: CameraSourceSpec) -> Callable[[], cv2.VideoCapture]:
    device = spec.device
    timeout_ms = int(spec.stall_timeout_s * 1000)

    def connect() -> cv2.VideoCapture:
        if isinstance(device, str):
            if not Path(device).exists():
                raise FeedUnavailableError(f"{device} does not exist")
            if not os.access(device, os.R_OK | os.W_OK):
                raise FeedUnavailableError(f"no permission to open {device}")
        cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
        if not cap.isOpened():
            cap.release()
            raise FeedUnavailableError(
                f"cannot open camera {device} (missing, busy or not a capture node)"
            )
        if spec.width:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, spec.width)
        if spec.height:
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, spec.height)
        # Honoured by some backends only; read() has its own backstop for the rest.
        cap.set(cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms)
        return cap

    return connect


def _stream_connector(spec: StreamSourceSpec) -> Callable[[], cv2.VideoCapture]:
    timeout_ms = int(spec.stall_timeout_s * 1000)
    # Without these FFmpeg waits 30 s on a dead host and forever on a silent stream.
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        timeout_ms,
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        timeout_ms,
    ]
    shown = _redact(spec.url)

    def connect() -> cv2.VideoCapture:
        cap = cv2.VideoCapture(spec.url, cv2.CAP_FFMPEG, params)
        if not cap.isOpened():
            cap.release()
            raise FeedUnavailableError(f"cannot open {shown}")
        return cap

    return connect


def open_source(spec: SourceSpec, on_state: StateCallback | None = None) -> FrameSource:
    """Open the source a spec describes.

    Args:
        spec: which source.
        on_state: for cameras and streams, called as on_state(state, detail) from the
            reader thread when the feed goes live, is lost, or is given up.

    Raises:
        SourceError: a file or folder is missing or unreadable (live sources report
            failure from `read()` instead, after retrying).
    """
    if isinstance(spec, FileSourceSpec):
        return FileSource(spec.path)
    if isinstance(spec, FolderSourceSpec):
        return FolderSource(spec.path, spec.pattern, spec.fps)
    if isinstance(spec, CameraSourceSpec):
        return LiveSource(
            f"camera {spec.device}",
            _camera_connector(spec),
            spec,
            fix="check the cable and `v4l2-ctl --list-devices`; the user needs the `video` group",
            on_state=on_state,
        )
    shown = _redact(spec.url)
    return LiveSource(
        f"stream {shown}",
        _stream_connector(spec),
        spec,
        fix=f"check the camera is up and reachable: `ffprobe {shown}`",
        on_state=on_state,
    )


def spec_from_uri(text: str) -> SourceSpec:
    """Map a command-line source: an index or /dev path is a camera, a URL a stream,
    a directory a folder, and anything else a video file.
    """
    text = text.strip()
    if text.isdigit():
        return CameraSourceSpec(device=int(text))
    if text.startswith("/dev/"):
        return CameraSourceSpec(device=text)
    if text.lower().startswith(_STREAM_SCHEMES):
        return StreamSourceSpec(url=text)
    path = Path(text).expanduser()
    if path.is_dir():
        return FolderSourceSpec(path=path)
    return FileSourceSpec(path=path)
