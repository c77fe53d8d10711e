"""The last net under the CLI's one-line promise: an OSError's errno decides its code and fix.

Built from OSErrors as the kernel reports them (the suite runs as root, where a chmod
cannot make a read fail), so each mapping is checked on its own.
"""

from __future__ import annotations

import errno
import os

import pytest

from edge_agent.errors import from_os_error


def _os_error(number: int, path: str | None = "/var/lib/edge-agent/x") -> OSError:
    # OSError(errno, strerror, filename) returns the subclass the errno maps to.
    return OSError(number, os.strerror(number), path)


@pytest.mark.parametrize(
    ("number", "code", "needle"),
    [
        (errno.ENOENT, "input.not_found", "must exist"),
        (errno.EACCES, "path.denied", "may read it"),
        (errno.EPERM, "path.denied", "may read it"),
        (errno.ENOSPC, "path.unwritable", "free space"),
        (errno.EDQUOT, "path.unwritable", "quota"),
        (errno.EROFS, "path.unwritable", "read-only"),
        (errno.ENOTDIR, "path.unwritable", "a file stands where a folder"),
        (errno.EISDIR, "path.unwritable", "a file stands where a folder"),
        (errno.EIO, "error", "disk is healthy"),
    ],
)
def test_each_errno_gets_its_own_code_and_fix(number: int, code: str, needle: str) -> None:
    error = from_os_error(_os_error(number))
    assert error.code == code
    assert needle in error.fix
    assert "/var/lib/edge-agent/x" in error.problem
    assert os.strerror(number) in error.problem


def test_a_read_refused_is_not_sent_looking_for_disk_space() -> None:
    # The old net said "may write to ... its disk has room" for every path error, reads too.
    error = from_os_error(_os_error(errno.EACCES))
    assert "room" not in error.fix
    assert "space" not in error.fix
    assert error.code != "path.unwritable"


def test_an_error_about_no_path_is_not_blamed_on_one() -> None:
    error = from_os_error(_os_error(errno.ECONNRESET, None))
    assert error.code == "error"
    assert "path" not in error.fix


def test_both_paths_of_a_rename_are_named() -> None:
    exc = OSError(errno.EXDEV, os.strerror(errno.EXDEV), "/a/part", None, "/b/final")
    assert "/a/part -> /b/final" in from_os_error(exc).problem


@pytest.mark.parametrize(
    ("number", "needle"), [(errno.ENOSPC, "free space"), (errno.EROFS, "read-only")]
)
def test_a_full_or_read_only_disk_is_said_when_the_error_names_no_file(
    number: int, needle: str
) -> None:
    # A write or an fsync that fails so names no file; it was told to "see the log
    # above", with nothing logged.
    error = from_os_error(_os_error(number, None))
    assert error.code == "path.unwritable"
    assert needle in error.fix
