"""Sources read from disk as fast as the pipeline takes them: video files and image folders.

Neither drops a frame. Both decode a JPEG at a reduced scale when the pipeline
passes a `MinSize` that allows it (see `decode`); `VideoFile` is also what the
realtime file source plays from.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.logs import log_event
from edge_agent.pipelines.base import Frame, SourceError
from edge_agent.pipelines.decode import (
    Decoding,
    JpegDecoder,
    MinSize,
    is_packet,
    open_capture,
    read_image_file,
    read_packets,
    require_utf8_path,
)
from edge_agent.quiet import mute_video_logs, native_stderr_held

log = logging.getLogger(__name__)

DEFAULT_FPS = 30.0

Image = npt.NDArray[np.uint8]


class VideoFile:
    """An open video file: frames or JPEG packets in order, with the truncation check.

    Args:
        path: the file.
        decoder: decides the JPEG reduction of an MJPEG file (none without a MinSize).
        hw_decode: ask FFmpeg for hardware decode first.

    Raises:
        SourceError: the file is missing or FFmpeg cannot open it.
    """

    def __init__(self, path: Path, decoder: JpegDecoder, hw_decode: bool = True) -> None:
        self.path = path
        self.decoder = decoder
        self._hw_decode = hw_decode
        if path.exists() and not path.is_file():
            what = "a folder" if path.is_dir() else "not a regular file (a device or pipe)"
            raise SourceError(
                f"video file {path} is {what}",
                fix="give a video file; a folder of images needs type=folder",
                code="input.invalid",
            )
        if not path.is_file():
            raise SourceError(
                f"video file {path} does not exist",
                fix="check the path (a folder needs type=folder)",
                code="source.unreachable",
            )
        require_utf8_path(path)
        mute_video_logs()
        self._cap: cv2.VideoCapture | None = self._open()
        fps = float(self._cap.get(cv2.CAP_PROP_FPS))
        self.fps = fps if math.isfinite(fps) and 0 < fps <= 1000 else DEFAULT_FPS
        count = self._cap.get(cv2.CAP_PROP_FRAME_COUNT)
        self.expected = int(count) if math.isfinite(count) and count > 0 else None
        self.position = 0
        """Frames read since the file was (re)opened."""

    def _open(self) -> cv2.VideoCapture:
        # Some decoders print to fd 2 past FFmpeg's log; the SourceError says it in one line.
        with native_stderr_held():
            cap, self.hw, self.note = open_capture(str(self.path), [], self._hw_decode)
            if not cap.isOpened():
                cap.release()
                raise SourceError(
                    f"cannot open video {self.path}: not a video FFmpeg decodes, or cut short",
                    fix=f"check it with `ffprobe {self.path}`; re-copy it if it was truncated",
                    code="input.unreadable",
                )
        self.packets = read_packets(cap, self.decoder, hw=self.hw)
        return cap

    @property
    def decoding(self) -> Decoding:
        """Where and at what scale frames are decoded."""
        return Decoding(self.hw, self.note, self.decoder.scale if self.packets else 1)

    def grab(self) -> Image | None:
        """The next frame, or its JPEG packet when `packets`; None after the last.

        Raises:
            SourceError: decoding stopped before the frame count the container declares.
        """
        if self._cap is None:
            return None
        ok, data = self._cap.read()
        if not ok or data is None:
            self.close()
            # Counts estimated from duration x fps can be one over; more than that is
            # a file cut short (a copy interrupted, a recorder killed mid-write).
            if self.expected is not None and self.position < self.expected - 1:
                raise SourceError(
                    f"video {self.path} ended after {self.position} of {self.expected} frames: "
                    "the file is truncated or corrupt",
                    fix="re-copy the file, or re-encode what is left with "
                    f"`ffmpeg -i {self.path} -c:v libx264 fixed.mp4`",
                    code="source.failed",
                )
            return None
        self.position += 1
        return np.asarray(data, dtype=np.uint8)  # already uint8; this only types it

    def skip(self) -> bool:
        """Pass over the next frame without handing it out; False at the end."""
        if self._cap is None or not self._cap.grab():
            return False
        self.position += 1
        return True

    def decode(self, data: Image) -> tuple[Image, int] | None:
        """A frame from `grab`'s result, and its reduction; None for a corrupt packet."""
        if not is_packet(data):
            return data, 1
        image = self.decoder.decode(data)
        return None if image is None else (image, self.decoder.scale)

    def rewind(self) -> None:
        """Start again from the first frame (the file is opened anew)."""
        self.close()
        self._cap = self._open()
        self.position = 0

    def close(self) -> None:
        """Release the file; safe to call twice."""
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()


