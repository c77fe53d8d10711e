"""The cheap path from camera bytes to pixels: reduced JPEG decode and hardware video decode.

A JPEG much larger than the model's input need not be decoded whole: libjpeg scales
in the DCT, so decoding at 1/2, 1/4 or 1/8 costs a fraction of a full decode and the
resize after it shrinks with it (`tools/bench_decode.py` measures each step). The
pipeline says how small a frame may get (`MinSize`, from the model's input, or from
its tiles), and `JpegDecoder` picks the largest reduction that keeps the frame at
least that large.

An MJPEG video, stream or camera decoded on the CPU is read as JPEG packets (FFmpeg's
raw mode, V4L2's unconverted buffers) and decoded by `cv2.imdecode`, reduced or
whole, on the side that takes the frame. Whole, libjpeg-turbo is no slower than
FFmpeg's own MJPEG decoder (640x480: 0.67 against 0.74 ms, `tools/bench_decode.py`),
and a source that drops frames (a camera, a file played in realtime) then never
decodes the ones it drops: 16 realtime streams offered twice what two cores take
delivered 314-338 FPS this way against 268-277 with FFmpeg decoding every frame.
Only a hardware decoder keeps the frames: it decodes for nothing.

Hardware video decode is asked of OpenCV's FFmpeg where it has one; when it has
none, or it fails, the video is decoded on the CPU and the source says so, as a
compile says which device it fell back from. It never fails a source.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent import MAX_IMAGE_PIXELS
from edge_agent.input_files import FileTooLargeError, InputFileError, read_bounded
from edge_agent.pipelines.base import SourceError
from edge_agent.quiet import native_stderr_held

Image = npt.NDArray[np.uint8]
Size = tuple[int, int]
"""(width, height) in pixels."""

MinSize = Callable[[Size], Size]
"""Given a frame's full (width, height), the smallest decoded size the pipeline can use."""

REDUCTIONS = (8, 4, 2)
_FLAGS = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}
# SOFn markers carry the image size; C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_HW_NAMES = {
    cv2.VIDEO_ACCELERATION_D3D11: "d3d11",
    cv2.VIDEO_ACCELERATION_VAAPI: "vaapi",
    cv2.VIDEO_ACCELERATION_MFX: "mfx",
}
_MJPG = int.from_bytes(b"MJPG", "little")

REDUCED_DECODE_DOC = (
    "Decode JPEG frames (a folder's images, an MJPEG file, camera or stream) at 1/2, 1/4 "
    "or 1/8 when the model's input (or its tiles) needs no more; results stay in the "
    "camera's pixels. false decodes every frame whole."
)
"""The description of every video source spec's `reduced_decode`."""


def min_size_for_fit(
    model_size: Size, fit: Literal["letterbox", "stretch", "crop"] = "stretch"
) -> MinSize:
    """What one model input of `model_size` needs of a frame, for each way of fitting it.

    stretch needs both sides at least the model's; letterbox needs the frame at least as
    large as its image inside the input; crop, as large as the part it keeps.
    """
    width, height = model_size

    def need(full: Size) -> Size:
        if fit == "stretch":
            return width, height
        pick = min if fit == "letterbox" else max
        scale = pick(width / full[0], height / full[1])
        return math.ceil(full[0] * scale), math.ceil(full[1] * scale)

    return need


