"""What a quick_check verdict is taken for: a read the card failed, or a damaged file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edge_agent.sqlite_files import open_sqlite, read_failed

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x BLOB);"


@pytest.mark.parametrize(
    ("verdict", "failed_read"),
    [
        # sqlite's own wording (checkTreePage): the page could not be fetched, and why.
        ("*** in database main ***\nPage 7: unable to get the page. error code=10", True),
        ("*** in database main ***\nPage 7: unable to get the page. error code=266", True),
        # A short read: the file is shorter than its pages say, as a copy cut short.
        ("*** in database main ***\nPage 7: unable to get the page. error code=522", False),
        ("*** in database main ***\nPage 7: unable to get the page. error code=11", False),
        ("*** in database main ***\nPage 51: btreeInitPage() returns error code 11", False),
        ("wrong # of entries in index sqlite_autoindex_t_1", False),
    ],
)
def test_only_an_io_error_on_a_read_is_a_failed_read(verdict: str, failed_read: bool) -> None:
    assert read_failed(verdict) is failed_read


def test_a_page_found_bad_sets_the_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x BLOB)")
    db.executemany("INSERT INTO t VALUES (?)", [(bytes(500),) for _ in range(2_000)])
    db.commit()
    db.close()
    with path.open("r+b") as f:  # a bad sector in the middle of the table
        f.seek(4096 * 50)
        f.write(b"\xff" * 4096)
    fresh = open_sqlite(path, SCHEMA)
    try:
        assert fresh.execute("SELECT COUNT(*) FROM t").fetchone() == (0,)
    finally:
        fresh.close()
    assert [p.name.split("-")[0] for p in tmp_path.glob("log.sqlite.damaged-*")] == [
        "log.sqlite.damaged"
    ]
