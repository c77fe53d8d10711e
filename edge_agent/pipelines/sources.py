"""Frame sources: video files, image folders, cameras and network streams, from their specs.

Files and folders are read in the caller's thread and never drop a frame
(`file_sources`), unless a file is played in realtime (`realtime`): then it
drops what the pipeline cannot take, as a camera would. Cameras and streams are
live (`live_sources`): a reader thread keeps only the latest frame, reconnects
with exponential backoff when the feed is lost or stalls, and fails with a
SourceError once it has gone `give_up_after_s` without a frame.

Every source decodes a JPEG (a folder's images, an MJPEG file, camera or stream)
at 1/2, 1/4 or 1/8 when the pipeline passes a `min_size` that allows it; the
frame says its `scale`, and the source's `decoding` says it too (see `decode`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit, urlunsplit

import cv2
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_agent.pipelines.base import FrameSource
from edge_agent.pipelines.decode import (
    REDUCED_DECODE_DOC,
    JpegDecoder,
    MinSize,
    open_capture,
    read_packets,
)
from edge_agent.pipelines.file_sources import DEFAULT_FPS, FileSource, FolderSource, VideoFile
from edge_agent.pipelines.live_sources import (
    FeedUnavailableError,
    LiveSource,
    LiveSpec,
    StateCallback,
    answers_but_no_stream,
    unreachable,
)
from edge_agent.pipelines.realtime import RealtimeFileSource
from edge_agent.quiet import mute_video_logs

# Re-exported: callers open sources from here.
__all__ = [
    "CameraSourceSpec",
    "FileSource",
    "FileSourceSpec",
    "FolderSource",
    "FolderSourceSpec",
    "RealtimeFileSource",
    "SourceSpec",
    "StreamSourceSpec",
    "VideoFile",
    "open_source",
    "spec_from_uri",
]

_STREAM_SCHEMES = ("rtsp://", "rtsps://", "http://", "https://")


class FileSourceSpec(BaseModel):
    """A video file: read frame by frame without dropping any, or played like a camera."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["file"] = Field("file", description="Source kind.")
    path: Path = Field(description="Video file FFmpeg can decode (mp4, avi, mkv, ...).")
    realtime: bool = Field(
        False,
        description="Play the file at its own frame rate and drop the frames the pipeline "
        "cannot take, as a camera would (counted in `dropped`); false reads every frame "
        "as fast as the pipeline takes them.",
    )
    loop: bool = Field(False, description="Start again after the last frame (realtime only).")
    fps_cap: float | None = Field(
        None,
        gt=0,
        description="Hand the pipeline at most this many frames per second (realtime only); "
        "None for the file's rate.",
    )
    hw_decode: bool = Field(
        True,
        description="Ask FFmpeg for hardware video decode; the source says when it decodes "
        "on the CPU instead, and never fails for it.",
    )
    reduced_decode: bool = Field(True, description=REDUCED_DECODE_DOC)

    @model_validator(mode="after")
    def _realtime_options(self) -> Self:
        if not self.realtime and (self.loop or self.fps_cap is not None):
            raise ValueError("loop and fps_cap need realtime = true")
        return self


