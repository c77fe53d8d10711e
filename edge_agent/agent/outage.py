"""How long a pipeline's source was down, across the runs that retry it.

A camera that goes away is said at once (`source_lost`, and WARNING lines), but its
return was only the source's INFO `source_live`, which the service's journal hides: an
operator paged for the loss could not tell from the journal whether, or when, it came
back. The agent's sink marks the loss, and the pipeline's handle the source's next `live`
(its own word that frames flow again: not the next frame, as frames in the engine at the
loss come out after it, and ended the outage at 0 s while the camera was still gone; a
return within the few milliseconds the loss takes to reach the sink goes unsaid, and the
next one says the whole outage). The retries in between
(each a new run with a new source) share this one record, so the time down is the whole
outage, not the last run's part of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edge_agent.logs import log_event

log = logging.getLogger(__name__)


class SourceOutage:
    """One pipeline's source: lost since when, and why. Thread-safe.

    Args:
        pipeline: The pipeline id, for the log line.
        clock: Monotonic seconds, injectable: a wall clock set by NTP mid-outage would
            make the time down wrong.
    """

    def __init__(self, pipeline: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.pipeline = pipeline
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self._code: str | None = None

    def lost(self, code: str | None) -> None:
        """The source is lost (again): the outage starts now unless it already had."""
        with self._lock:
            if self._since is None:
                self._since = self._clock()
            self._code = code or self._code

    def live(self) -> float | None:
        """The source sends frames (again): log `source_recovered` if it was down.

        Returns:
            Seconds it was down, or None if it was not.
        """
        with self._lock:
            since, self._since = self._since, None
            code, self._code = self._code, None
        if since is None:
            return None
        down_s = round(self._clock() - since, 1)
        # WARNING, as the loss was: the unit's journal hides INFO, and an outage whose end
        # is not in the journal looks like one that never ended.
        log_event(
            log,
            logging.WARNING,
            "source_recovered",
            pipeline=self.pipeline,
            down_s=down_s,
            code=code,
        )
        return down_s
