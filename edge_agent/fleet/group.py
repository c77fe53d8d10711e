"""One command to a whole group: `send_group` sends it on `<prefix>/group/<group>/cmd` and
gathers the answers of every member from `<prefix>/+/resp`, matched by the command's id.

The members are the caller's (`Roster.members`, which knows who is online); this module
only sends and gathers.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from edge_agent.comms.base import Communicator, last_refusal, refusals
from edge_agent.fleet.console import RefusedError, Replies, expiry_seconds, new_command
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import FANIN_QOS, Topics

Outcome = Literal["ok", "error", "timeout", "interrupted"]


@dataclass
class DeviceResult:
    """How one device's part of a group command ended."""

    device: str
    outcome: Outcome
    answer: msg.Response | None = None
    """The final answer (ok or error); None on timeout or interrupted."""
    progress: msg.Progress | None = None
    """The last progress it reported."""
    started: bool = False
    """It answered accepted or progress: without a final answer, it may still be running."""

    @property
    def result(self) -> dict[str, Any]:
        return (self.answer.result if self.answer else None) or {}


OnAnswer = Callable[[msg.Response], None]


def send_group(
    comm: Communicator,
    topics: Topics,
    group: str,
    kind: str,
    args: dict[str, Any] | None,
    members: Iterable[str],
    *,
    timeout: float,
    on_answer: OnAnswer | None = None,
    stop: threading.Event | None = None,
) -> dict[str, DeviceResult]:
    """Send one command to `group` and wait for the final answer of every member.

    Devices outside `members` that answer too (one came online meanwhile) are included.
    An answer counts for the device whose `resp` topic it came on (see `Replies`). When
    `stop` is set first, what came is returned, the devices still waited for
    `interrupted`: raised instead, the answers gathered went unshown (Ctrl-C).

    Raises:
        RefusedError: the broker refused the group command (MQTT 5): no member got it.
    """
    results = {device: DeviceResult(device, "timeout") for device in members}
    replies = Replies(topics)
    undo = comm.subscribe(topics.device("+", "resp"), replies.on_response, qos=FANIN_QOS)
    command = new_command(kind, args, timeout)
    answers = replies.expect(command.id)
    topic = topics.group(group, "cmd")
    try:
        refused = refusals(comm)
        comm.publish(
            topic,
            command.model_dump_json().encode(),
            qos=1,
            expiry_s=expiry_seconds(timeout),
        )
        deadline = time.monotonic() + timeout
        while any(r.answer is None for r in results.values()):
            if stop is not None and stop.is_set():
                for entry in results.values():
                    if entry.answer is None:
                        entry.outcome = "interrupted"
                break
            if refusals(comm) > refused:
                raise RefusedError(kind, topic, last_refusal(comm))
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                answer = answers.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            entry = results.setdefault(answer.device_id, DeviceResult(answer.device_id, "timeout"))
            entry.started = entry.started or answer.status in ("accepted", "progress")
            if answer.status == "progress":
                entry.progress = answer.progress
            elif answer.status in ("ok", "error"):
                entry.answer = answer
                entry.outcome = answer.status
            if on_answer is not None:
                on_answer(answer)
    finally:
        replies.forget(command.id)
        undo()
    return results
