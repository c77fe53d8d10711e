"""The fleet's side of the command protocol: send a command, wait for its answer, follow a device.

Only the wire protocol is used (protocol/agent.py over a `Communicator`), the
way any fleet console would: commands on `<prefix>/<device>/cmd` (or a group's),
answers on `resp` matched by id, and `state`, `telemetry`, `events` and
`results/<pipeline>` gathered into a `DeviceView` a display reads. `edge-fleet`
and the demo both talk to devices through this module.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from edge_agent.comms.base import Communicator, Message, last_refusal, refusals
from edge_agent.config_files import drop_unknown_fields
from edge_agent.errors import CODES, EdgeAgentError
from edge_agent.fleet import clock
from edge_agent.logs import log_event
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics

OnProgress = Callable[[msg.Progress], None]
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


class Interrupted(Exception):  # noqa: N818 (a signal, not an error)
    """The caller's stop event was set while waiting for an answer."""

    def __init__(self, kind: str = "", started: msg.Response | None = None) -> None:
        super().__init__(kind)
        self.started = started
        """As `NoAnswerError.started`: how far the device had said it got."""


class NoAnswerError(EdgeAgentError):
    """No final answer came in time. The command expired with the wait, so a box that had
    not started it will not; one that had (it answered accepted or progress) may still be
    running it, and the error says so."""

    def __init__(
        self,
        kind: str,
        device: str,
        timeout: float,
        hint: str = "",
        *,
        started: msg.Response | None = None,
        command_id: str = "",
    ) -> None:
        self.started = started
        """Its last progress answer, else its accepted; None when it never answered."""
        if started is None:
            super().__init__(
                f"{kind}: no answer from {device} within {timeout:g} s{hint}",
                "check the agent is running and connected to the same broker and prefix, "
                "or wait longer with --timeout",
                code="command.timeout",
            )
            return
        # A deploy that timed out after `accepted` was reported as "no answer, check the
        # agent is running": the operator sent it again, or met an activation later.
        last = started.progress
        at = f", last at {last.stage} {last.fraction:.0%}" if last is not None else ""
        super().__init__(
            f"{kind}: {device} started it (id {command_id}{at}) but sent no final answer "
            f"within {timeout:g} s; it may still be running there",
            f"follow it with `edge-fleet cmd {device} get_status`, or stop it with "
            f"`edge-fleet cmd {device} cancel --arg id={command_id}`",
            code="command.timeout",
        )


class RefusedError(EdgeAgentError):
    """The broker took a command and refused it (an MQTT 5 PUBACK with a failure reason):
    it reaches no device, so no answer will come. Waited for, it took the whole timeout
    (600 s for a deploy) and was blamed on the boxes."""

    def __init__(self, kind: str, topic: str, said: str) -> None:
        super().__init__(
            f"the broker refused {kind} on {topic}: {said}; no device got it",
            "send it as a user the broker lets write <prefix>/<device>/cmd and "
            "<prefix>/group/<group>/cmd (the fleet's console user, `fleet` in "
            "systemd/mosquitto/fleet.acl)",
            code="broker.refused",
        )


class CommandError(EdgeAgentError):
    """The device answered with an error; `answer` is that answer as it came."""

    def __init__(self, kind: str, answer: msg.Response) -> None:
        body = error_of(answer)
        where = f" (field {body.field})" if body.field else ""
        # A newer agent may send a code this console does not know: kept in `answer`.
        super().__init__(
            f"{kind} failed{where}: {body.message}",
            code=body.code if body.code in CODES else "error",
        )
        self.answer = answer
        self.body = body


def error_of(answer: msg.Response) -> msg.ErrorBody:
    """What an error answer says failed. One sent without its body (a box's bug) is said
    `internal`: read for its body, it passed for ok in `cmd` and for silence in `deploy`."""
    return answer.error or msg.ErrorBody(code="internal", message="failed without a reason")


def new_command(kind: str, args: dict[str, Any] | None, timeout: float) -> msg.Command:
    """A command envelope that expires when the console stops waiting for it, so a device
    that comes back later does not run something nobody waits for any more."""
    now = time.time()
    return msg.Command(
        id=f"fleet-{uuid.uuid4().hex[:12]}",
        type=kind,
        args=args or {},
        sent_at=now,
        expires_at=now + timeout,
    )


