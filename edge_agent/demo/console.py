"""The fleet's view of one device: send commands and wait for answers; collect what it says.

Only the wire protocol is used (protocol/agent.py over a `Communicator`), the
way any fleet console would: commands on `<prefix>/<device>/cmd`, answers on
`resp` matched by id, and `state`, `telemetry`, `events` and
`results/<pipeline>` gathered into a `DeviceView` the display reads.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from edge_agent.comms.base import Communicator, Message
from edge_agent.errors import CODES, EdgeAgentError
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics

OnProgress = Callable[[msg.Progress], None]


class DemoInterrupted(Exception):  # noqa: N818 (a signal, not an error)
    """The caller's stop event was set while waiting for an answer."""


@dataclass
class PipelineTally:
    """What the fleet has received from one pipeline."""

    frames: int = 0
    """Result messages (every frame when the agent publishes results = all)."""
    with_results: int = 0
    """Frames that had at least one detection."""
    first_ts: float | None = None
    last_ts: float | None = None
    last_received: float = 0.0

    @property
    def fps(self) -> float:
        """Frames per second over the run, from the device's own timestamps."""
        if self.first_ts is None or self.last_ts is None or self.frames < 2:
            return 0.0
        span = self.last_ts - self.first_ts
        return (self.frames - 1) / span if span > 0 else 0.0


@dataclass
class DeviceView:
    """Everything the console has heard from the device; guarded by `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    state: msg.State | None = None
    telemetry: msg.Telemetry | None = None
    telemetry_count: int = 0
    last_active: dict[str, msg.PipelineTelemetry] = field(default_factory=dict)
    """Each pipeline's latest telemetry with frames in it (it shows after the run ends)."""
    events: deque[msg.AgentEvent | msg.DetectionEvent] = field(
        default_factory=lambda: deque(maxlen=200)
    )
    event_count: int = 0
    pipelines: dict[str, PipelineTally] = field(default_factory=dict)
    bad_messages: int = 0
    changed: threading.Event = field(default_factory=threading.Event)