class FolderSourceSpec(BaseModel):
    """A folder of images, read in name order as if they were a video. A file that is not
    an image, or is over 64 MiB (`decode.MAX_IMAGE_FILE_BYTES`), is skipped and counted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["folder"] = Field("folder", description="Source kind.")
    path: Path = Field(description="Folder holding the images.")
    pattern: str = Field("*", description="Glob selecting the images, e.g. '*.jpg'.")
    fps: float = Field(
        DEFAULT_FPS, gt=0, description="Frame rate the images stand for; sets each frame's ts."
    )
    reduced_decode: bool = Field(True, description=REDUCED_DECODE_DOC)


class CameraSourceSpec(LiveSpec):
    """A V4L2 camera (USB or MIPI), by index or device path."""

    type: Literal["camera"] = Field("camera", description="Source kind.")
    device: int | str = Field(
        description="Camera index (0) or device path (/dev/video0, /dev/v4l/by-id/...)."
    )
    width: int | None = Field(None, gt=0, description="Requested frame width; None for default.")
    height: int | None = Field(None, gt=0, description="Requested frame height; None for default.")
    fourcc: str | None = Field(
        None,
        pattern="^[A-Z0-9]{4}$",
        description="Pixel format to ask for, e.g. MJPG (USB cameras need it for HD at full "
        "rate; its JPEGs can then be decoded at a reduced scale); None for the default.",
    )

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
    hw_decode: bool = Field(
        True,
        description="Ask FFmpeg for hardware video decode; the source says when it decodes "
        "on the CPU instead, and never fails for it.",
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.lower().startswith(_STREAM_SCHEMES):
            raise ValueError(f"stream url must start with one of {', '.join(_STREAM_SCHEMES)}")
        # Read here as the source reads it (urlsplit, .port), so a typo in a camera's URL
        # is this one line: it passed, and the source's first log of the URL raised a
        # ValueError out as a traceback (an internal error over MQTT). The messages never
        # quote the URL: it may hold the camera's password.
        try:
            parts = urlsplit(value)
            _ = parts.port
        except ValueError as exc:
            raise ValueError(
                f"stream url is malformed: {exc} (a port is a number up to 65535, an IPv6"
                " host is written in brackets: rtsp://[fe80::1]:554/stream)"
            ) from None
        if not parts.hostname:
            raise ValueError("stream url has no host, as in rtsp://camera.local:554/stream")
        try:
            # As the source's reachability check reads it: `cam..local`, or a label over 63
            # characters, passed here and crashed the reader thread (a UnicodeError).
            parts.hostname.encode("idna")
        except UnicodeError:
            raise ValueError(
                "stream url's host is not a valid name (an empty label, as in cam..local, "
                "or one over 63 characters)"
            ) from None
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


def _camera_connector(
    spec: CameraSourceSpec, decoder: JpegDecoder
) -> Callable[[], cv2.VideoCapture]:
    mute_video_logs()
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
        # The format first: V4L2 picks the sizes it offers per format.
        if spec.fourcc:
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter.fourcc(*spec.fourcc))
        if spec.width:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, spec.width)
        if spec.height:
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, spec.height)
        read_packets(cap, decoder, v4l2=True)
        # Honoured by some backends only; read() has its own backstop for the rest.
        cap.set(cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms)
        return cap

    return connect


def _stream_connector(
    spec: StreamSourceSpec, decoder: JpegDecoder
) -> Callable[[], cv2.VideoCapture]:
    timeout_ms = int(spec.stall_timeout_s * 1000)
    # Without these FFmpeg waits 30 s on a dead host and forever on a silent stream.
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        timeout_ms,
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        timeout_ms,
    ]
    shown = _redact(spec.url)
    mute_video_logs()

    def connect() -> cv2.VideoCapture:
        probed: list[str | None] = []

        def answers() -> bool:
            # A host that does not answer fails the open without hardware decode too: one
            # open a reconnect, not two (each up to the stall timeout on a dead host).
            probed.append(unreachable(spec.url, spec.stall_timeout_s))
            return probed[0] is None

        cap, hw, _ = open_capture(spec.url, params, spec.hw_decode, answers)
        if not cap.isOpened():
            cap.release()
            why = probed[0] if probed else unreachable(spec.url, spec.stall_timeout_s)
            raise FeedUnavailableError(
                f"cannot open {shown}: {why or answers_but_no_stream(spec.url)}"
            )
        read_packets(cap, decoder, hw=hw)
        return cap

    return connect


def open_source(
    spec: SourceSpec,
    on_state: StateCallback | None = None,
    min_size: MinSize | None = None,
    pipeline: str | None = None,
) -> FrameSource:
    """Open the source a spec describes.

    Args:
        spec: which source.
        on_state: for cameras and streams, called as on_state(state, detail) from the
            reader thread when the feed goes live, is lost, or is given up.
        min_size: what the pipeline needs of a frame (`decode.min_size_for_fit`, or
            `min_size_for_tiles`); a JPEG larger than that by 2x or more is decoded
            reduced, and its frames carry the `scale`. None, or a spec with
            `reduced_decode = false`, decodes every frame whole.
        pipeline: the pipeline's id, for a live source's log lines.

    Raises:
        SourceError: a file or folder is missing or unreadable (live sources report
            failure from `read()` instead, after retrying).
    """
    if not spec.reduced_decode:
        min_size = None
    if isinstance(spec, FileSourceSpec):
        if spec.realtime:
            return RealtimeFileSource(
                spec.path,
                loop=spec.loop,
                fps_cap=spec.fps_cap,
                min_size=min_size,
                hw_decode=spec.hw_decode,
            )
        return FileSource(spec.path, min_size=min_size, hw_decode=spec.hw_decode)
    if isinstance(spec, FolderSourceSpec):
        return FolderSource(spec.path, spec.pattern, spec.fps, min_size=min_size)
    decoder = JpegDecoder(min_size)
    if isinstance(spec, CameraSourceSpec):
        return LiveSource(
            f"camera {spec.device}",
            _camera_connector(spec, decoder),
            spec,
            fix="check the cable and `v4l2-ctl --list-devices`; the user needs the `video` group",
            on_state=on_state,
            decoder=decoder,
            pipeline=pipeline,
        )
    shown = _redact(spec.url)
    return LiveSource(
        f"stream {shown}",
        _stream_connector(spec, decoder),
        spec,
        fix=f"check the camera is up and reachable: `ffprobe {shown}`",
        on_state=on_state,
        decoder=decoder,
        hw_decode=spec.hw_decode,
        pipeline=pipeline,
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
