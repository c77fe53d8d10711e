"""One agent per state folder.

Two agents on one state folder (the service, and one an operator starts by hand to look
at something) share a device id, a record, an outbox and a command log: the broker
hands their one client id back and forth, each taking the other's session; both restore
the recorded pipelines and fight over the cameras; both send the outbox's messages. The
second is refused at its start, naming the first.

An flock, not a pid file: the kernel drops it when its holder dies, so a crashed or
killed agent never keeps the next one out, and no stale pid can be mistaken for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout

WAIT_S = 2.0
"""How long a start waits for another agent to let go: the one before it may still be
closing (a restart by hand, a test's agent after the last)."""


class StateLock:
    """Held while this process serves the state folder; `release` lets the next one in."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    def __del__(self) -> None:
        self.release()


def hold_state(layout: Layout, wait_s: float = WAIT_S) -> StateLock:
    """Take `layout`'s state folder for this agent.

    Args:
        layout: Where the agent keeps its state; its `agent_lock` is taken.
        wait_s: How long to wait for another agent to let go.

    Raises:
        EdgeAgentError: `agent.running`, another agent holds it.
    """
    path = layout.agent_lock
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _held_by(path, layout.state) from None
                time.sleep(0.1)
        # Who holds it, for the next one's error; a failed write only loses that name.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return StateLock(fd)


def _held_by(path: Path, state: Path) -> EdgeAgentError:
    try:
        pid = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    who = f"another edge-agent (pid {pid})" if pid.isdigit() else "another edge-agent"
    return EdgeAgentError(
        f"{who} runs on the state folder {state}",
        "stop it first (systemctl stop edge-agent), or give this one its own state_dir",
        code="agent.running",
    )
