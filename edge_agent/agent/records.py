"""What the agent must remember across restarts, in small files written atomically.

- `commands.sqlite`: the final answer of every command id seen recently, so a
  command the broker delivers twice (QoS 1 allows it) runs once and its stored
  answer is sent again. Bounded by count; the oldest ids are forgotten first.
- `agent.json`: the connection sequence number (the bdSeq of `state`), the
  telemetry interval set by command, and the pipelines that were running, so a
  restart or a reboot brings them back without the fleet resending anything;
  those that finished (a file played to its end, the max_frames given run) are marked
  so, and are not run again.

Every JSON file is written as temp file, fsync, rename, fsync of the folder:
a crash leaves the old or the new file, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.config_files import drop_unknown_fields
from edge_agent.logs import Throttle, log_event
from edge_agent.sqlite_files import open_or_in_memory

log = logging.getLogger(__name__)

_UNWRITABLE_SAY_EVERY_S = 60.0
"""How often a command log that cannot be written is logged while it stays so."""
_UNSAVED_KEPT = 1_000
"""Final answers kept in memory while the disk refuses them; the oldest go first."""


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException as exc:
        # A full disk left the half-written copy behind, taking what little room was left.
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # A write or an fsync that fails names no file: the answer and the log must.
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AgentRecord(BaseModel):
    """The agent's own must-survive settings and running pipelines."""

    model_config = ConfigDict(extra="forbid")

    seq: int = Field(default=0, ge=0, description="Last connection sequence number used.")
    telemetry_interval_s: float | None = Field(
        default=None, description="Interval set by set_telemetry; None: the config's."
    )
    pipelines: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Specs of the pipelines to run, by id."
    )
    finished: dict[str, float] = Field(
        default_factory=dict,
        description="Recorded pipelines that finished (a file played to its end, or the "
        "max_frames given run, whatever the source), by id: when (Unix seconds). Listed "
        "stopped after a restart, not run again; absent from records of builds before it, "
        "which then run all their pipelines as they did.",
    )


RECORD_FILE = "agent.json"