def expiry_seconds(timeout: float) -> int:
    """The MQTT 5 message expiry that goes with a command's expires_at: the broker drops the
    command once it has held it that long, timed on its own clock, so a box whose clock is
    wrong (booted in 1970, not yet synced) neither runs it late nor refuses it early."""
    return max(1, math.ceil(timeout))


def parse(model: type[M], payload: bytes) -> M | None:
    """`payload` as `model`, or None when it is not one (a console never dies of a bad message).

    A fleet mid-upgrade has boxes newer than its console. A field a newer edge-agent added
    is dropped, and said once: refused whole, such a box's answers were waited for until
    the timeout, and its state and telemetry left it out of status, watch and group deploys
    while it ran. Anything else wrong still makes the message unreadable.
    """
    try:
        return model.model_validate_json(payload)
    except ValidationError:
        pass
    try:
        found, dropped = drop_unknown_fields(model.model_validate, json.loads(payload))
    except (ValueError, RecursionError):  # ValidationError is a ValueError
        return None
    _newer.say(model.__name__, dropped)
    return found


class _NewerFields:
    """Fields a newer edge-agent sent that this console does not know: logged once each."""

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def say(self, message: str, dropped: list[str]) -> None:
        with self._lock:
            fresh = [f"{message}.{place}" for place in dropped]
            fresh = [place for place in fresh if place not in self._said]
            self._said.update(fresh)
        if fresh:
            log_event(
                log,
                logging.WARNING,
                "fleet_fields_unknown",
                fields=",".join(fresh),
                detail="sent by a newer edge-agent; read without them",
                fix="upgrade edge-fleet to the version of the fleet's newest agent",
            )


_newer = _NewerFields()


