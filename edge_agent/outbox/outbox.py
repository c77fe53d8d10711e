"""The outbox: every message the agent publishes goes through here first.

While the broker is away, results and telemetry wait on disk up to a byte
quota; once it is back they are sent in the order they were made, each with
the timestamp it was made at (the payload carries it; the outbox never
rewrites a payload). It is the one owner of "what gets published, and when it
is dropped":

- a retained message replaces any older retained one on its topic still waiting
  (it says what is so now; the broker would keep only the last one anyway);
- order: one sequence over every message, so a result never overtakes the
  event it caused. Two kinds may go ahead of a backlog, as they serve a console
  waiting now: command answers (`peek_answers`: nothing they say depends on
  results), and the newest telemetry (`newest`: it says what is so now; the
  older telemetry keeps its place, the history of an outage);
- what is dropped over the quota: telemetry first (the next interval says it
  again), then results, and command answers and events only when nothing else
  is left to drop. Every drop is counted by priority, and the counts survive
  restarts so `state` and telemetry can report them.

sqlite in WAL mode: a crash loses at most the message being written, never
the file; `synchronous=NORMAL` keeps a put at tens of microseconds, and WAL
makes it durable against a process crash (the box losing power can lose the
last transactions, which for telemetry is the right trade).

A disk that refuses writes (full, read-only, failing) never raises out of `put`
or `ack`: the agent must keep serving, and a full state disk is not a bug. A
message the disk refuses is a drop like one over the quota, counted in memory
(the counts on disk cannot be written either) and logged at most once a minute;
an `ack` the disk refuses leaves its messages to be sent again after a restart,
which at-least-once delivery allows.

A disk that refuses the file at start holds the outbox in memory (`on_disk` False),
under the same quota, so the box comes online and publishes; `move_to_disk` tries the
file again and moves what waits there once it opens. Until then a stop or a crash loses
what waits in memory, which the start's log line says.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.errors import EdgeAgentError
from edge_agent.logs import Throttle, log_event
from edge_agent.sqlite_files import open_or_in_memory, open_sqlite

log = logging.getLogger(__name__)

_WRITE_FAILED_LOG_S = 60.0
"""At most one log line this often while the disk keeps refusing writes."""
_FILE_QUOTA_FROM = 1024 * 1024
"""From this quota up, it bounds the file: sqlite's pages, indexes and log included. A
smaller one counts topic and payload bytes only (an empty database takes tens of KB)."""
_WAL_SHARE = 16
"""The write-ahead log may take 1/this of the quota..."""
_WAL_MAX = 4 * 1024 * 1024
"""...up to this much, sqlite's default checkpoint size..."""
_WAL_MIN = 128 * 1024
"""...and no less: a put at a 1 MiB quota with a 64 KiB log took 0.25 ms, with 128 KiB as
long as at 64 MiB (0.03 ms), the log checkpointed every few puts."""
_LOG_SLACK = 128 * 1024
"""Beyond the log's limit: its shared-memory index (32 KiB), and the pages of the writes
that come before a checkpoint can start over."""
_MEASURE_FROM = 256 * 1024
"""Message bytes held before the file's cost of them is measured (below, the schema's own
pages would count as the messages' overhead)."""
_MEASURE_EVERY = 256
"""Puts between two measurements of that cost: the mix of message sizes drifts slowly..."""
_MEASURE_EVICTING = 4
"""...and while puts evict, which leaves pages part-empty."""
MOVE_EVERY_S = 300.0
"""How often an outbox held in memory should try its file again (`move_to_disk`)."""


class Priority(enum.IntEnum):
    """What may be dropped first: the higher the number, the sooner."""

    CRITICAL = 0
    """Command answers, events, state: dropped only when nothing else is left."""
    RESULT = 1
    """Decoded results per frame."""
    TELEMETRY = 2
    """Interval telemetry: the next interval repeats what it says."""


@dataclass(frozen=True, slots=True)
class Queued:
    """One message waiting to be published."""

    seq: int
    topic: str
    payload: bytes
    qos: int
    retain: bool
    priority: Priority
    created_at: float


