"""A broker that keeps its retained messages over a restart, and one cleared while away.

For the clients that hold what retained messages told them (the console's roster, a
fleet server's peers) across their own reconnect: a second mosquitto on the same database
clears one retained message while the clients' broker is down, so when they are back the
broker holds exactly what the test says, whatever their reconnect timing.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from edge_agent.comms.local_broker import LocalBroker


def persisted(db: Path) -> str:
    """mosquitto config lines that keep its retained messages in `db`."""
    return f"persistence true\npersistence_location {db}/\n"


@contextmanager
def kept_broker(folder: Path) -> Iterator[LocalBroker]:
    """A broker that keeps its retained messages over a restart, in `folder/db`."""
    (folder / "db").mkdir()
    (folder / "broker").mkdir()
    with LocalBroker(folder=folder / "broker", extra_config=persisted(folder / "db")) as running:
        yield running


def cleared_while_away(broker: LocalBroker, topic: str) -> None:
    """Stop `broker` (of `kept_broker`), clear its retained `topic`, start it again."""
    broker.stop()  # SIGTERM: mosquitto writes its database
    db = broker.folder.parent / "db"
    side = broker.folder.parent / "side"
    side.mkdir(exist_ok=True)
    with LocalBroker(folder=side, extra_config=persisted(db)) as other:
        done = subprocess.run(
            ["mosquitto_pub", "-p", str(other.port), "-q", "1", "-r", "-n", "-t", topic],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    broker.start()


def until(what: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait for `what` to hold, failing the test past `timeout`."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)