class DeviceConsole:
    """Commands to one device, and its messages gathered into `view`.

    Args:
        comm: A connected session.
        topics: The fleet's topic prefix.
        device_id: The device to talk to.
    """

    def __init__(self, comm: Communicator, topics: Topics, device_id: str) -> None:
        self.comm = comm
        self.topics = topics
        self.device = device_id
        self.view = DeviceView()
        self._waiting: dict[str, queue.Queue[msg.Response]] = {}
        self._lock = threading.Lock()
        self._unsubscribe = [
            comm.subscribe(topics.device(device_id, "resp"), self._on_response),
            comm.subscribe(topics.device(device_id, "state"), self._on_state),
            comm.subscribe(topics.device(device_id, "telemetry"), self._on_telemetry),
            comm.subscribe(topics.device(device_id, "events"), self._on_event),
            comm.subscribe(topics.device(device_id, "results/+"), self._on_result),
        ]

    def close(self) -> None:
        for undo in self._unsubscribe:
            undo()

    # --- commands ------------------------------------------------------------------------------
    def send(
        self,
        kind: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = 30.0,
        on_progress: OnProgress | None = None,
        stop: threading.Event | None = None,
    ) -> dict[str, Any]:
        """Send one command and wait for its final answer (ok or error).

        Raises:
            DemoInterrupted: `stop` was set before the answer came (the command may still run).
            EdgeAgentError: the device's error code and message; broker.unreachable when
                no final answer comes within `timeout` (the command expires then too).
        """
        command_id = f"demo-{uuid.uuid4().hex[:12]}"
        answers: queue.Queue[msg.Response] = queue.Queue()
        with self._lock:
            self._waiting[command_id] = answers
        now = time.time()
        command = msg.Command(
            id=command_id, type=kind, args=args or {}, sent_at=now, expires_at=now + timeout
        )
        try:
            self.comm.publish(
                self.topics.device(self.device, "cmd"), command.model_dump_json().encode(), qos=1
            )
            deadline = time.monotonic() + timeout
            while True:
                if stop is not None and stop.is_set():
                    raise DemoInterrupted(kind)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EdgeAgentError(
                        f"{kind}: no answer from {self.device} within {timeout:g} s",
                        "check the agent is running and connected to the same broker",
                        code="broker.unreachable",
                    )
                try:
                    answer = answers.get(timeout=min(left, 0.5))
                except queue.Empty:
                    continue
                if answer.status == "progress" and answer.progress and on_progress:
                    on_progress(answer.progress)
                elif answer.status == "ok":
                    return answer.result or {}
                elif answer.status == "error":
                    raise _as_error(kind, answer.error)
        finally:
            with self._lock:
                self._waiting.pop(command_id, None)

    # --- handlers (the session's dispatch thread: short) ---------------------------------------
    def _parse(self, model: type[Any], message: Message) -> Any:
        try:
            return model.model_validate_json(message.payload)
        except ValidationError:
            with self.view.lock:
                self.view.bad_messages += 1
            return None

    def _on_response(self, message: Message) -> None:
        answer: msg.Response | None = self._parse(msg.Response, message)
        if answer is None:
            return
        with self._lock:
            waiting = self._waiting.get(answer.id)
        if waiting is not None:
            waiting.put(answer)

    def _on_state(self, message: Message) -> None:
        if not message.payload:
            return
        state: msg.State | None = self._parse(msg.State, message)
        if state is not None:
            with self.view.lock:
                self.view.state = state
            self.view.changed.set()

    def _on_telemetry(self, message: Message) -> None:
        telemetry: msg.Telemetry | None = self._parse(msg.Telemetry, message)
        if telemetry is not None:
            with self.view.lock:
                self.view.telemetry = telemetry
                self.view.telemetry_count += 1
                for pipeline, stats in telemetry.pipelines.items():
                    if stats.frames > 0:
                        self.view.last_active[pipeline] = stats
            self.view.changed.set()

    def _on_event(self, message: Message) -> None:
        event: msg.EventMessage | None = self._parse(msg.EventMessage, message)
        if event is not None:
            with self.view.lock:
                self.view.events.append(event.event)
                self.view.event_count += 1
            self.view.changed.set()

    def _on_result(self, message: Message) -> None:
        result: msg.ResultMessage | None = self._parse(msg.ResultMessage, message)
        if result is None:
            return
        with self.view.lock:
            tally = self.view.pipelines.setdefault(result.pipeline, PipelineTally())
            tally.frames += 1
            tally.with_results += bool(result.results)
            tally.first_ts = result.ts if tally.first_ts is None else min(tally.first_ts, result.ts)
            tally.last_ts = result.ts if tally.last_ts is None else max(tally.last_ts, result.ts)
            tally.last_received = time.monotonic()

    # --- waiting -------------------------------------------------------------------------------
    def wait_online(self, timeout: float, stop: threading.Event | None = None) -> msg.State:
        """The device's birth message.

        Raises:
            DemoInterrupted: `stop` was set first.
            EdgeAgentError: broker.unreachable when it does not come within `timeout`.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise DemoInterrupted("wait_online")
            with self.view.lock:
                state = self.view.state
            if state is not None and state.online:
                return state
            self.view.changed.wait(0.1)
            self.view.changed.clear()
        raise EdgeAgentError(
            f"{self.device} did not come online within {timeout:g} s",
            "check the broker and the agent's log",
            code="broker.unreachable",
        )


def _as_error(kind: str, body: msg.ErrorBody | None) -> EdgeAgentError:
    if body is None:
        return EdgeAgentError(f"{kind} failed without a reason", code="internal")
    code = body.code if body.code in CODES else "error"
    where = f" (field {body.field})" if body.field else ""
    return EdgeAgentError(f"{kind} failed{where}: {body.message}", code=code)