class OutboxStats(BaseModel):
    """What the outbox holds and what it had to drop, for telemetry and `state`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(ge=0, description="Messages waiting.")
    bytes: int = Field(
        ge=0, description="Payload and topic bytes waiting (the file takes 1.2-1.4x that)."
    )
    quota_bytes: int = Field(
        ge=0, description="The byte quota: of the file, its log and indexes from 1 MiB up."
    )
    dropped_critical: int = Field(
        ge=0, description="Answers and events dropped, ever (and refused by the disk, this run)."
    )
    dropped_result: int = Field(
        ge=0,
        description="Results dropped over the quota, ever (and refused by the disk, this run).",
    )
    dropped_telemetry: int = Field(
        ge=0,
        description="Telemetry dropped over the quota, ever (and refused by the disk, this run).",
    )
    oldest_age_s: float = Field(ge=0.0, description="Age of the oldest waiting message.")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    created_at REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_priority ON messages (priority, seq);
CREATE INDEX IF NOT EXISTS retained_by_topic ON messages (topic) WHERE retain = 1;
CREATE INDEX IF NOT EXISTS answers_by_seq ON messages (seq) WHERE substr(topic, -5) = '/resp';
CREATE TABLE IF NOT EXISTS dropped (
    priority INTEGER PRIMARY KEY,
    count INTEGER NOT NULL
);
"""


