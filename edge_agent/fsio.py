"""Crash-safe file primitives for the store: atomic writes, hashing copies, a lock, faults.

A crash (power cut, OOM kill, `kill -9`) may stop the agent between any two
system calls. Every change the store makes is therefore one `rename` of a
fully written, fsynced file or folder, followed by an fsync of the folder that
holds it, so the rename itself is durable: after a crash the old or the new
thing is there, never half of one.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge_agent.errors import EdgeAgentError

FAULT_ENV = "EDGE_AGENT_FAULT"
FAULT_EXIT = 99
_BLOCK = 1 << 20


def fault(step: str) -> None:
    """Test-only: die at `step` without cleanup when $EDGE_AGENT_FAULT names it.

    `os._exit` skips `finally` blocks and atexit, as a power cut or `kill -9` would.
    Read at call time, not import, so a test sets it per subprocess.
    """
    if os.environ.get(FAULT_ENV) == step:
        os._exit(FAULT_EXIT)


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    """Write all of `data` (at `offset`, when given): a write may take less than it was
    given (a disk filling up, a signal), and what it left out would be a hole the next
    hash finds only after the whole transfer or copy."""
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if done == 0:  # no error, and no room taken: treated as a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[done:]
        if offset is not None:
            offset += done


def fsync_dir(path: Path) -> None:
    """Make a rename or link inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Put a file another library wrote (OpenVINO's save_model) on the disk before a rename
    makes it visible under its final name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, step: str) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync the folder.

    `step` names the fault points `<step>.tmp_written` and `<step>.after_rename`.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    fault(f"{step}.tmp_written")
    tmp.replace(path)
    fault(f"{step}.after_rename")
    fsync_dir(path.parent)


def open_regular(path: Path) -> int:
    """Open a regular file for reading, refusing symlinks and anything not a plain file.

    Raises:
        EdgeAgentError: store.path for a link or special file, input.not_found if absent.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise EdgeAgentError(f"{path} does not exist", code="input.not_found") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EdgeAgentError(
                f"{path} is a symbolic link", "pass the file itself", "store.path"
            ) from None
        raise
    if not _is_regular(fd):
        os.close(fd)
        raise EdgeAgentError(f"{path} is not a regular file", code="store.path")
    return fd


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def copy_hashing(src: Path, dst: Path) -> tuple[str, int]:
    """Copy `src` to a new file `dst` (fsynced), returning the sha256 and size of what was
    written: the digest is of the very bytes that land in the store."""
    digest = hashlib.sha256()
    size = 0
    fd_in = open_regular(src)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            while block := os.read(fd_in, _BLOCK):
                digest.update(block)
                size += len(block)
                write_all(fd_out, block)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    return digest.hexdigest(), size


def hash_file(path: Path) -> tuple[str, int]:
    """sha256 and size of a regular file (links refused)."""
    digest = hashlib.sha256()
    size = 0
    fd = open_regular(path)
    try:
        while block := os.read(fd, _BLOCK):
            digest.update(block)
            size += len(block)
    finally:
        os.close(fd)
    return digest.hexdigest(), size


@contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive flock on `path`, waiting at most `timeout_s`.

    The kernel drops the lock when its holder dies, so a crashed deployment never
    blocks the next one; a live but stuck one is bounded by the caller's timeouts.

    Raises:
        EdgeAgentError: command.busy if the lock is not free in time.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not flock_within(fd, timeout_s):
            raise EdgeAgentError(
                f"another model update holds {path} for over {timeout_s:.0f} s",
                "wait for it to finish or time out, then retry",
                "command.busy",
            )
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def flock_within(fd: int, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Take an exclusive flock on `fd`, waiting at most `timeout_s`; whether it was taken.
    Polled, not blocking: a blocking flock cannot be given a time limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