class Replies:
    """Answers routed to whoever waits for their command id (one `resp` handler, many waits).

    An answer is the answer of the device whose `resp` topic it came on: a broker's ACL
    lets a box write its own topics only, but not choose what its messages say. One whose
    `device_id` names another device is dropped, and said once: filed under the name in
    its body, one box's answer passed for another's (a failed deploy read as ok).
    """

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self._waiting: dict[str, queue.Queue[msg.Response]] = {}
        self._lock = threading.Lock()
        self._misnamed: set[tuple[str | None, str]] = set()

    def expect(self, command_id: str) -> queue.Queue[msg.Response]:
        answers: queue.Queue[msg.Response] = queue.Queue()
        with self._lock:
            self._waiting[command_id] = answers
        return answers

    def forget(self, command_id: str) -> None:
        with self._lock:
            self._waiting.pop(command_id, None)

    def on_response(self, message: Message) -> None:
        answer = parse(msg.Response, message.payload)
        if answer is None:
            return
        device = self.topics.device_of(message.topic)
        if answer.device_id != device:
            pair = (device, answer.device_id)
            with self._lock:
                # Bounded: a box may put any name in its answers.
                fresh = pair not in self._misnamed and len(self._misnamed) < 100
                if fresh:
                    self._misnamed.add(pair)
            if fresh:
                log_event(
                    log,
                    logging.WARNING,
                    "fleet_answer_misnamed",
                    topic_device=device,
                    named=answer.device_id,
                    detail="dropped: an answer counts for the device whose resp topic it came on",
                )
            return
        with self._lock:
            waiting = self._waiting.get(answer.id)
        if waiting is not None:
            waiting.put(answer)


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
        follow: Also gather telemetry, events and results (a one-off command needs only
            answers and state).
    """

    def __init__(
        self, comm: Communicator, topics: Topics, device_id: str, *, follow: bool = True
    ) -> None:
        self.comm = comm
        self.topics = topics
        self.device = device_id
        self.view = DeviceView()
        self._replies = Replies(topics)
        wanted = [("resp", self._replies.on_response), ("state", self._on_state)]
        if follow:
            wanted += [
                ("telemetry", self._on_telemetry),
                ("events", self._on_event),
                ("results/+", self._on_result),
            ]
        self._unsubscribe = [comm.subscribe(topics.device(device_id, t), h) for t, h in wanted]

    def close(self) -> None:
        for undo in self._unsubscribe:
            undo()

    # --- commands ------------------------------------------------------------------------------
    def request(
        self,
        kind: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = 30.0,
        on_progress: OnProgress | None = None,
        stop: threading.Event | None = None,
    ) -> msg.Response:
        """Send one command and return its final answer, ok or error, as it came.

        Raises:
            Interrupted: `stop` was set before the answer came (the command may still run).
            NoAnswerError: no final answer within `timeout` (the command expires then too).
            RefusedError: the broker refused the command (MQTT 5): no device got it.
        """
        command = new_command(kind, args, timeout)
        answers = self._replies.expect(command.id)
        topic = self.topics.device(self.device, "cmd")
        started: msg.Response | None = None
        try:
            refused = refusals(self.comm)
            self.comm.publish(
                topic,
                command.model_dump_json().encode(),
                qos=1,
                expiry_s=expiry_seconds(timeout),
            )
            deadline = time.monotonic() + timeout
            while True:
                if stop is not None and stop.is_set():
                    raise Interrupted(kind, started)
                if refusals(self.comm) > refused:
                    raise RefusedError(kind, topic, last_refusal(self.comm))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAnswerError(
                        kind,
                        self.device,
                        timeout,
                        self._offline_hint(),
                        started=started,
                        command_id=command.id,
                    )
                try:
                    # Short waits: a refusal comes back in a round trip, not in an answer.
                    answer = answers.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                if answer.status in ("accepted", "progress"):
                    started = answer if answer.progress or started is None else started
                if answer.status == "progress" and answer.progress and on_progress:
                    on_progress(answer.progress)
                elif answer.status in ("ok", "error"):
                    return answer
        finally:
            self._replies.forget(command.id)

    def send(
        self,
        kind: str,
        args: dict[str, Any] | None = None,
        *,
        timeout: float = 30.0,
        on_progress: OnProgress | None = None,
        stop: threading.Event | None = None,
    ) -> dict[str, Any]:
        """Send one command and return its result.

        Raises:
            Interrupted, NoAnswerError: as `request`.
            CommandError: the device answered with an error (its code and message).
        """
        answer = self.request(kind, args, timeout=timeout, on_progress=on_progress, stop=stop)
        if answer.status == "error":
            raise CommandError(kind, answer)
        return answer.result or {}

    def _offline_hint(self) -> str:
        with self.view.lock:
            state = self.view.state
        if state is None:
            return " (no retained state: the device has never connected to this broker)"
        if not state.online:
            # The will is made at connect, so its ts is when the lost connection began (by
            # the box's clock), not when it was lost.
            began = clock.calendar(state.ts) or "an unknown time"
            return f" ({self.device} is offline; its last connection began at {began})"
        return ""

    # --- handlers (the session's dispatch thread: short) ---------------------------------------
    def _parse(self, model: type[M], message: Message) -> M | None:
        found = parse(model, message.payload)
        if found is None:
            with self.view.lock:
                self.view.bad_messages += 1
        return found

    def _on_state(self, message: Message) -> None:
        if not message.payload:
            return
        state = self._parse(msg.State, message)
        if state is not None:
            with self.view.lock:
                self.view.state = state
            self.view.changed.set()

    def _on_telemetry(self, message: Message) -> None:
        telemetry = self._parse(msg.Telemetry, message)
        if telemetry is not None:
            with self.view.lock:
                self.view.telemetry = telemetry
                self.view.telemetry_count += 1
                for pipeline, stats in telemetry.pipelines.items():
                    if stats.frames > 0:
                        self.view.last_active[pipeline] = stats
            self.view.changed.set()

    def _on_event(self, message: Message) -> None:
        event = self._parse(msg.EventMessage, message)
        if event is not None:
            with self.view.lock:
                self.view.events.append(event.event)
                self.view.event_count += 1
            self.view.changed.set()

    def _on_result(self, message: Message) -> None:
        result = self._parse(msg.ResultMessage, message)
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
            Interrupted: `stop` was set first.
            EdgeAgentError: broker.unreachable when it does not come within `timeout`.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise Interrupted("wait_online")
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
