"""Keep native libraries' chatter off the operator's screen when we handle the error.

OpenVINO's TF frontend (through absl) and OpenCV write straight to file
descriptor 2 when they fail to parse a file. We turn those failures into one
clear line, so their raw logs would only bury it. Captured output is written
back when the call succeeds, so nothing is lost on the good path.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


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
