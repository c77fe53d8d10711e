"""A write that takes less than it was given is finished, or fails: never left short."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from edge_agent.fsio import write_all
from tests.disk_kit import files_capped_at


@pytest.mark.parametrize("offset", [None, 0], ids=["write", "pwrite"])
def test_a_short_write_is_not_taken_for_a_whole_one(tmp_path: Path, offset: int | None) -> None:
    # The kernel's file size limit makes the first write short (it stops at the limit) and
    # the next one fail, as a disk filling up does. A bare os.write returned 100 of 200
    # bytes and said nothing: the chunk or the copy was left with a hole.
    path = tmp_path / "blob"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with files_capped_at(100), pytest.raises(OSError, match="too large") as raised:
            write_all(fd, bytes(200), offset)
    finally:
        os.close(fd)
    assert raised.value.errno == errno.EFBIG
    assert path.stat().st_size == 100


def test_whole_writes_land_where_they_were_asked(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"abc")
        write_all(fd, b"XY", 1)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"aXY"
