"""The topic filters a persistent MQTT session holds, kept on disk for the next process.

A persistent session outlives the process that made it: the broker keeps every filter
subscribed until it hears an UNSUBSCRIBE. A process that dies in the middle of a pull
(OOM kill, power cut, `kill -9`) leaves the pull's chunk filter in its session, and MQTT
gives the next process no way to list it, so the broker goes on sending those frames
for as long as other boxes pull. This file is how the next process learns them: the
session (`MqttSession(held=...)`) saves the filters it holds whenever they change, and
unsubscribes the ones its successor does not subscribe again.

Best effort by design: a file that is missing, unreadable or garbled only loses that
clean-up, never the session, so it is written without fsync (a rename of a whole file,
which survives a crash of the process; after a power cut it may be old or empty).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from edge_agent.logs import Throttle, log_event

log = logging.getLogger(__name__)

MAX_FILTERS = 512
"""More than a session ever holds (a few permanent filters, one per pull, 256 let go of)."""
_MAX_FILTER_BYTES = 65535  # MQTT's limit on a topic filter
_WARN_EVERY_S = 60.0


def is_valid_filter(topic_filter: object) -> bool:
    """Whether a broker takes `topic_filter` in an UNSUBSCRIBE (MQTT 5 section 4.7).

    Strict UTF-8 without NUL, at most 65535 bytes, `#` only as the whole last level and
    `+` only as a whole level. A filter read back from disk is checked with this before it
    goes to paho: a malformed one makes the broker drop the connection on every connect,
    and one that is not UTF-8 raises inside paho's network loop.
    """
    if not isinstance(topic_filter, str) or not topic_filter or "\0" in topic_filter:
        return False
    try:
        size = len(topic_filter.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, which JSON can carry
        return False
    if size > _MAX_FILTER_BYTES:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


class HeldFilters:
    """Loads and saves the list of filters in one small JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._not_saved = Throttle(_WARN_EVERY_S)

    def load(self) -> list[str]:
        """The filters the last process saved; empty when there is no usable file."""
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log_event(
                log,
                logging.WARNING,
                "mqtt.held_filters_unreadable",
                path=str(self.path),
                error=str(exc),
            )
            return []
        if not isinstance(data, list):
            log_event(
                log,
                logging.WARNING,
                "mqtt.held_filters_unreadable",
                path=str(self.path),
                error="not a list",
            )
            return []
        valid = [f for f in data if is_valid_filter(f)]
        if len(valid) < len(data):
            log_event(
                log,
                logging.WARNING,
                "mqtt.held_filters_invalid",
                path=str(self.path),
                skipped=len(data) - len(valid),
            )
        return list(dict.fromkeys(valid))[:MAX_FILTERS]

    def save(self, filters: list[str]) -> None:
        """Replace the file with `filters`; a disk that refuses is logged, never raised."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(filters[:MAX_FILTERS]), encoding="utf-8")
            tmp.replace(self.path)
        except (OSError, ValueError) as exc:  # ValueError: a filter that is not UTF-8
            if self._not_saved.ready():
                log_event(
                    log,
                    logging.WARNING,
                    "mqtt.held_filters_not_saved",
                    path=str(self.path),
                    error=str(exc),
                )
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
