"""A pull in progress on disk: the release's files as they fill in, and a chunk bitmap.

Folder (below `Layout.transfers`, named `<name>-<version>-<release id>`):

    release.json      the signed release being pulled
    files/<path>      each file at its full size, chunks written in place
    chunks.bitmap     one bit per chunk, set once the chunk is written and hashed

Memory stays bounded whatever the model's size: one chunk at a time passes
through. A chunk's bit is set only after its bytes hashed to the release's
chunk hash and were written; on reopening, every set bit is checked again
against the bytes on disk (a local read, not a refetch), so a crash between
the data and the bitmap write, or a torn page after a power cut, costs that
one chunk and never admits a wrong byte. The whole-file sha256 is checked by
the store when it takes the files (`ModelStore.install(link=True)` hashes the
bytes it keeps), which is what the runtime then loads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import time
from pathlib import Path

from edge_agent.clock import is_set
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import write_all
from edge_agent.logs import log_event
from edge_agent.protocol.delivery import bit, set_bit
from edge_agent.store.release import SignedRelease, check_paths

log = logging.getLogger(__name__)

_BITMAP = "chunks.bitmap"
_RELEASE = "release.json"
_FOLDER = re.compile(r"^(?P<name>.+)-(?P<version>\d+)-(?P<rid>[0-9a-f]{16})$")
ABANDONED_S = 14 * 24 * 3600.0
"""A partial untouched this long is abandoned (its release long expired or replaced)."""


def sweep(root: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the partials below `root` that no pull will resume: every other one of
    `keep`'s model name (a newer or re-signed release replaced it), and any untouched
    for `ABANDONED_S`. A partial holds up to a whole model and counts against no quota.

    Ages come from the wall clock and file times, which an unset clock falsifies: one
    written before NTP synced once looked 55 years idle, and the resumable pull of a whole
    model over a metered link was thrown away. Times before `clock.CLOCK_FLOOR` (an unset
    clock) age nothing.

    Returns:
        The folders removed.
    """
    wanted = _FOLDER.fullmatch(keep.name)
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        found = list(root.iterdir())
    except OSError:
        return removed
    for folder in found:
        match = _FOLDER.fullmatch(folder.name)
        if folder == keep or match is None or not folder.is_dir():
            continue
        same_name = wanted is not None and match["name"] == wanted["name"]
        try:
            touched = max(p.stat().st_mtime for p in (folder, *folder.iterdir()))
        except (OSError, ValueError):
            touched = now
        # A clock stepped back since makes `idle` negative: kept, the safe side.
        idle = now - touched if is_set(now) and is_set(touched) else 0.0
        if same_name or idle > ABANDONED_S:
            shutil.rmtree(folder, ignore_errors=True)
            log_event(log, logging.INFO, "transfer_swept", folder=str(folder))
            removed.append(folder)
    return removed


