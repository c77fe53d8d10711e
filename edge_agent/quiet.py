"""Keep native libraries' chatter off the operator's screen when we handle the error.

OpenVINO's TF frontend (through absl) and OpenCV write straight to file
descriptor 2 when they fail to parse a file. We turn those failures into one
clear line, so their raw logs would only bury it. Captured output is written
back when the call succeeds, so nothing is lost on the good path.

OpenCV's own log and FFmpeg's (`[tcp @ 0x...] Connection refused`, `VIDEOIO(FFMPEG)`,
`[mjpeg @ ...] overread`) are muted outright by `mute_video_logs`: sources say
what went wrong once, in our words, through logging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any, TextIO

_mute_lock = threading.Lock()
_muted = False


def mute_video_logs() -> None:
    """Silence OpenCV's and FFmpeg's logs for the rest of the process; idempotent.

    Call it before the first video is opened: OpenCV reads FFmpeg's level once, when
    its FFmpeg backend first starts. A level the operator set in the environment
    (OPENCV_LOG_LEVEL, OPENCV_FFMPEG_LOGLEVEL) is left alone, for debugging.
    """
    global _muted
    with _mute_lock:
        if _muted:
            return
        _muted = True
        # -8 is AV_LOG_QUIET.
        os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")
        if "OPENCV_LOG_LEVEL" not in os.environ:
            import cv2  # here, not at the top: the runtime uses this module without video

            cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)


# fd 2 is one per process, but every pipeline's decode and every model compile holds it, from
# their own threads. Swapping it per call without a lock let holds interleave (A saves the
# real fd 2, B saves A's temporary file as its "original", A restores, B restores A's file),
# leaving fd 2 on a deleted temporary file for good: every later log line was lost. So the
# holds share one redirection: the first holder in points fd 2 at one temporary file, the
# last one out points it back at the real fd 2, and all of it happens under `_hold_lock`.
#
# Each holder owns the bytes written to the file while it was inside (its window, by file
# offset). Text is settled up to where the oldest holder still inside came in: what lies in
# the window of a holder that raised is dropped (it may be that holder's chatter; when holds
# overlap, whose it was cannot be told, so a failure wins), the rest goes to the real fd 2.
_hold_lock = threading.Lock()
_holders: dict[object, int] = {}
"""Holders inside, each with the file offset it came in at."""
_dropped: list[tuple[int, int]] = []
"""Windows of holders that raised, not yet settled past."""
_settled = 0
"""The offset up to which the file has been written out or dropped."""
_held: IO[bytes] | None = None
"""The temporary file fd 2 points at while anyone holds it."""
_real_fd: int | None = None
"""A dup of the real fd 2, refreshed by each first holder; kept for the process, never closed."""
_real_stream: TextIO | None = None
"""Text stream on `_real_fd`; never closed, so a writer that raced the restore cannot fail."""
_swapped: list[tuple[logging.StreamHandler[Any], TextIO]] = []
"""Log handlers rerouted to `_real_stream`, with the stream each had."""
_stderr_old: TextIO | None = None
"""The sys.stderr that `_real_stream` stands in for during a hold."""


def _writes_fd2(stream: object) -> bool:
    try:
        return stream is not None and stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def _stream_handlers() -> list[logging.StreamHandler[Any]]:
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [
        lg
        for lg in list(logging.Logger.manager.loggerDict.values())
        if isinstance(lg, logging.Logger)
    ]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, logging.StreamHandler)]


def _reroute_python(real: TextIO) -> None:
    """Point Python's own writers on fd 2 at the real stderr for the hold.

    Python-level text (logging's StreamHandler, which `setup_logging` binds to the sys.stderr
    object, print to sys.stderr, tracebacks) is ours, not native chatter: it must neither wait
    for the hold to end nor be dropped with a failed hold's window. The sys.stderr object
    writes to fd 2 by number and its fd cannot be changed, so the handlers that write to fd 2
    get `real` through setStream (under their own lock, so no line is split), and sys.stderr is
    rebound to `real` when it is the one on fd 2. A writer that took the old object before this
    (a line half-way through `print`) still lands in the held file: replayed, or dropped with
    an overlapping failure. That is the remaining limit.
    """
    global _stderr_old
    for handler in _stream_handlers():
        if handler.stream is not real and _writes_fd2(handler.stream):
            old = handler.setStream(real)
            if old is not None:
                _swapped.append((handler, old))
    if sys.stderr is not real and _writes_fd2(sys.stderr):
        sys.stderr.flush()
        _stderr_old, sys.stderr = sys.stderr, real


def _restore_python(real: TextIO) -> None:
    """Undo `_reroute_python`, except where someone has set another stream meanwhile.

    A handler made during the hold (`setup_logging` again) keeps `real`, a dup of the same fd
    2, which is harmless.
    """
    global _stderr_old
    for handler, old in _swapped:
        if handler.stream is real:
            handler.setStream(old)
    _swapped.clear()
    if _stderr_old is not None and sys.stderr is real:
        sys.stderr = _stderr_old
    _stderr_old = None
    with contextlib.suppress(ValueError, OSError):
        real.flush()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _settle(upto: int) -> None:
    """Write out [_settled, upto) bar the dropped windows; forget windows settled past."""
    global _settled
    assert _held is not None
    assert _real_fd is not None
    start = _settled
    for lo, hi in sorted(_dropped):
        if hi <= start or lo >= upto:
            continue
        if lo > start:
            _write_all(_real_fd, os.pread(_held.fileno(), lo - start, start))
        start = max(start, hi)
    if start < upto:
        _write_all(_real_fd, os.pread(_held.fileno(), upto - start, start))
    _settled = max(_settled, upto)
    _dropped[:] = [(lo, hi) for lo, hi in _dropped if hi > _settled]


def _enter(token: object) -> None:
    # The holder is registered before fd 2 is pointed at the file, and the file is known
    # (`_held`) before either: a Ctrl-C raised between any two of these steps leaves state
    # that `_leave`, which native_stderr_held calls whatever happened, undoes. Registered
    # after the redirect, a KeyboardInterrupt just after the dup2 left fd 2 on the deleted
    # file for the rest of the process: the CLI's "interrupted" line went into it.
    global _held, _real_fd, _real_stream, _settled
    with _hold_lock:
        if not _holders:
            with contextlib.suppress(ValueError, OSError):
                sys.stderr.flush()
            if _real_fd is None:
                _real_fd = os.dup(2)
            else:
                os.dup2(
                    2, _real_fd, inheritable=False
                )  # fd 2 may have been pointed elsewhere since (tests do)
            if _real_stream is None:
                encoding = getattr(sys.__stderr__, "encoding", None) or "utf-8"
                _real_stream = open(  # noqa: SIM115 - lives for the process
                    _real_fd,
                    "w",
                    buffering=1,
                    encoding=encoding,
                    errors="backslashreplace",
                    closefd=False,
                )
            _held = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the last holder out
            _settled = 0
            _dropped.clear()
            _holders[token] = 0
            _reroute_python(_real_stream)
            os.dup2(_held.fileno(), 2)
            return
        assert _held is not None
        _holders[token] = os.fstat(_held.fileno()).st_size


def _leave(token: object, failed: bool) -> None:
    global _held
    with _hold_lock:
        try:
            start = _holders.pop(token, None)
            if _held is None or (start is None and _holders):
                return  # never got in (interrupted first), and the hold is not ours to end
            if start is not None and failed:
                _dropped.append((start, os.fstat(_held.fileno()).st_size))
            if _holders:
                _settle(min(_holders.values()))
            elif start is not None:
                _settle(os.fstat(_held.fileno()).st_size)
        finally:
            if not _holders and _held is not None:
                # The last one out: fd 2 is the real one again, whatever else went wrong.
                # (Also a hold interrupted half-way through `_enter`: its file may not
                # have become fd 2 yet, and pointing fd 2 at the real one again is harmless.)
                assert _real_fd is not None
                assert _real_stream is not None
                os.dup2(_real_fd, 2)
                _restore_python(_real_stream)
                _held.close()
                _held = None


@contextlib.contextmanager
def native_stderr_held() -> Iterator[None]:
    """Hold fd 2 output for the duration; replay it on success, drop it on an exception.

    Safe from any number of threads at once (see the comment above `_hold_lock`): fd 2 is
    redirected while anyone holds it and is the real one again when the last holder leaves.
    Text written meanwhile by other threads' native code is held too, and replayed unless it
    falls inside a failed hold; Python's logging goes straight to the real stderr.
    """
    token = object()
    failed = False
    try:
        _enter(token)  # inside the try: a Ctrl-C half-way through is undone by `_leave`
        yield
    except BaseException:
        failed = True
        raise
    finally:
        try:
            _leave(token, failed)
        except BaseException:
            # Interrupted before it took its token out (at its first line, or waiting for
            # the lock): once more, or fd 2 stays on the file. `_leave` is a no-op for a
            # token already out.
            _leave(token, True)
            raise


_stdout_lock = threading.Lock()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout meanwhile to stderr, at both levels.

    NNCF draws rich progress bars on sys.stdout and logs through a handler bound to
    the original sys.stdout at import; native code writes to fd 1. Redirecting fd 1
    catches all of them; redirect_stdout catches Python writers that look it up late.
    Serialised: fd 1 is one per process, so two overlapping redirects would restore
    it in the wrong order.
    """
    with _stdout_lock:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with _hold_lock:
                # Not onto a hold's temporary file, if another thread is holding fd 2.
                os.dup2(_real_fd if _holders and _real_fd is not None else 2, 1)
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            with contextlib.suppress(ValueError, OSError):
                sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