def recorded_spec(folder: Path, pipeline: str) -> dict[str, Any] | None:
    """The spec the agent in `folder` recorded for `pipeline`, read only (a damaged record
    is the agent's to set aside, not a reader's); None when there is none to read."""
    try:
        data = json.loads((folder / RECORD_FILE).read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    pipelines = data.get("pipelines") if isinstance(data, dict) else None
    spec = pipelines.get(pipeline) if isinstance(pipelines, dict) else None
    return spec if isinstance(spec, dict) else None


class AgentRecords:
    """Load and save `AgentRecord`; thread-safe."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / RECORD_FILE
        self._lock = threading.Lock()
        self.record = self._load()

    def _load(self) -> AgentRecord:
        try:
            # Fields a newer edge-agent wrote (before a downgrade) are dropped, not fatal.
            record, dropped = drop_unknown_fields(
                AgentRecord.model_validate, json.loads(self.path.read_bytes())
            )
        except FileNotFoundError:
            return AgentRecord()
        except (OSError, ValueError, RecursionError) as exc:
            # ValueError: not JSON, or not a record; RecursionError: nested too deep.
            # A damaged record must not stop the agent: keep it aside for the operator and
            # start clean (the pipelines then wait for the fleet; seq stays monotonic, below).
            aside = self.path.with_suffix(f".damaged-{int(time.time())}")
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            log_event(
                log,
                logging.ERROR,
                "agent_record_damaged",
                path=str(self.path),
                kept_as=aside.name,
                detail=str(exc).splitlines()[0],
            )
            return AgentRecord()
        if dropped:
            log_event(
                log,
                logging.WARNING,
                "agent_record_fields_dropped",
                path=str(self.path),
                fields=",".join(dropped),
                detail="written by a newer edge-agent; this one does not know them",
            )
        return record

    def update(self, **changes: Any) -> AgentRecord:
        """Apply `changes` and persist; returns the new record."""
        with self._lock:
            data = self.record.model_dump()
            data.update(changes)
            record = AgentRecord.model_validate(data)
            write_atomically(self.path, record.model_dump_json(indent=1).encode())
            self.record = record
            return record

    def next_seq(self) -> int:
        """The next connection sequence number, persisted before it is used.

        Never below the wall clock in seconds, so it keeps going up even if the record
        was lost; +1 covers restarts within one second.
        """
        return self.update(seq=max(self.record.seq + 1, int(time.time()))).seq


class CommandLog:
    """Final answers by command id, for idempotency. Thread-safe.

    A log that cannot be read or written (a full or read-only disk, EIO) does not stop a
    command: it runs without the duplicate check, and its answer is sent all the same.
    Raised, the error cost every command its answer (ping and stop_pipeline included:
    each was answered `internal` with no id), and a finish that failed lost the final
    answer of a command that had run. A duplicate the broker delivers then may run
    twice; that is the lesser harm, and it is logged (once a minute).

    Args:
        path: The sqlite file.
        keep: How many ids to remember.
    """

    def __init__(self, path: Path, keep: int = 10_000) -> None:
        self.path = path
        self._keep = keep
        self._lock = threading.Lock()
        self._unwritable = Throttle(_UNWRITABLE_SAY_EVERY_S)
        self._db, _ = open_or_in_memory(
            path,
            "CREATE TABLE IF NOT EXISTS answers ("
            " n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,"
            " answer BLOB, ts REAL NOT NULL)",
            held="answers are remembered in memory until the agent stops: a command sent "
            "again after a restart may run twice",
        )
        # Every claim and answer on the platter before the broker hears PUBACK (the session
        # acknowledges a command once its handler has claimed it): under NORMAL a power cut
        # lost a claim the broker had been told of, and the command with it. One fsync a
        # command is nothing at command rates.
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA synchronous=FULL")
        # Final answers the disk refused (full, read-only), oldest first: given to a resend
        # and written at the next write the disk takes. Lost, the id stayed open, every
        # resend was told `accepted` for good, and the next start said it was interrupted.
        self._unsaved: dict[str, bytes] = {}

    def claim(self, command_id: str) -> tuple[bool, bytes | None]:
        """Record that `command_id` is being run.

        Returns:
            (True, None) the first time, or when the log cannot be used: run it.
            (False, answer) after: do not run it again; `answer` is its stored final
            answer, or None while it still runs.
        """
        with self._lock:
            if command_id in self._unsaved:
                return False, self._unsaved[command_id]
            try:
                self._save_unsaved()
                row = self._db.execute(
                    "SELECT answer FROM answers WHERE id = ?", (command_id,)
                ).fetchone()
                if row is not None:
                    return False, None if row[0] is None else bytes(row[0])
                self._db.execute(
                    "INSERT INTO answers (id, answer, ts) VALUES (?, NULL, ?)",
                    (command_id, time.time()),
                )
                # Answered ones only: a claim trimmed while its command ran lost the answer
                # it then stored, and a resend ran the command again.
                self._db.execute(
                    "DELETE FROM answers WHERE n <= (SELECT MAX(n) FROM answers) - ?"
                    " AND answer IS NOT NULL",
                    (self._keep,),
                )
            except (sqlite3.Error, OSError) as exc:
                self._failed("claim", command_id, exc)
            return True, None

    def unfinished(self) -> list[str]:
        """Ids claimed with no final answer: at start, those the last run never ended."""
        with self._lock:
            rows = self._db.execute("SELECT id FROM answers WHERE answer IS NULL ORDER BY n")
            return [row[0] for row in rows.fetchall()]

    def forget(self, command_id: str) -> None:
        """Drop a claim, so the same id may run when it is sent again (after command.busy)."""
        with self._lock:
            self._unsaved.pop(command_id, None)
            try:
                self._db.execute("DELETE FROM answers WHERE id = ?", (command_id,))
            except (sqlite3.Error, OSError) as exc:
                self._failed("forget", command_id, exc)

    def finish(self, command_id: str, answer: bytes) -> None:
        """Store the final answer of a claimed command; one the disk refuses is kept in
        memory, answered to a resend, and written with the next write the disk takes."""
        with self._lock:
            self._unsaved[command_id] = answer
            while len(self._unsaved) > _UNSAVED_KEPT:
                del self._unsaved[next(iter(self._unsaved))]
            try:
                self._save_unsaved()
            except (sqlite3.Error, OSError) as exc:
                self._failed("finish", command_id, exc)

    def _save_unsaved(self) -> None:
        # Under the lock. Each is removed once its row holds it: a failure keeps the rest.
        for command_id, answer in list(self._unsaved.items()):
            self._db.execute("UPDATE answers SET answer = ? WHERE id = ?", (answer, command_id))
            del self._unsaved[command_id]

    def _failed(self, operation: str, command_id: str, exc: Exception) -> None:
        if self._unwritable.ready():
            log_event(
                log,
                logging.ERROR,
                "command_log_failed",
                operation=operation,
                command_id=command_id,
                error=str(exc),
                path=str(self.path),
                detail="commands run without the duplicate check until it can be written",
                fix="free space on the state disk, or check that it is writable",
            )

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()


def dumps(data: Any) -> bytes:
    """Compact JSON bytes, as published."""
    return json.dumps(data, separators=(",", ":")).encode()
