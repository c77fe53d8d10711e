"""Opening the agent's sqlite files (the outbox, the command log) so that a damaged one
never keeps the service down.

A file that is not a database, or whose pages are malformed (a bad sector, a copy cut
short, another program's file at that path), raised out of the agent's start: systemd
restarted it into the same error until its start limit, and the box ran nothing until
someone ran `systemctl reset-failed`. Both files hold what can be lost before the box's
service can: the command log is a cache of answers, and the outbox's messages are worth
less than every message after them. So the file is kept aside for the operator, said
once at ERROR, and a new one is made. A file that cannot be opened at all (a read-only
or full disk, permissions) is not damaged, and `open_sqlite` raises; `open_or_in_memory`
holds the tables in memory instead, so the box still comes online.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import time
from pathlib import Path

from edge_agent.logs import error_text, log_event

log = logging.getLogger(__name__)


def open_sqlite(path: Path, schema: str) -> sqlite3.Connection:
    """Connect to `path` in WAL mode (synchronous=NORMAL) with `schema` applied.

    Raises:
        sqlite3.OperationalError, OSError: the file cannot be opened or written at all.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _open(path, schema)
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:  # not a database, or malformed
        aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
        path.replace(aside)
        for end in ("-wal", "-shm"):  # a log of pages that belong to the damaged file
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + end).replace(aside.with_name(aside.name + end))
        log_event(
            log,
            logging.ERROR,
            "sqlite_damaged",
            path=str(path),
            kept_as=aside.name,
            detail=str(exc),
            fix="nothing to do: a new file was made; the old one is kept for a post-mortem",
        )
        return _open(path, schema)


def open_or_in_memory(path: Path, schema: str, held: str) -> tuple[sqlite3.Connection, bool]:
    """`open_sqlite`, or a database in memory with `schema` when the disk refuses the file.

    After a clean stop the -wal and -shm files are gone, and opening a WAL database must
    make the -shm again: a full disk failed that with `disk I/O error`, a read-only one with
    `unable to open database file`, and the agent exited at start, again on every restart
    until systemd's start limit left the box down. Said once at ERROR.

    Args:
        held: What holding the tables in memory costs, for the log line.

    Returns:
        The connection, and whether it is the file's.
    """
    try:
        return open_sqlite(path, schema), True
    except (OSError, sqlite3.OperationalError) as exc:
        log_event(
            log,
            logging.ERROR,
            "sqlite_in_memory",
            path=str(path),
            error=error_text(exc),
            held=held,
            fix="free space on the state disk, or check that it is mounted writable",
        )
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    db.executescript(schema)
    return db, False


def _open(path: Path, schema: str) -> sqlite3.Connection:
    # isolation_level=None: callers run their own BEGIN/COMMIT. check_same_thread=False:
    # callers serialise every use under their own lock.
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
        # Pages the header does not show as bad: read them all once, at start (about a
        # second for a full 64 MB outbox on an SD card).
        (verdict,) = db.execute("PRAGMA quick_check(1)").fetchone()
        if verdict != "ok":
            if read_failed(verdict):
                # A read that failed (EIO on a flaky card), not a page known bad: the file
                # may be whole, and is not set aside for it.
                raise sqlite3.OperationalError(f"quick_check: {verdict}")
            raise sqlite3.DatabaseError(f"quick_check: {verdict}")
    except BaseException:
        db.close()
        raise
    return db


_SQLITE_IOERR = 10
_SQLITE_IOERR_SHORT_READ = 522
_UNREAD = re.compile(r"unable to get the page\. error code=(\d+)")


def read_failed(verdict: str) -> bool:
    """Whether a quick_check verdict says a page could not be read, rather than that one is bad.

    sqlite writes `Page N: unable to get the page. error code=RC` for any page it could not
    fetch. An I/O error (RC's primary code SQLITE_IOERR) is the card failing a read, which may
    pass on the next start. SQLITE_CORRUPT there is damage, and so is a short read: a file
    shorter than its own pages say, as a copy cut short leaves it.
    """
    return any(
        int(code) & 0xFF == _SQLITE_IOERR and int(code) != _SQLITE_IOERR_SHORT_READ
        for code in _UNREAD.findall(verdict)
    )
