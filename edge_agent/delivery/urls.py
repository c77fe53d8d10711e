"""Files a release names by http(s):// or file:// URL, with Range resume.

The path for very large models, where MQTT carries only the control. Bytes go
through the same `PartialTransfer` as MQTT chunks: checked chunk by chunk
against the signed release, with the same on-disk bitmap, so an interrupted
download resumes at the first missing chunk (an HTTP Range request).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from edge_agent.delivery.chunks import ChunkRef
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.errors import EdgeAgentError

Progress = Callable[[], None]


def fetch_url_files(
    partial: PartialTransfer,
    *,
    timeout_s: float = 30.0,
    cancel: threading.Event | None = None,
    on_chunk: Progress | None = None,
) -> None:
    """Fill in every missing chunk of every file that has a URL.

    Raises:
        EdgeAgentError: transfer.failed (unreachable, HTTP error), command.cancelled.
    """
    by_file: dict[str, list[ChunkRef]] = {}
    for ref in partial.chunks.refs:
        if ref.file.url and not partial.has(ref.index):
            by_file.setdefault(ref.file.path, []).append(ref)
    for refs in by_file.values():
        url = refs[0].file.url
        assert url is not None
        for run in _runs(refs):
            _fetch_run(partial, url, run, timeout_s, cancel, on_chunk)


def _runs(refs: list[ChunkRef]) -> list[list[ChunkRef]]:
    """Consecutive chunks, so each run is one request."""
    runs: list[list[ChunkRef]] = []
    for ref in refs:
        if runs and runs[-1][-1].index + 1 == ref.index:
            runs[-1].append(ref)
        else:
            runs.append([ref])
    return runs


def _fetch_run(
    partial: PartialTransfer,
    url: str,
    run: list[ChunkRef],
    timeout_s: float,
    cancel: threading.Event | None,
    on_chunk: Progress | None,
) -> None:
    start = run[0].offset
    end = run[-1].offset + run[-1].length  # exclusive
    parts = urlsplit(url)
    try:
        if parts.scheme == "file":
            with Path(unquote(parts.path)).open("rb") as fh:
                fh.seek(start)
                _consume(partial, fh.read, run, cancel, on_chunk)
            return
        request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            if response.status == 200 and start > 0:
                _skip(response.read, start)  # the server ignored Range: read past what we have
            elif response.status not in (200, 206):
                raise OSError(f"HTTP {response.status}")
            _consume(partial, response.read, run, cancel, on_chunk)
    except (OSError, urllib.error.URLError) as exc:
        raise EdgeAgentError(
            f"cannot download {url}: {exc}",
            "check the URL is reachable from this box; the pull resumes where it stopped",
            code="transfer.failed",
        ) from None


def _skip(read: Callable[[int], bytes], count: int) -> None:
    while count > 0:
        block = read(min(count, 1 << 20))
        if not block:
            raise OSError("the server closed the connection early")
        count -= len(block)


def _consume(
    partial: PartialTransfer,
    read: Callable[[int], bytes],
    run: list[ChunkRef],
    cancel: threading.Event | None,
    on_chunk: Progress | None,
) -> None:
    for ref in run:
        if cancel is not None and cancel.is_set():
            raise EdgeAgentError("the pull was cancelled", code="command.cancelled")
        data = _read_exactly(read, ref.length)
        if not partial.write(ref.index, data):
            raise EdgeAgentError(
                f"chunk {ref.index} of {ref.file.url} does not match the signed release",
                "the file at that URL is not the one the release was made from",
                code="transfer.digest",
            )
        if on_chunk is not None:
            on_chunk()


def _read_exactly(read: Callable[[int], bytes], size: int) -> bytes:
    blocks: list[bytes] = []
    left = size
    while left > 0:
        block = read(left)
        if not block:
            raise OSError(f"short read: {size - left} of {size} bytes")
        blocks.append(block)
        left -= len(block)
    return b"".join(blocks)
