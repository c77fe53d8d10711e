"""Input files read whole, bounded: a regular file of at most the reader's cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.input_files import FileTooLargeError, NotRegularFileError, read_bounded


def test_a_file_of_the_cap_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    assert read_bounded(path, 100) == b"x" * 100
    with pytest.raises(FileTooLargeError, match="holds 100 bytes"):
        read_bounded(path, 99)


def test_a_file_longer_than_its_size_says_is_read_no_further_than_the_cap() -> None:
    # A regular file of size 0 that reads on for gigabytes: what a file growing between
    # its size check and its read looks like.
    with pytest.raises(FileTooLargeError, match="grew past 4,097 bytes"):
        read_bounded(Path("/proc/self/pagemap"), 4096)


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/", "a folder")])
def test_what_is_not_a_regular_file_is_refused(path: str, kind: str) -> None:
    with pytest.raises(NotRegularFileError, match=f"it is {kind}, not a regular file"):
        read_bounded(Path(path), 1 << 20)
