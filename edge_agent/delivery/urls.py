"""Files a release names by http(s):// or file:// URL, with Range resume.

The path for very large models, kept on a mirror the boxes reach directly. Bytes
go through the same `PartialTransfer` as MQTT chunks: checked chunk by chunk
against the signed release, with the same on-disk bitmap, so an interrupted
download resumes at the first missing chunk (an HTTP Range request).

The download runs in its own thread and the pull watches it, as it watches the
MQTT puller: a blocking read cannot be interrupted, and a server that trickles
a byte every 29 s never trips a socket timeout of 30 s. The pull stops watching
on a cancel or a stall; from then on the thread writes nothing (each write is
taken under the lock that `stop` takes), and it ends at its next read, which a
silent server holds for `timeout_s` at most (a socket timeout).

A file:// URL is read as the agent's user reads any file: a release that names one is
signed by the fleet's key, whose holder decides what the box runs anyway, and what it
reads is checked chunk by chunk and never leaves the box.
"""

from __future__ import annotations

import http.client
import os
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import unquote, urlsplit

from edge_agent.delivery.chunks import ChunkRef
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.errors import EdgeAgentError

READ_BLOCK = 64 * 1024
"""Bytes asked for per read: a stop, or a stall, is seen between two reads."""

NETWORK_ERRORS = (OSError, urllib.error.URLError, http.client.HTTPException, ValueError)
"""What a download can raise for the network or the server: http.client's IncompleteRead
and BadStatusLine are no OSError, and a URL urllib cannot parse is a ValueError."""


class UrlFetch:
    """Fill in every missing chunk of every file of `partial` that has a URL."""

    def __init__(self, partial: PartialTransfer, *, timeout_s: float = 30.0) -> None:
        self.partial = partial
        self.timeout_s = timeout_s
        self.done = threading.Event()
        self.error: EdgeAgentError | None = None
        """Why it ended early: transfer.digest (bytes not the release's) or transfer.failed
        (the server, the network, or the disk: then `__cause__` is the OSError)."""
        self._lock = threading.Lock()
        self._stopped = False
        self._runs = [run for refs in _by_file(partial) for run in _runs(refs)]
        self._thread = threading.Thread(target=self._run, name="url-fetch", daemon=True)

    @property
    def wanted(self) -> bool:
        """Whether any chunk is to come from a URL."""
        return bool(self._runs)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop now: nothing is written to the partial after this returns."""
        with self._lock:
            self._stopped = True
        self.done.set()

    def _run(self) -> None:
        try:
            for run in self._runs:
                if not self._fetch_run(run):
                    return
        except EdgeAgentError as exc:
            self.error = exc
        except Exception as exc:  # the pull reports it: a thread of its own never crashes it
            self.error = EdgeAgentError(
                f"downloading {self.partial.chunks.release.name} failed: {exc!r}",
                "pull again; it resumes",
                code="transfer.failed",
            )
        finally:
            self.done.set()

    def _fetch_run(self, run: list[ChunkRef]) -> bool:
        """One request for consecutive chunks; False once stopped."""
        url = run[0].file.url
        assert url is not None
        start = run[0].offset
        end = run[-1].offset + run[-1].length  # exclusive
        try:
            with _opened(url, start, end, self.timeout_s, self._halted) as read:
                for ref in run:
                    data = _read_exactly(read, ref.length)
                    if not self._write(ref, data):
                        return False
            return True
        except _Stopped:
            return False
        except NETWORK_ERRORS as exc:
            if isinstance(exc, _DiskError):
                raise EdgeAgentError(
                    f"cannot store {self.partial.chunks.release.name}: "
                    f"{exc.cause.strerror or exc.cause}",
                    "free space on the state disk, then deploy again",
                    code="transfer.failed",
                ) from exc.cause  # pull removes the partial when the disk is full
            raise EdgeAgentError(
                f"cannot download {url}: {exc}",
                "check the URL is reachable from this box; the pull resumes where it stopped",
                code="transfer.failed",
            ) from None

    def _halted(self) -> bool:
        return self._stopped

    def _write(self, ref: ChunkRef, data: bytes) -> bool:
        with self._lock:
            if self._stopped:
                return False
            try:
                stored = self.partial.write(ref.index, data)
            except OSError as exc:
                raise _DiskError(exc) from exc
        if not stored and not self.partial.has(ref.index):
            raise EdgeAgentError(
                f"chunk {ref.index} of {ref.file.url} does not match the signed release",
                "the file at that URL is not the one the release was made from",
                code="transfer.digest",
            )
        return True


class _Stopped(Exception):  # noqa: N818 (a stop, not an error)
    """The pull stopped watching: the download ends at this read."""


class _DiskError(OSError):
    """A write to the partial failed: the box's disk, not the server."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        self.cause = cause


Read = Callable[[int], bytes]


@contextmanager
def _opened(
    url: str, start: int, end: int, timeout_s: float, halted: Callable[[], bool]
) -> Iterator[Read]:
    """A reader of bytes [start, end) of `url`: a Range request, or a seek for file://.

    Every read first asks `halted`: a stopped download ends at its next read (within
    `timeout_s` of a silent server), not at the end of a chunk that trickles for days or
    of a prefix a server that ignores Range sends whole.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        # Not blocking, and a regular file only: a FIFO's open never returns, and no stop
        # could end the thread waiting in it.
        fd = os.open(unquote(parts.path), os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{parts.path} is not a regular file")
            fh.seek(start)
            yield _guarded(fh.read, halted)
        return
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        # read1: one socket read at most each, so a trickle is seen byte by byte, not as
        # one read of a whole chunk that comes back an hour later.
        read = _guarded(response.read1, halted)
        if response.status == 200 and start > 0:
            _skip(read, start)  # the server ignored Range: read past what we have
        elif response.status not in (200, 206):
            raise OSError(f"HTTP {response.status}")
        yield read


def _guarded(read: Read, halted: Callable[[], bool]) -> Read:
    def guarded(size: int) -> bytes:
        if halted():
            raise _Stopped
        return read(size)

    return guarded


def _by_file(partial: PartialTransfer) -> Iterator[list[ChunkRef]]:
    by_file: dict[str, list[ChunkRef]] = {}
    for ref in partial.chunks.refs:
        if ref.file.url and not partial.has(ref.index):
            by_file.setdefault(ref.file.path, []).append(ref)
    yield from by_file.values()


def _runs(refs: list[ChunkRef]) -> list[list[ChunkRef]]:
    """Consecutive chunks, so each run is one request."""
    runs: list[list[ChunkRef]] = []
    for ref in refs:
        if runs and runs[-1][-1].index + 1 == ref.index:
            runs[-1].append(ref)
        else:
            runs.append([ref])
    return runs


def _skip(read: Read, count: int) -> None:
    while count > 0:
        block = read(min(count, READ_BLOCK))
        if not block:
            raise OSError("the server closed the connection early")
        count -= len(block)


def _read_exactly(read: Read, size: int) -> bytes:
    blocks: list[bytes] = []
    left = size
    while left > 0:
        block = read(min(left, READ_BLOCK))
        if not block:
            raise OSError(f"short read: {size - left} of {size} bytes")
        blocks.append(block)
        left -= len(block)
    return b"".join(blocks)