class Outbox:
    """A persistent FIFO with a byte quota and priority-aware dropping. Thread-safe.

    Args:
        path: The sqlite file (Layout.outbox); its folder is created.
        quota_bytes: The most disk the outbox takes while the broker is away: its file
            and write-ahead log, with sqlite's pages and indexes (a row costs 1.2x to 1.4x
            its topic and payload, more as its size nears a page). Under 1 MiB, the most
            topic and payload bytes kept.
        clock: Wall-clock seconds, injectable for tests.
    """

    def __init__(
        self,
        path: Path,
        quota_bytes: int = 64 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if quota_bytes <= 0:
            raise EdgeAgentError(
                f"outbox quota {quota_bytes} is not positive",
                "set outbox_quota_mb to a positive size",
                code="config.invalid",
            )
        self.path = path
        self.quota_bytes = quota_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._refused: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self._refused_said = Throttle(_WRITE_FAILED_LOG_S)
        self.refusing = False
        """Whether the last write failed: the disk is refusing the outbox just now."""
        # A damaged file is set aside for a new one (`open_sqlite`), one the disk refuses
        # is held in memory: the lock above serialises every use.
        self._db, self.on_disk = open_or_in_memory(
            path,
            _SCHEMA,
            held=f"messages wait in memory (tried on disk again every {MOVE_EVERY_S:.0f} s) "
            "and are lost if the agent stops or crashes before the disk takes them",
        )
        # Bytes waiting by priority, kept as rows come and go: making room over the quota
        # once summed the evictable rows on every put, 26 ms at 16 MB and about 90 ms at
        # the 64 MB default, on the pipelines' threads, through a whole outage.
        self._held: dict[Priority, int] = dict.fromkeys(Priority, 0)
        # The rows waiting, kept the same way: `stats` counted them, a scan of the whole
        # table under the lock every put waits on, twice a telemetry interval (32 ms at a
        # full 64 MB quota, 283k rows, with the file in the page cache; more from a cold
        # SD card).
        self._rows = 0
        # The file's bytes per message byte, measured as rows come (never under 1): the
        # quota counted message bytes alone, and the file with its log ran to twice it.
        self._ratio = 1.0
        self._puts = self._measured_at = 0
        self._going: dict[int, tuple[Priority, int]] = {}
        """Rows handed to the session and not yet acknowledged (`going`): priority, size."""
        self._page = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        wal = 0
        if quota_bytes >= _FILE_QUOTA_FROM:
            wal = min(_WAL_MAX, max(_WAL_MIN, quota_bytes // _WAL_SHARE))
        self._room = quota_bytes - (wal + _LOG_SLACK if wal else 0)
        """What the rows may cost, in file bytes: the quota less the log's share."""
        if wal:
            self._bound_log(wal)
        self._recount()

    @property
    def _bytes(self) -> int:
        return sum(self._held.values())

    def _bound_log(self, wal: int) -> None:
        # Checkpointed at `wal` bytes, and cut back to them after: the log is otherwise
        # left at its largest, 4 MB or more, whatever the quota.
        self._db.execute(f"PRAGMA wal_autocheckpoint = {max(1, wal // self._page)}")
        self._db.execute(f"PRAGMA journal_size_limit = {wal}")

    def _measure(self) -> None:
        """Read what the rows cost in the file, per message byte (its pages in use)."""
        if self._room == self.quota_bytes or self._bytes < _MEASURE_FROM:
            return  # a quota of message bytes, or too few to tell the schema from the rows
        self._measured_at = self._puts
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
        self._ratio = max(1.0, (int(pages) - int(free)) * self._page / self._bytes)

    def _fits(self, size: int) -> bool:
        return (self._bytes + size) * self._ratio <= self._room

    def _recount(self) -> None:
        """Read the bytes and rows waiting from the file (at open, and after a rollback)."""
        held = dict.fromkeys(Priority, 0)
        count = 0
        rows = self._db.execute(
            "SELECT priority, SUM(size), COUNT(*) FROM messages GROUP BY priority"
        )
        for priority, total, n in rows.fetchall():
            held[Priority(priority)] = int(total)
            count += int(n)
        self._held = held
        self._rows = count
        self._measure()

    def put(
        self,
        topic: str,
        payload: bytes,
        priority: Priority,
        qos: int = 1,
        retain: bool = False,
    ) -> int | None:
        """Queue a message; drop older, lower-priority ones if the quota needs room.

        Returns:
            The message's sequence number, or None when the message itself was dropped
            (counted) because everything waiting is worth more.
        """
        size = len(topic) + len(payload)
        with self._lock:
            try:
                seq = self._put(topic, payload, priority, qos, retain, size)
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
                raise  # a closed outbox or a bug, not the disk
            except sqlite3.Error as exc:
                self._undo()  # a refused COMMIT after a drop leaves here, not through _put's
                self._refused[priority] += 1
                self._write_failed("put", exc)
                return None
            self.refusing = False
            return seq

    def _put(
        self, topic: str, payload: bytes, priority: Priority, qos: int, retain: bool, size: int
    ) -> int | None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if retain:
                self._supersede(topic)
            self._make_room(size, priority)
            cursor = self._db.execute(
                "INSERT INTO messages (topic, payload, qos, retain, priority, created_at, size)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (topic, payload, qos, int(retain), int(priority), self._clock(), size),
            )
            self._db.execute("COMMIT")
        except _DroppedError:
            # Keep the evictions and the drop count: they happened (and are counted).
            self._db.execute("COMMIT")
            return None
        except BaseException:
            self._undo()
            raise
        self._held[priority] += size
        self._rows += 1
        self._puts += 1
        if self._puts % _MEASURE_EVERY == 0:
            self._measure()
        seq = cursor.lastrowid
        assert seq is not None
        return seq

    def _supersede(self, topic: str) -> None:
        # Inside the caller's transaction. A retained message says what is so now, and the
        # broker keeps only the last one per topic: older ones still waiting are worth
        # nothing. Sent, a day's outage replayed every occupancy change of the day to Home
        # Assistant as if it were happening now, firing its automations hundreds of times.
        rows = self._db.execute(
            "SELECT seq, size, priority FROM messages WHERE topic = ? AND retain = 1", (topic,)
        ).fetchall()
        for seq, size, priority in rows:
            self._db.execute("DELETE FROM messages WHERE seq = ?", (seq,))
            self._held[Priority(priority)] -= size
            self._rows -= 1
            self._going.pop(seq, None)  # the session delivers it; its row is gone

    def _undo(self) -> None:
        # sqlite has already rolled back a COMMIT the disk refused: a second ROLLBACK would
        # raise and hide the first error. The running byte counts are read again either way.
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
        with contextlib.suppress(sqlite3.Error):
            self._recount()

    def _write_failed(self, what: str, exc: sqlite3.Error) -> None:
        self.refusing = True
        if not self._refused_said.ready():
            return
        log_event(
            log,
            logging.ERROR,
            "outbox_write_failed",
            operation=what,
            error=str(exc),
            refused=sum(self._refused.values()),
            path=str(self.path),
            fix="free space on the state disk, or check that it is writable",
        )

    def _make_room(self, size: int, priority: Priority) -> None:
        # Inside the caller's transaction. Drop the least valuable first: telemetry,
        # then results, oldest first; answers and events only when nothing else is left.
        if self._fits(size):
            return
        # Measured every few puts here, not every few hundred: evicting telemetry from
        # between results leaves pages part-empty, and the file grew by that while the
        # last measurement said there was room (1.07x the quota). Not every put: the two
        # reads doubled a put's p95 at the quota.
        if self._puts - self._measured_at >= _MEASURE_EVICTING:
            self._measure()
            if self._fits(size):
                return
        # What is on its way is not dropped for room: it leaves at its acknowledgement.
        # Evicted, it reached the broker all the same and was counted dropped, and a slow
        # uplink at the quota sends the oldest first, the very rows eviction takes first.
        going = sum(n for p, n in self._going.values() if p >= priority)
        evictable = sum(held for p, held in self._held.items() if p >= priority) - going
        if not self._fits(size - evictable):
            # Even dropping everything cheaper would not make room: the new message is the drop,
            # and nothing is evicted for nothing.
            self._count_drop(priority)
            raise _DroppedError
        # The cheapest first, oldest first within each: one priority at a time, so each
        # lookup walks the (priority, seq) index instead of sorting the table.
        for cheapest in sorted((p for p in Priority if p >= priority), reverse=True):
            while not self._fits(size):
                row = self._oldest_staying(cheapest)
                if row is None:
                    break
                self._db.execute("DELETE FROM messages WHERE seq = ?", (row[0],))
                self._held[cheapest] -= row[1]
                self._rows -= 1
                self._count_drop(cheapest)
        if not self._fits(size):
            # Only if the counts were off (they come from the file again): the new one drops.
            self._recount()
            self._count_drop(priority)
            raise _DroppedError

    def _oldest_staying(self, priority: Priority) -> tuple[int, int] | None:
        """The oldest row of `priority` not on its way, as (seq, size)."""
        # One read of at most the rows in flight and one more (a pump's batch).
        rows = self._db.execute(
            "SELECT seq, size FROM messages WHERE priority = ? ORDER BY seq LIMIT ?",
            (int(priority), len(self._going) + 1),
        ).fetchall()
        return next(((seq, size) for seq, size in rows if seq not in self._going), None)

    def going(self, queued: Queued) -> None:
        """`queued` was handed to the session: it stays until `ack`, never dropped for room
        (the session delivers it whatever happens to its row)."""
        with self._lock:
            self._going[queued.seq] = (queued.priority, len(queued.topic) + len(queued.payload))

    def _count_drop(self, priority: Priority) -> None:
        self._db.execute(
            "INSERT INTO dropped (priority, count) VALUES (?, 1)"
            " ON CONFLICT(priority) DO UPDATE SET count = count + 1",
            (int(priority),),
        )

    def peek(self, limit: int = 100, after: int = 0) -> list[Queued]:
        """The oldest waiting messages after sequence `after`, in order; nothing is removed."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, topic, payload, qos, retain, priority, created_at FROM messages"
                " WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return _queued(rows)

    def peek_answers(self, limit: int = 100, after: int = 0) -> list[Queued]:
        """The oldest command answers (topics ending `/resp`) after `after`: what may go
        ahead of a backlog. Found through their own index: behind a day's events and
        results, a scan of the critical rows would not reach them."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, topic, payload, qos, retain, priority, created_at FROM messages"
                " WHERE substr(topic, -5) = '/resp' AND seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return _queued(rows)

    def newest(self, priority: Priority, after: int = 0) -> Queued | None:
        """The newest waiting message of `priority` after `after`, or None: the telemetry
        that may go ahead of a backlog. One step down the (priority, seq) index, however
        long the backlog."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, topic, payload, qos, retain, priority, created_at FROM messages"
                " WHERE priority = ? AND seq > ? ORDER BY seq DESC LIMIT 1",
                (int(priority), after),
            ).fetchall()
        found = _queued(rows)
        return found[0] if found else None

    def ack(self, seqs: list[int]) -> None:
        """Forget messages the broker has acknowledged."""
        if not seqs:
            return
        with self._lock:
            marks = ",".join("?" * len(seqs))
            try:
                self._db.execute("BEGIN IMMEDIATE")
                freed = self._db.execute(
                    f"SELECT priority, SUM(size), COUNT(*) FROM messages WHERE seq IN ({marks})"
                    " GROUP BY priority",
                    seqs,
                ).fetchall()
                self._db.execute(f"DELETE FROM messages WHERE seq IN ({marks})", seqs)
                self._db.execute("COMMIT")
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
                raise  # a closed outbox or a bug, not the disk
            except sqlite3.Error as exc:
                # They stay, to be sent again after a restart: at least once, never lost.
                self._undo()
                self._write_failed("ack", exc)
                return
            for priority, size, count in freed:
                self._held[Priority(priority)] -= int(size)
                self._rows -= int(count)
            for seq in seqs:
                self._going.pop(seq, None)

    def stats(self) -> OutboxStats:
        """Depth, bytes, the drop counters and the oldest message's age."""
        with self._lock:
            depth = self._rows
            # The first row, one step down the key: the oldest waiting, as sent first.
            first = self._db.execute(
                "SELECT created_at FROM messages ORDER BY seq LIMIT 1"
            ).fetchone()
            oldest = first[0] if first is not None else None
            drops = dict(self._db.execute("SELECT priority, count FROM dropped").fetchall())
            held = self._bytes
            refused = dict(self._refused)

        def dropped(priority: Priority) -> int:
            return int(drops.get(int(priority), 0)) + refused[priority]

        return OutboxStats(
            depth=depth,
            bytes=held,
            quota_bytes=self.quota_bytes,
            dropped_critical=dropped(Priority.CRITICAL),
            dropped_result=dropped(Priority.RESULT),
            dropped_telemetry=dropped(Priority.TELEMETRY),
            oldest_age_s=max(0.0, self._clock() - oldest) if oldest is not None else 0.0,
        )

    def move_to_disk(self) -> bool:
        """Held in memory: open the file again and move every waiting message into it.

        The messages keep their order, after any the file held from before, but not their
        sequence numbers: call it only with no sequence number outstanding (nothing sent
        and not yet acked, no `peek` cursor to keep).

        Returns:
            Whether the outbox is on disk now.
        """
        if self.on_disk:
            return True
        try:
            disk = open_sqlite(self.path, _SCHEMA)
        except (OSError, sqlite3.OperationalError):
            return False  # still refused: the start said so, and every try would say it again
        with self._lock:
            try:
                moved = self._copy_into(disk)
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    disk.close()
                log_event(log, logging.WARNING, "outbox_move_failed", error=str(exc))
                return False
            self._db.close()
            self._db = disk
            self.on_disk = True
            self._going.clear()  # called with nothing in flight; the numbers start over
            self._recount()
        log_event(log, logging.WARNING, "outbox_on_disk", path=str(self.path), moved=moved)
        return True

    def _copy_into(self, disk: sqlite3.Connection) -> int:
        rows = self._db.execute(
            "SELECT topic, payload, qos, retain, priority, created_at, size FROM messages"
            " ORDER BY seq"
        ).fetchall()
        disk.execute("BEGIN IMMEDIATE")
        try:
            for topic in {row[0] for row in rows if row[3]}:
                # Newer than any retained message the file kept for that topic.
                disk.execute("DELETE FROM messages WHERE topic = ? AND retain = 1", (topic,))
            disk.executemany(
                "INSERT INTO messages (topic, payload, qos, retain, priority, created_at, size)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            disk.executemany(
                "INSERT INTO dropped (priority, count) VALUES (?, ?)"
                " ON CONFLICT(priority) DO UPDATE SET count = count + excluded.count",
                self._db.execute("SELECT priority, count FROM dropped").fetchall(),
            )
            disk.execute("COMMIT")
        except BaseException:
            if disk.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    disk.execute("ROLLBACK")
            raise
        return len(rows)

    def close(self) -> None:
        """Close the database; safe to call twice."""
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.close()


def _queued(rows: list[tuple[int, str, bytes, int, int, int, float]]) -> list[Queued]:
    return [
        Queued(seq, topic, bytes(payload), qos, bool(retain), Priority(priority), created)
        for seq, topic, payload, qos, retain, priority, created in rows
    ]


class _DroppedError(Exception):
    """Internal: the message being put was itself the one to drop."""
