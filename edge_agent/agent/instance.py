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
import logging
import os
from pathlib import Path

from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import flock_within
from edge_agent.logs import log_event
from edge_agent.paths import Layout

log = logging.getLogger(__name__)

WAIT_S = 2.0
"""How long a start waits for another agent to let go: the one before it may still be
closing (a restart by hand, a test's agent after the last)."""


class StateLock:
    """Held while this process serves the state folder; `release` lets the next one in."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        # A state disk that refuses writes (remounted read-only after an error, full of
        # inodes) must not keep the agent from serving: it runs from memory then, as
        # its records and outbox do, without the lock.
        log_event(
            log,
            logging.WARNING,
            "agent_lock_unavailable",
            path=str(path),
            error=str(exc),
            detail="a second agent on this state folder is not kept out",
        )
        return StateLock(None)
    try:
        if not flock_within(fd, wait_s):
            raise _held_by(path, layout.state)
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
