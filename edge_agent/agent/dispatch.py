"""Commands in, answers out: the layer between the wire and the supervisor.

Every payload that reaches a command topic gets an answer, a malformed one
included, and nothing in a payload can stop the agent:
- too large, not JSON, not an envelope: `error` with code and the field;
- a duplicate id: not run again; its stored final answer is sent again, or
  `accepted` again while the first delivery still runs;
- a long command while MAX_QUEUED_JOBS wait: `error` command.busy, not stored,
  so the same id may be sent again later;
- past `expires_at`: `error` command.expired, not run. When the command came with an
  MQTT 5 message expiry, the broker has already held it to that lifetime on its own
  clock, and the box's clock is not asked: a box that booted in 1970, or whose clock
  runs ahead, must neither run a stale command nor refuse every fresh one;
- an unknown type or bad args: `error` naming the field;
- a short command runs on a small worker pool (a slow compile never delays a
  ping), the cheap reads (QUICK_COMMANDS) on a lane of their own, so that short
  commands held up (a rollback waiting on a deploy's store lock) never delay them;
  past MAX_WAITING_COMMANDS on its lane, a command is refused command.busy, not stored;
- a long one (deploy, calibrate) answers `accepted` at once, then
  `progress`, then `ok` or `error`, and can be cancelled by id.

Handlers hold no logic: validate, call the supervisor, answer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from edge_agent import __version__
from edge_agent.agent.expiry import expired_error, waited_error
from edge_agent.agent.jobs import JobContext, Jobs, stopping_error
from edge_agent.agent.lanes import Lane
from edge_agent.agent.records import CommandLog
from edge_agent.config_files import drop_unknown_fields, first_error
from edge_agent.errors import EdgeAgentError, from_os_error
from edge_agent.logs import log_crash, log_event
from edge_agent.protocol.agent import (
    COMMAND_ARGS,
    LONG_COMMANDS,
    MAX_QUEUED_JOBS,
    Command,
    ErrorBody,
    Progress,
    Response,
    validate_args,
)

log = logging.getLogger(__name__)

Answer = Callable[[Response], None]
"""Publishes an answer (through the outbox)."""

MAX_ERROR_CHARS = 1000
"""An error answer's message is cut here: enough for any message edge-agent writes, with
the names and values it quotes; not the whole of a field name a sender made 250 KB."""
MAX_FIELD_CHARS = 200
QUICK_COMMANDS = frozenset({"ping", "get_status", "list_models", "list_pipelines", "set_telemetry"})
"""Reads of memory and small files, and set_telemetry (one small file): their own lane,
one worker, so nothing slow is ever ahead of them."""
MAX_WAITING_COMMANDS = 64
"""Short commands running or waiting on one lane; past it they are refused command.busy."""
PROGRESS_EVERY_S = 2.0
"""Within one stage, a long command's progress goes out at most this often (each new stage
at once). A transfer reported every chunk, up to 10 a second per box: a group deploy to
5,000 boxes sent the console 50,000 answers a second, and its final ones were lost."""


class Supervisor(Protocol):
    """What the commands act on; `agent.supervisor.AgentSupervisor` is the real one."""

    def run_command(self, kind: str, args: BaseModel, job: JobContext) -> dict[str, Any]:
        """Carry out one validated command and return its result."""
        ...


class Dispatcher:
    """Turns command payloads into supervisor calls and answers.

    Args:
        device_id: Put in every answer.
        supervisor: Carries the commands out.
        answer: Publishes an answer.
        commands: Idempotency log.
        max_bytes: Larger payloads are refused unread.
        clock: Unix seconds, injectable.
    """

    def __init__(
        self,
        device_id: str,
        supervisor: Supervisor,
        answer: Answer,
        commands: CommandLog,
        max_bytes: int = 256 * 1024,
        clock: Callable[[], float] = time.time,
        workers: int = 4,
    ) -> None:
        self.device_id = device_id
        self._supervisor = supervisor
        self._answer = answer
        self._commands = commands
        self._max_bytes = max_bytes
        self._clock = clock
        self._pool = Lane("cmd", workers, MAX_WAITING_COMMANDS)
        self._quick = Lane("cmd-quick", 1, MAX_WAITING_COMMANDS)
        self.jobs = Jobs()
        self._closed = threading.Event()

    def handle(
        self, payload: bytes, broker_expiry_s: int | None = None, retained: bool = False
    ) -> None:
        """Take one command payload; never raises. Called from the comms worker thread.

        `broker_expiry_s`: what was left of the message's MQTT 5 expiry when it arrived
        (`Message.expiry_s`); with one, `expires_at` is not checked on this box's clock.
        `retained`: the broker sent it from its retained store (a new subscription, every
        reconnect), not as it was published; such a command is answered, never run.
        """
        try:
            if retained:
                self._refuse_retained(payload)
                return
            self._handle(payload, broker_expiry_s)
        except Exception:  # a bug must cost one answer, not the agent
            log_crash(log, "command_crashed")
            self._error("", EdgeAgentError("the agent failed on this command", code="internal"))

    def end_interrupted(self) -> None:
        """At start: give the commands the last run claimed and never ended a final answer.

        Killed mid-command (a crash, a power cut), an id stayed claimed with no answer: a
        resend got `accepted` and then nothing, and `cancel` found nothing to cancel,
        until 10,000 newer ids pushed it out of the log.
        """
        for command_id in self._commands.unfinished():
            self._finish(command_id, error=interrupted_error(command_id))

    def _refuse_retained(self, payload: bytes) -> None:
        # Run, it would run again at every reconnect once its id left the log, and on every
        # box that joins the group later: a command is for the boxes there when it is sent.
        # Not claimed, so the same id sent as a live command still runs.
        log_event(log, logging.WARNING, "command_retained", bytes=len(payload))
        self._error(
            self._sniff_id(payload[:4096]),
            EdgeAgentError(
                "command was a retained message, which the agent does not run",
                "clear it (mosquitto_pub -r -n -t TOPIC) and send commands without retain",
                code="command.invalid",
            ),
            field="retain",
        )

    def _handle(self, payload: bytes, broker_expiry_s: int | None = None) -> None:
        if len(payload) > self._max_bytes:
            self._error(
                self._sniff_id(payload[:4096]),
                EdgeAgentError(
                    f"command of {len(payload)} bytes is over the {self._max_bytes}-byte limit",
                    "send large data (models) through deploy_model, not inside a command",
                    code="command.too_large",
                ),
            )
            return
        try:
            # NaN and Infinity are not JSON (Python's parser takes them): an expires_at of
            # NaN never compares as past. A lone surrogate (\\udcff) parses, but no answer
            # that quotes it can be written back as UTF-8, so it is refused here too.
            raw = json.loads(payload, parse_constant=_not_json)
            json.dumps(raw, ensure_ascii=False).encode("utf-8")
        except (ValueError, UnicodeError, RecursionError) as exc:
            if isinstance(exc, RecursionError):
                why = "nested too deeply"
            elif isinstance(exc, UnicodeEncodeError):
                # Not str(exc): it quotes the surrogate, and this answer must be writable.
                why = "it holds a lone UTF-16 surrogate escape, which is not text"
            else:
                why = str(exc)
            self._error(
                self._sniff_id(payload[:4096]),
                EdgeAgentError(
                    f"command is not JSON: {why}",
                    "send a JSON object of UTF-8 text",
                    code="command.invalid",
                ),
            )
            return
        if not isinstance(raw, dict):
            self._error(
                "",
                EdgeAgentError(
                    f"command is JSON but not an object ({type(raw).__name__})",
                    "send an envelope {id, type, args, sent_at}",
                    code="command.invalid",
                ),
            )
            return
        command_id = raw.get("id", "")
        command_id = command_id if isinstance(command_id, str) else ""
        try:
            command = Command.model_validate(raw)
        except ValidationError as exc:
            where, message = first_error(exc)
            self._error(
                command_id[:128],
                _unknown_here(exc, "")
                or EdgeAgentError(
                    f"bad command envelope at {where}: {message}",
                    "see docs/PROTOCOL.md",
                    code="command.invalid",
                ),
                field=where,
            )
            return
        if self._closed.is_set():
            self._error(command.id, stopping_error(command.id))
            return
        fresh, stored = self._commands.claim(command.id)
        if not fresh:
            log_event(log, logging.INFO, "command_duplicate", command_id=command.id)
            if stored is not None:
                self._send(self._stored(command.id, stored))
            else:  # still running: say so; its final answer follows
                self._send(Response(id=command.id, status="accepted", **self._base()))
            return
        if (
            command.expires_at is not None
            and broker_expiry_s is None
            and self._clock() > command.expires_at
        ):
            self._finish(
                command.id,
                error=expired_error(command.id, command.sent_at, command.expires_at, self._clock()),
            )
            return
        if command.type not in COMMAND_ARGS:
            self._finish(
                command.id,
                error=EdgeAgentError(
                    f"edge-agent {__version__} does not know command type "
                    f"{_clip(command.type, MAX_FIELD_CHARS)!r} (sent by a newer console?)",
                    f"upgrade the agent, or use one of: {', '.join(sorted(COMMAND_ARGS))}",
                    code="command.unknown",
                ),
                field="type",
            )
            return
        try:
            args = validate_args(command.type, command.args)
        except ValidationError as exc:
            where, message = first_error(exc, "args.")
            self._finish(
                command.id,
                error=_unknown_here(exc, "args.")
                or EdgeAgentError(
                    f"bad arguments for {command.type} at {where}: {message}",
                    "see docs/PROTOCOL.md",
                    code="command.invalid",
                ),
                field=where,
            )
            return
        if command.type == "cancel":
            self._cancel(command, args)
            return
        # The expiry holds until the command runs, not only until it arrives: a deploy
        # queued behind a calibration, or a short command behind a full pool, ran long
        # after the console had given up on it. Timed from here on the monotonic clock
        # when the broker said what was left (the box's clock is not asked then).
        received = time.monotonic()

        def expired() -> EdgeAgentError | None:
            if command.expires_at is None:
                return None
            if broker_expiry_s is not None:
                late = time.monotonic() - received > broker_expiry_s
            else:
                late = self._clock() > command.expires_at
            return waited_error(command.id, command.expires_at) if late else None

        if command.type in LONG_COMMANDS:
            waiting = len(self.jobs.running())
            if waiting > MAX_QUEUED_JOBS:
                self._refuse(
                    command.id,
                    EdgeAgentError(
                        f"{waiting} long commands are running or waiting",
                        "send it again once some have finished (watch get_status jobs)",
                        code="command.busy",
                    ),
                )
                return
            self._send(Response(id=command.id, status="accepted", **self._base()))
            try:
                self.jobs.start(
                    command.id,
                    lambda job: self._run(command, args, job, expired),
                    self._progress(command.id),
                )
            except EdgeAgentError as exc:  # the agent began to stop since the check above
                self._refuse(command.id, exc)
        else:
            lane = self._quick if command.type in QUICK_COMMANDS else self._pool
            try:
                taken = lane.submit(
                    lambda: self._run(command, args, JobContext.detached(), expired)
                )
            except RuntimeError:  # the lane was shut down since the check above
                self._refuse(command.id, stopping_error(command.id))
                return
            if not taken:
                self._refuse(
                    command.id,
                    EdgeAgentError(
                        f"{lane.limit} commands like {command.type} are running or waiting",
                        "send it again once some have been answered",
                        code="command.busy",
                    ),
                )

    def _run(
        self,
        command: Command,
        args: BaseModel,
        job: JobContext,
        expired: Callable[[], EdgeAgentError | None] = lambda: None,
    ) -> None:
        result: dict[str, Any] | None = None
        error = expired()
        if error is None:
            error, result = self._outcome(command, args, job)
        # Ended before it is answered: a cancel handled while the answer was being stored
        # found the job still running, and was answered ok {"cancelled": ...} after the
        # command's own final answer had said it failed.
        job.end()
        # Done is done, whatever the flag says: a cancel that came too late (the job had
        # committed), or a deadline that abandoned it, did not undo what it did.
        self._finish(command.id, result=result, error=error)

    def _outcome(
        self, command: Command, args: BaseModel, job: JobContext
    ) -> tuple[EdgeAgentError | None, dict[str, Any] | None]:
        log_event(log, logging.INFO, "command_started", command_id=command.id, type=command.type)
        try:
            return None, self._supervisor.run_command(command.type, args, job)
        except EdgeAgentError as exc:
            if exc.code == "command.cancelled" and job.stopped:
                return interrupted_error(command.id), None
            return exc, None
        except OSError as exc:
            # A disk full or read-only, a path refused: the operator's to fix, so said
            # with its code and fix, not as a bug with a traceback.
            return from_os_error(exc), None
        except Exception:
            log_crash(log, "command_crashed", command_id=command.id, type=command.type)
            return EdgeAgentError(
                f"{command.type} failed inside the agent",
                "see the agent's log; the agent keeps serving",
                code="internal",
            ), None

    def _cancel(self, command: Command, args: BaseModel) -> None:
        target = getattr(args, "id", "")
        try:
            found = self.jobs.cancel(target)
        except EdgeAgentError as exc:  # too late: it is changing the store
            self._finish(command.id, error=exc, field="args.id")
            return
        if found == "queued":  # never started: its answer now, not after the jobs ahead
            self._finish(target, error=EdgeAgentError("cancelled", code="command.cancelled"))
        if found:
            self._finish(command.id, result={"cancelled": target})
        else:
            self._finish(
                command.id,
                error=EdgeAgentError(
                    f"no running command {target!r} to cancel",
                    "list what runs with get_status",
                    code="command.invalid",
                ),
                field="args.id",
            )

    def _progress(self, command_id: str) -> Callable[[str, float], None]:
        last: dict[str, float] = {}  # the stage last reported, and when (monotonic)

        def report(stage: str, fraction: float) -> None:
            now = time.monotonic()
            if stage in last and now - last[stage] < PROGRESS_EVERY_S:
                return
            last.clear()
            last[stage] = now
            progress = Progress(stage=stage, fraction=min(1.0, max(0.0, fraction)))
            self._send(
                Response(id=command_id, status="progress", progress=progress, **self._base())
            )

        return report

    def _finish(
        self,
        command_id: str,
        result: dict[str, Any] | None = None,
        error: EdgeAgentError | None = None,
        field: str | None = None,
    ) -> None:
        if error is not None:
            response = self._error_response(command_id, error, field)
        else:
            response = Response(id=command_id, status="ok", result=result or {}, **self._base())
        try:
            stored = response.model_dump_json().encode()
        except Exception:
            # An answer that cannot be written (text no encoder takes) must still end the
            # command: otherwise its id stays "accepted" for good, and a resend learns nothing.
            log_crash(log, "answer_unwritable", command_id=command_id)
            response = self._error_response(
                command_id,
                EdgeAgentError(
                    "the answer to this command could not be written as JSON",
                    "see the agent's log; the agent keeps serving",
                    code="internal",
                ),
                None,
            )
            stored = response.model_dump_json().encode()
        self._commands.finish(command_id, stored)
        self._send(response)

    def _refuse(self, command_id: str, error: EdgeAgentError) -> None:
        # Not run, so not kept: kept claimed, the next start answered it a second time
        # (command.interrupted), and the same id could never run.
        self._commands.forget(command_id)
        self._error(command_id, error)

    def _error(self, command_id: str, error: EdgeAgentError, field: str | None = None) -> None:
        # No claim: an envelope we could not read has no id to be idempotent on.
        self._send(self._error_response(command_id, error, field))

    def _error_response(
        self, command_id: str, error: EdgeAgentError, field: str | None
    ) -> Response:
        log_event(
            log,
            logging.WARNING,
            "command_failed",
            command_id=command_id,
            code=error.code,
            detail=_clip(str(error), MAX_ERROR_CHARS),
        )
        # Bounded: a message quotes what was wrong, and a key of 250 KB named in it made a
        # 500 KB answer, stored with its id and logged, 10,000 of them kept.
        where = field or error.field
        body = ErrorBody(
            code=error.code,
            message=_clip(str(error), MAX_ERROR_CHARS),
            field=_clip(where, MAX_FIELD_CHARS) if where else None,
        )
        return Response(id=command_id, status="error", error=body, **self._base())

    def _send(self, response: Response) -> None:
        try:
            self._answer(response)
        except Exception:
            log_crash(log, "answer_failed", command_id=response.id)

    def _stored(self, command_id: str, stored: bytes) -> Response:
        """A duplicate's stored final answer, read for what this version knows: after a
        downgrade, one a newer edge-agent stored raised, and the console got `internal`
        with no id and waited for its answer until the timeout."""
        try:
            answer, _ = drop_unknown_fields(Response.model_validate, json.loads(stored))
        except (ValueError, RecursionError):  # ValidationError is a ValueError
            return Response(
                id=command_id,
                status="error",
                error=ErrorBody(
                    code="internal",
                    message="this command id ran once; its stored answer does not read, "
                    "and it is not run again",
                ),
                **self._base(),
            )
        return answer

    def _base(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "ts": self._clock()}

    @staticmethod
    def _sniff_id(head: bytes) -> str:
        # An oversized command still deserves an answer the console can match, if its id
        # comes early; never parse the rest.
        text = head.decode("utf-8", "replace")
        marker = text.find('"id"')
        if marker < 0:
            return ""
        rest = text[marker + 4 :].lstrip(" :")
        if not rest.startswith('"'):
            return ""
        end = rest.find('"', 1)
        value = rest[1:end] if end > 0 else ""
        return value if 0 < len(value) <= 128 and value.isprintable() else ""

    def close(self, timeout: float = 5.0) -> None:
        """Stop taking work, cancel jobs; waits up to `timeout` for running commands.

        Commands that come from now on are answered command.interrupted, not run.
        """
        self._closed.set()  # first: a command let in after cancel_all ran uncancelled
        for command_id in self.jobs.cancel_all():
            self._refuse(command_id, stopping_error(command_id))  # never ran: not kept
        self._pool.shutdown()
        self._quick.shutdown()
        self.jobs.join(timeout)


_NEWER_ONLY = frozenset({"extra_forbidden", "literal_error", "union_tag_invalid"})
"""Validation errors a newer console causes (a field, a value or a kind this agent does
not know), as opposed to a wrong type or a value out of range, which is a bug."""


def interrupted_error(command_id: str) -> EdgeAgentError:
    """The answer to a command the agent stopped while it ran (a stop, a crash)."""
    return EdgeAgentError(
        f"command {command_id} did not finish: the agent stopped while it ran",
        "send it again with a new id (a deploy resumes its transfer)",
        code="command.interrupted",
    )


def _unknown_here(exc: ValidationError, prefix: str) -> EdgeAgentError | None:
    """command.invalid worded for an old agent, when every error is one a newer console
    causes; else None. "Extra inputs are not permitted" left an operator unable to tell
    an old box from a console bug."""
    errors = exc.errors()
    if not errors or any(e["type"] not in _NEWER_ONLY for e in errors):
        return None
    first = errors[0]
    where = prefix + ".".join(str(p) for p in first["loc"])
    what = _clip(where.rstrip(".") or "(top)", MAX_FIELD_CHARS)
    if first["type"] == "literal_error":
        what = f"{what} = {_clip(repr(first['input']), MAX_FIELD_CHARS)}"
    elif first["type"] == "union_tag_invalid":
        what = f"{what} of kind {_clip(repr(first.get('ctx', {}).get('tag')), MAX_FIELD_CHARS)}"
    return EdgeAgentError(
        f"edge-agent {__version__} does not know {what} (sent by a newer console?)",
        "upgrade the agent, or leave it out",
        code="command.invalid",
    )


def _clip(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis when longer."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")
