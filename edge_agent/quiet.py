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
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

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


@contextlib.contextmanager
def native_stderr_held() -> Iterator[None]:
    """Hold fd 2 output for the duration; replay it on success, drop it on an exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)


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
            os.dup2(2, 1)
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            with contextlib.suppress(ValueError, OSError):
                sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