def min_size_for_tiles(model_side: int, tile: int | None) -> MinSize:
    """What square tiles of `tile` frame pixels need, each fed at `model_side` pixels;
    `tile` None is half the frame's height, as `[detect]` defaults it."""

    def need(full: Size) -> Size:
        scale = model_side / (tile or max(1, full[1] // 2))
        return math.ceil(full[0] * scale), math.ceil(full[1] * scale)

    return need


def reduction_for(full: Size, need: Size) -> int:
    """The largest of 8, 4, 2 whose decode (ceil(side / k), as libjpeg gives) still holds
    `need`; 1 when none does."""
    for k in REDUCTIONS:
        if math.ceil(full[0] / k) >= need[0] and math.ceil(full[1] / k) >= need[1]:
            return k
    return 1


def jpeg_size(data: npt.NDArray[np.uint8]) -> Size | None:
    """(width, height) from a JPEG's frame header, without decoding; None if not a JPEG."""
    raw = data.reshape(-1).data  # a memoryview: indexing it gives ints, not numpy scalars
    end = len(raw)
    if end < 4 or raw[0] != 0xFF or raw[1] != 0xD8:
        return None
    pos = 2
    while pos + 9 < end:
        if raw[pos] != 0xFF:
            return None
        marker = raw[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker in _SOF:
            height = raw[pos + 5] << 8 | raw[pos + 6]
            width = raw[pos + 7] << 8 | raw[pos + 8]
            return (width, height) if width and height else None
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        pos += 2 + (raw[pos + 2] << 8 | raw[pos + 3])
    return None


class JpegDecoder:
    """Decodes JPEG bytes at the largest reduction the pipeline's `MinSize` allows.

    Args:
        min_size: what the pipeline needs of a frame; None decodes every frame whole.
    """

    def __init__(self, min_size: MinSize | None) -> None:
        self._min_size = min_size
        self._chosen: dict[Size, int] = {}
        self.scale = 1
        """The reduction of the last frame decoded: its pixels times this are the original's."""

    @property
    def enabled(self) -> bool:
        """Whether the pipeline allows any reduction at all."""
        return self._min_size is not None

    def reduction(self, full: Size) -> int:
        """The reduction for frames of `full` size (1, 2, 4 or 8)."""
        if self._min_size is None or full[0] <= 0 or full[1] <= 0:
            return 1
        found = self._chosen.get(full)
        if found is None:
            found = self._chosen[full] = reduction_for(full, self._min_size(full))
        return found

    def decode(self, data: npt.NDArray[np.uint8]) -> Image | None:
        """The decoded BGR frame (None if the bytes do not decode); sets `scale`."""
        size = jpeg_size(data)
        if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
            # A corrupt header in a stream: whole, OpenCV refused it; reduced, the bogus size
            # divided by 8 fit, and a 7500 x 7500 frame (168 MB) went down the pipeline.
            return None
        k = self.reduction(size) if size is not None else 1
        try:
            image = cv2.imdecode(data.reshape(-1), _FLAGS[k])
        except cv2.error:
            # It raises, not returns None, for some corrupt headers: out of `read()`, that
            # ended the pipeline as a crash for one bad packet of a live camera.
            return None
        if image is None:
            return None
        self.scale = k
        return np.asarray(image, dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class Decoding:
    """How a source turns its bytes into frames, for its state and the start line."""

    hw: str
    """'cpu', or the hardware decoder's name (vaapi, d3d11, mfx)."""
    note: str
    """Why it decodes where it does, when that is not what was asked; '' otherwise."""
    scale: int
    """1, or the JPEG reduction in use (2, 4, 8): frame pixels times it are the camera's."""

    def text(self) -> str:
        """'decode on cpu at 1/4 (hw decode: none available, decoding on CPU)'."""
        line = f"decode on {self.hw}" + (f" at 1/{self.scale}" if self.scale > 1 else "")
        return f"{line} ({self.note})" if self.note else line


def open_capture(
    target: str,
    params: list[int],
    hw_decode: bool,
    worth_plain: Callable[[], bool] = lambda: True,
) -> tuple[cv2.VideoCapture, str, str]:
    """Open `target` with FFmpeg, asking for hardware decode first when `hw_decode`.

    Args:
        worth_plain: asked when the open with hardware decode failed: whether to open
            again without it (a stream whose host is down would fail twice, each open up
            to its timeout, on every reconnect).

    Returns:
        The capture (check `isOpened()`), the decoder in use ('cpu' or a hardware
        name), and a note when hardware decode was asked for and is not in use.
    """
    if hw_decode:
        asked = [*params, cv2.CAP_PROP_HW_ACCELERATION, cv2.VIDEO_ACCELERATION_ANY]
        try:
            cap = cv2.VideoCapture(target, cv2.CAP_FFMPEG, asked)
        except cv2.error:
            cap = None
        if cap is not None and cap.isOpened():
            return cap, *hw_in_use(cap, asked=True)
        if cap is not None:
            cap.release()
        if not worth_plain():
            return cv2.VideoCapture(), "cpu", ""  # not opened: the caller says why
        # Opening with the request failed where a plain open may not: never fail for it.
        cap = cv2.VideoCapture(target, cv2.CAP_FFMPEG, params)
        return cap, "cpu", "hw decode: failed to start, decoding on CPU"
    return cv2.VideoCapture(target, cv2.CAP_FFMPEG, params), "cpu", ""


def require_utf8_path(path: Path) -> None:
    """Refuse a file name that is not valid UTF-8 before OpenCV is handed it.

    cv2.VideoCapture takes only a path, and converts it to UTF-8 on the way in: a name
    that is not (written under another locale, or mangled by a copy) kills the process
    with a segfault instead of failing the open. Cameras and URLs never come here.

    Raises:
        SourceError: input.invalid, naming the file as Python shows it.
    """
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(
            f"video file name {str(path)!r} is not valid UTF-8, which OpenCV cannot open",
            fix="rename the file (or its folder) to a UTF-8 name, e.g. with `convmv` or `mv`",
            code="input.invalid",
        ) from None


IMAGE_UNDECODABLE = "not an image OpenCV decodes (another format, or corrupt)"
IMAGE_TOO_LARGE = "too large to decode (over 2^26 pixels, OPENCV_IO_MAX_IMAGE_PIXELS)"

MAX_IMAGE_FILE_BYTES = 64 << 20
"""The largest image file read. A camera's JPEG is a few MB, and a 4K frame stored raw
(BMP, 8-bit TIFF) 25 MB, 50 MB at 16 bits: a file past this is not a frame, and reading
it whole held all of it in memory (a 1 GiB file in a folder source took the agent to
1.2 GB, and again after every restart, since the pipeline is restored)."""
IMAGE_FILE_TOO_LARGE = f"over {MAX_IMAGE_FILE_BYTES >> 20} MiB, larger than any camera image"


class _UndecodableError(Exception):
    """Raised inside the stderr hold so that what the codec printed is dropped."""


def decode_image(
    data: npt.NDArray[np.uint8], decode: Callable[[Image], Image | None] | None = None
) -> tuple[Image | None, str]:
    """Decode the bytes of an image file as BGR; on failure, None and why.

    Args:
        data: the whole file, as uint8.
        decode: how to decode (a `JpegDecoder.decode`, to reduce a JPEG); whole by default.

    Returns:
        The image and '', or None and the reason (`IMAGE_UNDECODABLE`, `IMAGE_TOO_LARGE`,
        'empty file'). Never raises for bad bytes: a folder skips the file, `infer` says why.
    """
    if data.size == 0:
        return None, "empty file"
    try:
        # libjpeg and libpng print their complaints on fd 2; the reason says it in one line.
        with native_stderr_held():
            if decode is None:
                image = cv2.imdecode(data.reshape(-1), cv2.IMREAD_COLOR)
            else:
                image = decode(data)
            if image is None:
                raise _UndecodableError
    except _UndecodableError:
        return None, IMAGE_UNDECODABLE
    except cv2.error as exc:
        # OpenCV raises rather than returning None for a header declaring more pixels than
        # it allows: a 40000 x 40000 PNG is 1.5 MB on disk. That is a bad file like any other.
        return None, IMAGE_TOO_LARGE if "CV_IO_MAX_IMAGE" in str(exc) else IMAGE_UNDECODABLE
    return np.asarray(image, dtype=np.uint8), ""


def read_image_file(
    path: Path, decode: Callable[[Image], Image | None] | None = None
) -> tuple[Image | None, str]:
    """Read and decode one image file, never more than `MAX_IMAGE_FILE_BYTES` of it.

    Args:
        path: the file.
        decode: as for `decode_image`.

    Returns:
        The image and '', or None and why (`decode_image`'s reasons, `IMAGE_FILE_TOO_LARGE`,
        or why it cannot be read). Never raises for a bad file: a folder skips it.
    """
    try:
        data = read_bounded(path, MAX_IMAGE_FILE_BYTES)
    except FileTooLargeError:
        return None, IMAGE_FILE_TOO_LARGE
    except InputFileError as exc:
        return None, f"cannot read it: {exc}"
    except OSError as exc:
        return None, f"cannot read it: {exc.strerror or exc}"
    return decode_image(np.frombuffer(data, dtype=np.uint8), decode)


def hw_in_use(cap: cv2.VideoCapture, asked: bool) -> tuple[str, str]:
    """The decoder an open capture uses ('cpu' or a hardware name), and a note when
    hardware decode was `asked` for and is not in use."""
    used = int(cap.get(cv2.CAP_PROP_HW_ACCELERATION))
    if used in _HW_NAMES:
        return _HW_NAMES[used], ""
    return "cpu", "hw decode: none available, decoding on CPU" if asked else ""


def capture_size(cap: cv2.VideoCapture) -> Size:
    """The frame size a capture announces; (0, 0) when it does not say."""
    width, height = cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)
    ok = math.isfinite(width) and math.isfinite(height)
    return (int(width), int(height)) if ok else (0, 0)


def read_packets(
    cap: cv2.VideoCapture, decoder: JpegDecoder, v4l2: bool = False, hw: str = "cpu"
) -> bool:
    """Switch an MJPEG capture to hand out JPEG packets, unless hardware decodes it whole.

    Args:
        cap: an open capture.
        decoder: the decoder whose reduction decides.
        v4l2: a V4L2 camera (raw buffers come with CONVERT_RGB off) rather than FFmpeg
            (raw packets come with FORMAT -1).
        hw: the capture's decoder, as `open_capture` says: with a hardware one, frames
            are decoded there unless a reduction applies.

    Returns:
        Whether `read()` now gives packets (1 x N uint8) to pass to `decoder.decode`.
    """
    if int(cap.get(cv2.CAP_PROP_FOURCC)) != _MJPG:
        return False
    if hw != "cpu" and decoder.reduction(capture_size(cap)) < 2:
        return False
    if v4l2:
        return bool(cap.set(cv2.CAP_PROP_CONVERT_RGB, 0))
    return bool(cap.set(cv2.CAP_PROP_FORMAT, -1))


def is_packet(data: npt.NDArray[Any]) -> bool:
    """A compressed packet (one row of bytes) rather than a decoded H x W x 3 frame."""
    return data.ndim == 1 or (data.ndim == 2 and data.shape[0] == 1)