class FileSource:
    """Every frame of a video file, in order, decoded in the caller's thread."""

    def __init__(
        self, path: Path, *, min_size: MinSize | None = None, hw_decode: bool = True
    ) -> None:
        """Open the file.

        Raises:
            SourceError: the file is missing or FFmpeg cannot open it.
        """
        self._video = VideoFile(path, JpegDecoder(min_size), hw_decode)
        self._next = 0
        self._corrupt = 0

    @property
    def dropped(self) -> int:
        """JPEG packets that would not decode (an MJPEG file decoded on the CPU; a file
        never drops a frame otherwise)."""
        return self._corrupt

    @property
    def fps(self) -> float:
        """The file's frame rate, or 30 when the container does not say."""
        return self._video.fps

    @property
    def decoding(self) -> Decoding:
        """Where and at what scale frames are decoded."""
        return self._video.decoding

    def read(self) -> Frame | None:
        """The next frame; None after the last.

        Raises:
            SourceError: decoding stopped before the frame count the container declares.
        """
        while True:
            start = time.perf_counter()
            data = self._video.grab()
            if data is None:
                return None
            decoded = self._video.decode(data)
            if decoded is not None:
                break
            self._corrupt += 1
            self._next += 1
        image, scale = decoded
        read_s = time.perf_counter() - start
        ts = self._next / self._video.fps
        frame = Frame(index=self._next, ts=ts, image=image, read_s=read_s, scale=scale)
        self._next += 1
        return frame

    def close(self) -> None:
        """Release the file; safe to call twice."""
        self._video.close()


class FolderSource:
    """The images of a folder in name order; unreadable files, and files too large to be
    a camera's image, are skipped and counted."""

    def __init__(
        self,
        path: Path,
        pattern: str = "*",
        fps: float = DEFAULT_FPS,
        *,
        min_size: MinSize | None = None,
    ) -> None:
        """List the images.

        Raises:
            SourceError: the folder is missing or no file matches the pattern.
        """
        if path.exists() and not path.is_dir():
            raise SourceError(
                f"image folder {path} is a file, not a folder",
                fix="give the folder holding the images; a video file needs type=file",
                code="input.invalid",
            )
        if not path.is_dir():
            raise SourceError(
                f"image folder {path} does not exist",
                fix="check the path",
                code="source.unreachable",
            )
        files = [p for p in path.glob(pattern) if p.is_file()]
        if not files:
            raise SourceError(
                f"no files match {pattern!r} in {path}",
                fix="check the folder and the pattern",
                code="input.not_found",
            )
        mute_video_logs()
        self._path = path
        self._files = sorted(files, key=lambda p: p.relative_to(path).as_posix())
        self._fps = fps
        self._decoder = JpegDecoder(min_size)
        self._pos = 0
        self._delivered = 0
        self._skipped = 0
        self._failed = False

    @property
    def dropped(self) -> int:
        """Files skipped because they could not be read as images (each logged with why)."""
        return self._skipped

    @property
    def skipped(self) -> int:
        """Files passed over because they could not be decoded as images."""
        return self._skipped

    @property
    def decoding(self) -> Decoding:
        """The reduction of the last image decoded (images decode on the CPU)."""
        return Decoding("cpu", "", self._decoder.scale)

    def read(self) -> Frame | None:
        """The next readable image, numbered after the images before it; None at the end.

        Frames are numbered 0, 1, 2, ... over the images delivered, as a video's would
        be; each carries its file in `source`, and skipped files are counted in `dropped`.

        Raises:
            SourceError: not one of the files could be read as an image.
        """
        while self._pos < len(self._files):
            file = self._files[self._pos]
            self._pos += 1
            start = time.perf_counter()
            # The decoder reduces JPEGs only; any other format decodes whole.
            image, reason = read_image_file(file, self._decoder.decode)
            if image is None:
                self._skipped += 1
                log_event(
                    log,
                    logging.WARNING,
                    "image_skipped",
                    source="folder",
                    path=str(file),
                    reason=reason,
                    skipped=self._skipped,
                )
                continue
            index = self._delivered
            self._delivered += 1
            read_s = time.perf_counter() - start
            return Frame(
                index=index,
                ts=index / self._fps,
                image=image,
                read_s=read_s,
                source=str(file),
                scale=self._decoder.scale,
            )
        if self._delivered == 0 and self._skipped > 0 and not self._failed:
            self._failed = True  # raise once; a later read() just ends
            raise SourceError(
                f"none of the {self._skipped} files in {self._path} could be read as an image",
                fix="check the pattern selects image files (jpg, png, bmp, tiff)",
                code="input.unreadable",
            )
        return None

    def close(self) -> None:
        """Nothing to release; safe to call twice."""
        self._pos = len(self._files)