def _own(path: Path) -> None:
    """Give `path` a file of its own, writable, if it shares one: the store takes a finished
    transfer's files by hard link and makes them read-only, and an install that failed or
    was cut short leaves them so. Written in place, they would change the store's bytes;
    and opened for writing by the agent's user, a read-only one failed every resume."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return
    if found.st_nlink <= 1:
        if not found.st_mode & stat.S_IWUSR:
            path.chmod(0o644)  # its own inode (a cut between the store's chmod and rename)
        return
    mine = path.with_name(f".{path.name}.own")
    try:
        shutil.copyfile(path, mine)
        mine.chmod(0o644)
        mine.replace(path)
    except BaseException:
        mine.unlink(missing_ok=True)  # a half copy on a full disk is no use to anyone
        raise


class PartialTransfer:
    """Open (or resume) the on-disk state of pulling `signed` into `folder`."""

    def __init__(self, folder: Path, signed: SignedRelease) -> None:
        release = signed.release
        check_paths(release)  # before any path from the release is joined to ours
        self.folder = folder
        self.files_dir = folder / "files"
        self.chunks = ChunkMap(release)
        self._fds: dict[str, int] = {}
        folder.mkdir(parents=True, exist_ok=True)
        stored = folder / _RELEASE
        if stored.exists() and stored.read_bytes() != signed.to_json():
            # Same name and id but different bytes cannot happen for one release id;
            # anything else there is debris: start over rather than mix two pulls.
            shutil.rmtree(self.files_dir, ignore_errors=True)
            (folder / _BITMAP).unlink(missing_ok=True)
        stored.write_bytes(signed.to_json())
        self._bitmap_fd = -1
        try:
            for entry in release.files:
                path = self.files_dir / entry.path
                path.parent.mkdir(parents=True, exist_ok=True)
                _own(path)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
                self._fds[entry.path] = fd
                if os.fstat(fd).st_size != entry.size:
                    os.ftruncate(fd, entry.size)  # sparse: no disk used until written
            self._bitmap_fd = os.open(folder / _BITMAP, os.O_RDWR | os.O_CREAT, 0o644)
            nbytes = (len(self.chunks) + 7) // 8
            raw = os.pread(self._bitmap_fd, nbytes, 0)
            self.bits = bytearray(raw.ljust(nbytes, b"\0"))
            self.resumed = self._recheck()
        except BaseException:
            # A pull that retries every minute (an EIO from a failing card, a full disk)
            # leaked a descriptor per file each time.
            self.close()
            raise
        self.received = sum(1 for i in range(len(self.chunks)) if bit(self.bits, i))

    def _recheck(self) -> int:
        """Re-hash every chunk the bitmap claims; clear those whose bytes are wrong."""
        kept = 0
        for ref in self.chunks.refs:
            if not bit(self.bits, ref.index):
                continue
            data = os.pread(self._fds[ref.file.path], ref.length, ref.offset)
            if hashlib.sha256(data).hexdigest() == ref.sha256:
                kept += 1
            else:
                self._mark(ref.index, False)
        if kept:
            log_event(log, logging.INFO, "transfer_resumed", folder=str(self.folder), chunks=kept)
        return kept

    # --- state -------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return len(self.chunks)

    @property
    def complete(self) -> bool:
        return self.received == self.count

    def has(self, index: int) -> bool:
        """Whether chunk `index` is stored; False for an index outside the release."""
        return 0 <= index < self.count and bit(self.bits, index)

    def missing(self) -> list[int]:
        return [i for i in range(self.count) if not bit(self.bits, i)]

    def missing_bitmap(self) -> bytearray:
        """Bit i set when chunk i is still missing (the Join message's `missing`)."""
        return bytearray(~b & 0xFF for b in self.bits)

    # --- writing -------------------------------------------------------------------------------
    def write(self, index: int, data: bytes) -> bool:
        """Store chunk `index` if it is new and hashes right.

        Returns:
            True if stored now; False for a duplicate or a chunk that does not match
            the release (dropped: it will be asked for again).
        """
        if not 0 <= index < self.count or bit(self.bits, index):
            return False
        if not self.chunks.matches(index, data):
            log_event(
                log, logging.WARNING, "transfer_bad_chunk", folder=str(self.folder), index=index
            )
            return False
        ref = self.chunks[index]
        write_all(self._fds[ref.file.path], data, ref.offset)
        self._mark(index, True)
        self.received += 1
        return True

    def _mark(self, index: int, on: bool) -> None:
        set_bit(self.bits, index, on)
        byte = index >> 3
        os.pwrite(self._bitmap_fd, bytes((self.bits[byte],)), byte)

    def sync(self) -> None:
        """Make what was written so far durable (called at the end and now and then)."""
        for fd in self._fds.values():
            os.fdatasync(fd)
        os.fdatasync(self._bitmap_fd)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._bitmap_fd >= 0:
            os.close(self._bitmap_fd)
            self._bitmap_fd = -1

    def finish(self) -> Path:
        """Sync and close a complete transfer; returns the folder holding its files.

        Raises:
            EdgeAgentError: transfer.failed if chunks are still missing.
        """
        if not self.complete:
            raise EdgeAgentError(
                f"transfer in {self.folder} is missing {self.count - self.received} chunks",
                "pull again; it resumes",
                code="transfer.failed",
            )
        self.sync()
        self.close()
        return self.files_dir

    def discard(self) -> None:
        """Remove the folder (after the store took the files, or to start over)."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)
