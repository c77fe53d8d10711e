"""An input file read whole into memory, bounded: a regular file, never more than a cap.

Sources read files a spec names, and over MQTT whoever may command the box writes the
spec. A reader with no bound held whatever it was given: a WAV source on /dev/zero
grew the agent until the OOM killer picked it, and again at every restore; a FIFO
blocked the opening thread for good. Each reader picks its own cap (what the largest
real input of its kind is); how a file is read within it is decided here, once.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


class InputFileError(ValueError):
    """The file is not one a reader takes whole; the message says why, naming no path."""


class NotRegularFileError(InputFileError):
    """A device, a FIFO, a socket or a folder: read whole, some never end."""


class FileTooLargeError(InputFileError):
    """Over the reader's cap, said before it was read (or as it grew past it)."""


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file at `path`, if it holds `limit` bytes at most.

    Args:
        path: The file; a symlink is followed.
        limit: The most bytes read.

    Raises:
        NotRegularFileError: before anything is read.
        FileTooLargeError: its size says so (before anything is read), or it grew past
            `limit` while read (no more than `limit` + 1 bytes are).
        OSError: it cannot be opened or read.
    """
    # O_NONBLOCK: opening a FIFO for reading waits for a writer, which may never come.
    # It changes nothing for a regular file, and anything else is refused before a read.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    # The file opened, not whatever the name points at by now.
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "something else")
        raise NotRegularFileError(f"it is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > limit:
            raise FileTooLargeError(_too_large(info.st_size, limit))
        # One byte past the size tells a file that grew since (one still being written;
        # some in /proc say 0 and read on for gigabytes): it is read on, up to the limit
        # only. Asking for the limit every time would allocate it every time.
        data = file.read(info.st_size + 1)
        if len(data) > info.st_size:
            data += file.read(limit + 1 - len(data))
            if len(data) > limit:
                raise FileTooLargeError(_too_large(len(data), limit, grew=True))
    return data


def _too_large(size: int, limit: int, grew: bool = False) -> str:
    held = f"grew past {size:,} bytes as it was read" if grew else f"holds {size:,} bytes"
    return f"it {held}, over the {_mib(limit)} read at most"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
