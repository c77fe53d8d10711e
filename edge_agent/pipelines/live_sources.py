"""Live frame sources: a reader thread, latest-frame hand-off, reconnect and give-up.

Cameras and network streams run faster than a busy consumer and fail in ways a
file never does: cables are pulled, cameras reboot, NAT mappings die silently.
`LiveSource` hides all of that behind `FrameSource.read()`, and tells the
pipeline what is happening through `status` and the `on_state` callback.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Self
from urllib.parse import urlsplit

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.logs import Throttle, log_event
from edge_agent.pipelines.base import Frame, SourceError
from edge_agent.pipelines.decode import (
    REDUCED_DECODE_DOC,
    Decoding,
    JpegDecoder,
    capture_size,
    hw_in_use,
    is_packet,
)

log = logging.getLogger(__name__)

StateCallback = Callable[[str, str], None]
"""on_state(state, detail): state is "connecting", "live", "reconnecting" or "failed"."""

# How long close() waits for the reader thread; a read blocked in the backend ends by
# itself within stall_timeout_s, and the thread releases the device when it does.
_JOIN_S = 2.0
_STABLE_S = 10.0
"""A connection whose frames spanned this long starts the reconnect backoff again."""


class LiveSpec(BaseModel):
    """What cameras and streams share: rate cap, reconnect backoff and give-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fps_cap: float | None = Field(
        None, gt=0, description="Deliver at most this many frames per second; None for all."
    )
    reconnect_min_s: float = Field(
        0.5, gt=0, description="First wait before reconnecting; doubles after each failure."
    )
    reconnect_max_s: float = Field(10.0, gt=0, description="Longest wait between reconnects.")
    give_up_after_s: float = Field(
        30.0, gt=0, description="Fail with a SourceError after this long without a frame."
    )
    stall_timeout_s: float = Field(
        5.0, gt=0, description="An open feed that sends no frame for this long counts as lost."
    )
    reduced_decode: bool = Field(True, description=REDUCED_DECODE_DOC)

    @model_validator(mode="after")
    def _backoff_in_order(self) -> Self:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be at least reconnect_min_s")
        return self


class FeedUnavailableError(Exception):
    """Raised by a connect function: the feed cannot be opened now; the message says why."""


