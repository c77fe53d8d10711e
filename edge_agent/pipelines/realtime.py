"""A video file played as a camera would send it: at its own frame rate, dropping what is late.

Capacity is a question about cameras, which do not wait for anyone: a stream the
box cannot keep up with loses frames, and the number of streams a box takes is the
number at which none are lost. Played in realtime, a file asks that question the
same way on every run. A player thread reads each frame at its due time (the
file's rate, optionally capped) into a one-frame slot; a frame still in the slot
when the next arrives is dropped and counted, exactly as `LiveSource` does. A
frame the player itself is a whole interval late for (the CPU is saturated) is
skipped undecoded, and counted as dropped too: the camera sent it all the same.
Playing starts at the first `read()`, not at open: a pipeline still compiling its
model (or waiting for the other pipelines of its group) has not missed anything.

A JPEG packet (an MJPEG file decoded on the CPU, see `decode`) is decoded by
`read()`, on the consumer's thread, so frames that are dropped are never decoded. `Frame.read_s`
is the frame's age when taken: end-to-end latency counts from its due time, as
it would from a camera's shutter.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from edge_agent.logs import error_text, log_event
from edge_agent.pipelines.base import Frame, SourceError
from edge_agent.pipelines.decode import Decoding, JpegDecoder, MinSize
from edge_agent.pipelines.file_sources import VideoFile

log = logging.getLogger(__name__)

T = TypeVar("T")

_JOIN_S = 2.0
_WAIT_S = 1.0


@dataclass(frozen=True, slots=True)
class _Sent:
    index: int
    due: float
    data: npt.NDArray[np.uint8]


class RealtimeFileSource:
    """A video file played in realtime, optionally looped, with latest-frame hand-off.

    Args:
        path: the video file.
        loop: start again after the last frame instead of ending.
        fps_cap: hand out at most this many frames per second (the rest are `capped`,
            not dropped: they were never wanted).
        min_size: what the pipeline needs of a frame, for reduced JPEG decode.
        hw_decode: ask FFmpeg for hardware decode first.
        phase: seconds after the first `read()` at which the first frame comes due. Files
            started together come due on the same ticks, as cameras never do (each runs
            on its own clock); phases spread over one frame interval play them out of
            step, as separate cameras would be (tools/bench_capacity.py --spread).

    Raises:
        SourceError: the file is missing or FFmpeg cannot open it.
        ValueError: `phase` is negative or not finite.
    """

    interruptible = True
    """close() from another thread ends a blocked read() (FrameSource)."""

    def __init__(
        self,
        path: Path,
        *,
        loop: bool = False,
        fps_cap: float | None = None,
        min_size: MinSize | None = None,
        hw_decode: bool = True,
        phase: float = 0.0,
    ) -> None:
        self.phase = phase
        self._video = VideoFile(path, JpegDecoder(min_size), hw_decode)
        self._loop = loop
        self._interval = 1.0 / self._video.fps
        self._cap_interval = 1.0 / fps_cap if fps_cap else 0.0
        self._cond = threading.Condition()
        self._latest: _Sent | None = None
        self._ended = False
        self._closed = False
        self._error: SourceError | None = None
        self._played = self._dropped = self._capped = self._corrupt = self._loops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._play, name=f"play:{path.name}", daemon=True)

    @property
    def phase(self) -> float:
        """Seconds after the first `read()` at which the first frame comes due; set before
        that read (a group of pipelines builds its sources from specs, then runs them)."""
        return self._phase

    @phase.setter
    def phase(self, seconds: float) -> None:
        if not 0.0 <= seconds < math.inf:  # also refuses NaN
            raise ValueError(f"phase must be 0 or more seconds, not {seconds}")
        self._phase = seconds

    @property
    def fps(self) -> float:
        """The rate the file is played at: its own."""
        return self._video.fps

    @property
    def dropped(self) -> int:
        """Frames lost because the pipeline was not ready for them (or would not decode)."""
        return self._dropped + self._corrupt

    @property
    def played(self) -> int:
        """Frames that came due so far, dropped or not, capped ones excluded."""
        return self._played

    @property
    def capped(self) -> int:
        """Frames skipped to keep under fps_cap."""
        return self._capped

    @property
    def loops(self) -> int:
        """Times the file started again from its first frame."""
        return self._loops

    @property
    def decoding(self) -> Decoding:
        """Where and at what scale frames are decoded."""
        return self._video.decoding

    def read(self) -> Frame | None:
        """The latest frame, waiting for it; None once the file has ended or the source closed.

        Raises:
            SourceError: the file turned out truncated while it played.
        """
        while True:
            with self._cond:
                if self._thread.ident is None and not self._closed:
                    self._thread.start()
                while self._latest is None and not (self._ended or self._closed):
                    self._cond.wait(_WAIT_S)
                if self._closed:
                    return None
                sent, self._latest = self._latest, None
                if sent is None:
                    if self._error is not None:
                        raise self._error
                    return None
            decoded = self._video.decode(sent.data)
            if decoded is None:
                with self._cond:
                    self._corrupt += 1
                continue
            image, scale = decoded
            return Frame(
                index=sent.index,
                ts=sent.index * self._interval,
                image=image,
                read_s=max(0.0, time.monotonic() - sent.due),
                scale=scale,
            )

    def close(self) -> None:
        """Stop playing and release the file; safe to call twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._latest = None
            self._cond.notify_all()
        self._stop.set()
        if self._thread.ident is None:
            self._video.close()  # never played
        elif threading.current_thread() is not self._thread:
            self._thread.join(timeout=_JOIN_S)

    # --- player thread --------------------------------------------------------------
    def _play(self) -> None:
        try:
            self._play_frames()
        except SourceError as exc:
            with self._cond:
                self._error = exc
        except Exception as exc:
            # A bug, not the file: end the source so read() does not wait forever.
            log_event(log, logging.ERROR, "player_crashed", path=str(self._video.path))
            self._error = SourceError(
                f"playing {self._video.path} failed: {error_text(exc)}", code="internal"
            )
            raise
        finally:
            self._video.close()
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def _play_frames(self) -> None:
        start = time.monotonic() + self._phase
        index = 0
        cap_due = 0.0
        # Half a frame of slack: the cap is kept on the file's own clock (offsets from the
        # start, not wall-clock sums), so a frame exactly on the cap's schedule is taken
        # whatever rounding says of `start + 4 * 0.05` against `start + 0.2`.
        slack = self._interval / 2
        while True:
            offset = index * self._interval
            due = start + offset
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            index += 1
            capped = bool(self._cap_interval) and offset < cap_due - slack
            if not capped and self._cap_interval:
                # A schedule, not "an interval since the last one", so jitter does not pull
                # the rate under the cap. The decision reads media time only: which frames
                # are capped never depends on how busy the machine is.
                cap_due = max(cap_due, offset) + self._cap_interval
            # A whole interval late: this thread was starved, and the camera sent it anyway.
            late = time.monotonic() - due >= self._interval
            if capped or late:
                if not self._advance(self._video.skip):
                    return
                if capped:
                    self._capped += 1
                else:
                    self._played += 1
                    with self._cond:
                        self._dropped += 1
                continue
            data = self._advance(self._video.grab)
            if data is None:
                return
            self._played += 1
            with self._cond:
                if self._latest is not None:
                    self._dropped += 1
                self._latest = _Sent(index - 1, due, data)
                self._cond.notify()

    def _advance(self, step: Callable[[], T]) -> T | None:
        """`step` (grab or skip), going round again at the end when looping; None at the end."""
        found = step()
        if (found is None or found is False) and self._loop and self._video.position > 0:
            self._video.rewind()
            self._loops += 1
            found = step()
        return None if found is None or found is False else found