class LiveSource:
    """A camera or stream read by a thread that keeps only the latest frame.

    The consumer's `read()` blocks for the next frame, but never longer than the
    give-up time: the reader reconnects on loss or stall with exponential backoff,
    and reports "failed" (and `read()` raises) after `give_up_after_s` without a frame.
    `on_state` is called from the reader thread; it must not block.

    A feed switched to JPEG packets (`decode.read_packets`: MJPEG decoded on the CPU)
    hands over the packet, and `read()` decodes it with `decoder`, reduced or whole, on
    the consumer's thread, so frames that are replaced before they are taken are never
    decoded.

    `pipeline`, when given, is on every line the source logs: a journal that said only
    `source="stream http://..."` did not say which pipeline had lost its camera.
    """

    interruptible = True
    """close() from another thread ends a blocked read() (FrameSource)."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], cv2.VideoCapture],
        spec: LiveSpec,
        fix: str,
        on_state: StateCallback | None = None,
        decoder: JpegDecoder | None = None,
        hw_decode: bool = False,
        pipeline: str | None = None,
    ) -> None:
        self._name = name
        self._ids: dict[str, object] = {"pipeline": pipeline} if pipeline else {}
        self._decoder = decoder or JpegDecoder(None)
        self._hw_decode = hw_decode
        self._hw, self._hw_note, self._packets = "cpu", "", False
        self._connect = connect
        self._spec = spec
        self._fix = fix
        self._on_state = on_state
        self._cond = threading.Condition()
        self._latest: Frame | None = None
        self._error: SourceError | None = None
        self._closed = False
        self._status = "connecting"
        self._detail = "not connected yet"
        self._dropped = self._capped = self._reconnects = self._received = self._corrupt = 0
        self._corrupt_said = Throttle(60.0)
        self._opened = time.monotonic()
        self._last_decoded = self._opened  # the consumer's: when a packet last decoded
        self._last_frame = self._opened
        self._live_since = self._opened  # when the current connection's first frame came
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"source:{name}", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Frames replaced by a newer one before the consumer took them."""
        return self._dropped

    @property
    def capped(self) -> int:
        """Frames skipped to keep under fps_cap."""
        return self._capped

    @property
    def reconnects(self) -> int:
        """Times the feed came back after being lost."""
        return self._reconnects

    @property
    def status(self) -> str:
        """One of connecting, live, reconnecting, failed."""
        return self._status

    @property
    def loss_code(self) -> str:
        """The code of losing the feed now: never a frame, it could not be reached; frames,
        then none, it failed."""
        return "source.failed" if self._received else "source.unreachable"

    @property
    def decoding(self) -> Decoding:
        """Where and at what scale the current connection's frames are decoded."""
        return Decoding(self._hw, self._hw_note, self._decoder.scale if self._packets else 1)

    def read(self) -> Frame | None:
        """The latest frame, waiting for one if need be; None once closed.

        Raises:
            SourceError: no frame for give_up_after_s; the source has stopped trying. A
                feed whose packets all fail to decode for that long counts as none.
        """
        while True:
            frame = self._take()
            if frame is None:
                break
            if not is_packet(frame.image):
                return frame
            start = time.perf_counter()
            image = self._decoder.decode(frame.image)
            now = time.monotonic()
            if image is not None:
                self._last_decoded = now
                read_s = frame.read_s + time.perf_counter() - start
                return dataclasses.replace(
                    frame, image=image, read_s=read_s, scale=self._decoder.scale
                )
            with self._cond:
                self._dropped += 1  # a corrupt packet: lost, as a late frame is
                self._corrupt += 1
            if self._corrupt_said.ready(self._name):
                log_event(
                    log,
                    logging.WARNING,
                    "source_corrupt_frame",
                    **self._ids,
                    source=self._name,
                    corrupt_total=self._corrupt,
                )
            # Packets kept coming, so the reader's give-up (keyed to them) never came: a
            # camera cutting every JPEG short froze its pipeline, "live", for ever.
            if now - self._last_decoded > self._spec.give_up_after_s:
                self._fail("every frame it sent was a corrupt JPEG")
                break
        if self._closed:
            return None
        if self._error is None:
            self._fail(f"reader blocked in the backend; last problem: {self._detail}")
        assert self._error is not None
        raise self._error

    def _take(self) -> Frame | None:
        """The frame (or packet) in the slot, waiting for one; None when closed or failed."""
        # Backstop for a reader wedged in a native call that ignores its timeout: past the
        # longest connect (two opens with hardware decode asked, each up to the stall
        # timeout, and the reachability check), so a dead camera fails in its own words.
        opens = 2 if self._hw_decode else 1
        grace = opens * self._spec.stall_timeout_s + _PROBE_S + 2.0
        with self._cond:
            while self._latest is None and self._error is None and not self._closed:
                left = self._last_frame + self._spec.give_up_after_s + grace - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            if self._closed:
                return None
            frame, self._latest = self._latest, None
            return frame

    def close(self) -> None:
        """Stop the reader thread and release the device; safe to call twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._latest = None
            self._cond.notify_all()
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=_JOIN_S)
            if self._thread.is_alive():
                log_event(
                    log,
                    logging.WARNING,
                    "source_close_pending",
                    **self._ids,
                    source=self._name,
                    reason="read_blocked",
                )

    def _set_state(self, state: str, detail: str) -> None:
        with self._cond:
            if self._status == state:
                return
            self._status = state
        level = logging.INFO if state == "live" else logging.WARNING
        log_event(log, level, f"source_{state}", **self._ids, source=self._name, detail=detail)
        if self._on_state is not None:
            try:
                self._on_state(state, detail)
            except Exception:
                # A broken listener must not stop the video; its bug keeps its traceback.
                log.exception("source=%s on_state listener failed", self._name)

    def _fail(self, detail: str) -> None:
        error = SourceError(
            f"{self._name}: no frame for {self._spec.give_up_after_s:g} s, giving up ({detail})",
            fix=self._fix,
            code=self.loss_code,
        )
        self._stop.set()
        # State first, so a listener hears "failed" before read() raises.
        self._set_state("failed", detail)
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            self._reconnect_loop()
        except BaseException as exc:
            # A bug, not a feed problem: fail the source so read() does not wait for the
            # backstop, and re-raise so the traceback is printed.
            self._fail(f"reader thread crashed: {exc!r}")
            raise

    def _reconnect_loop(self) -> None:
        spec = self._spec
        delay = spec.reconnect_min_s
        while not self._stop.is_set():
            try:
                cap = self._connect()
            except (FeedUnavailableError, cv2.error) as exc:
                self._detail = str(exc)
            else:
                try:
                    # A feed that stayed up a while came back; one that hangs up after a
                    # frame or two (a camera at its session limit, or dying) did not. One
                    # frame once reset the wait, and such a camera was reconnected (and
                    # reported lost upstream) ten times a second, for ever.
                    if self._pump(cap) and self._last_frame - self._live_since >= _STABLE_S:
                        delay = spec.reconnect_min_s
                finally:
                    cap.release()
            if self._stop.is_set():
                return
            left = self._last_frame + spec.give_up_after_s - time.monotonic()
            if left <= 0:
                self._fail(self._detail)
                return
            self._set_state("reconnecting", self._detail)
            if self._stop.wait(min(delay, left)):
                return
            if delay >= left:
                # The give-up came during the wait: one more connect started at the deadline
                # ran past the read's backstop (a dead host: two opens and a probe), and the
                # error blamed a wedged backend, 7 s late.
                self._fail(self._detail)
                return
            delay = min(delay * 2, spec.reconnect_max_s)

    def _pump(self, cap: cv2.VideoCapture) -> bool:
        """Read frames until the feed ends, stalls or the source closes.

        Returns:
            Whether any frame came through on this connection.
        """
        interval = 1.0 / self._spec.fps_cap if self._spec.fps_cap else 0.0
        due = 0.0
        got = False
        self._hw, self._hw_note = hw_in_use(cap, self._hw_decode)
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                ok, image = cap.read()
            except cv2.error as exc:
                # Corrupt packets can surface as exceptions in some backends: a loss too.
                ok, image = False, None
                log_event(
                    log,
                    logging.WARNING,
                    "source_read_error",
                    **self._ids,
                    source=self._name,
                    error=str(exc),
                )
            read_s = time.perf_counter() - start
            if not ok or image is None:
                self._detail = (
                    f"feed ended or sent nothing for {self._spec.stall_timeout_s:g} s"
                    if got
                    else "opened but sent no frame"
                )
                return got
            now = time.monotonic()
            index = self._received
            self._received += 1
            with self._cond:
                self._last_frame = now
            if not got:
                got = True
                self._live_since = now
                if self._status == "reconnecting" and self._received > 1:
                    self._reconnects += 1
                self._packets = is_packet(image)
                width, height = capture_size(cap) if self._packets else image.shape[1::-1]
                self._set_state("live", f"frames flowing ({width}x{height})")
            if interval:
                if now < due:
                    self._capped += 1
                    continue
                # Schedule, not "interval since the last one": jitter would pull the rate
                # under the cap. After a gap, restart the schedule instead of bursting.
                due = due + interval if due + interval > now else now + interval
            pixels = np.asarray(image, dtype=np.uint8)
            frame = Frame(index=index, ts=now - self._opened, image=pixels, read_s=read_s)
            with self._cond:
                if self._latest is not None:
                    self._dropped += 1
                self._latest = frame
                self._cond.notify()
        return got


_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}
_PROBE_S = 2.0
"""The longest `unreachable` waits for its TCP connect."""


def unreachable(url: str, timeout_s: float) -> str | None:
    """Why `url`'s host cannot be reached, in words, from one TCP connect (FFmpeg's log is
    muted); None when it answers."""
    host, port = _host_port(url)
    if port is None:
        return "the URL's port is not a number"
    try:
        with socket.create_connection((host, port), timeout=min(timeout_s, _PROBE_S)):
            pass
    except socket.gaierror:
        return f"host {host!r} does not resolve"
    except UnicodeError:
        return f"host {host!r} is not a valid name"
    except TimeoutError:
        return f"no answer from {host}:{port} (host down or firewalled)"
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            return f"connection refused by {host}:{port} (nothing listening there)"
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"
    return None


def answers_but_no_stream(url: str) -> str:
    """What is left to blame when `url`'s host answers and FFmpeg still cannot open it."""
    host, port = _host_port(url)
    # A 401 from a camera whose password changed looks the same from here as a 404.
    return (
        f"{host}:{port} answers, but sends no stream FFmpeg reads (check the path, the format "
        "and the credentials in the URL)"
    )


def _host_port(url: str) -> tuple[str, int | None]:
    """The host and port a URL connects to (None: its port is not a number)."""
    parts = urlsplit(url)
    try:
        return parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 80)
    except ValueError:
        return parts.hostname or "", None
