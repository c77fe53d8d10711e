"""The compile cache under a size cap: converted IRs (`ir/`) and OpenVINO's blobs (`compiled/`).

Every model version a box ever ran leaves a converted IR and a compiled blob or two (one
per hint) in the cache, and an OpenVINO upgrade orphans every blob at once. Nothing else
ever deletes them: a 50 MB model deployed weekly leaves 5-8 GB a year, on the disk the
outbox and the model store need. So after each compile the cache is cut back under
`CACHE_MAX_BYTES`, least recently used first. An entry that is deleted but wanted again is
converted or compiled again: a cache miss costs a compile, never a failure.

"Used" is the newest of a file's mtime and atime. An IR's access time is set on every
cache hit (openvino_backend; never its mtime, which OpenVINO's blob key includes);
OpenVINO only reads its blobs, which Linux's default `relatime` records once a day, and
with `noatime` the order falls back to when they were written.
Entries used within `KEEP_RECENT_S` are never deleted: a compile running on another
thread may be about to read the IR it just found.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_agent.logs import log_event

log = logging.getLogger(__name__)

CACHE_MAX_BYTES = 2 * 1024**3
"""What `ir/` and `compiled/` may hold together, for many models at both hints."""
KEEP_RECENT_S = 3600.0
"""Entries used this recently are kept whatever the cap says."""


@dataclass(frozen=True, slots=True)
class _Entry:
    files: tuple[Path, ...]
    """Deleted together: an IR's .xml and .bin, or one blob."""
    size: int
    used: float


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one pass deleted, and what the cache holds after it."""

    removed: int
    freed_bytes: int
    kept_bytes: int


def _used(stat: os.stat_result) -> float:
    return max(stat.st_mtime, stat.st_atime)


def _entries(cache_dir: Path) -> list[_Entry]:
    found: list[_Entry] = []
    for xml in (cache_dir / "ir").glob("*.xml"):
        pair = (xml, xml.with_suffix(".bin"))
        try:
            stats = [p.stat() for p in pair if p.exists()]
        except OSError:
            continue  # deleted meanwhile by another pass
        if stats:
            found.append(_Entry(pair, sum(s.st_size for s in stats), max(map(_used, stats))))
    compiled = cache_dir / "compiled"
    if compiled.is_dir():
        for blob in compiled.iterdir():
            try:
                stat = blob.stat()
            except OSError:
                continue
            if blob.is_file():
                found.append(_Entry((blob,), stat.st_size, _used(stat)))
    return found


def prune(
    cache_dir: Path,
    max_bytes: int | None = None,
    keep_recent_s: float | None = None,
    clock: Callable[[], float] = time.time,
) -> Pruned:
    """Delete the least recently used IRs and blobs until the cache holds `max_bytes`.

    Never raises: a cache that cannot be read or cut back is left as it is (and logged),
    since the compile that called this has already succeeded.
    """
    limit = CACHE_MAX_BYTES if max_bytes is None else max_bytes
    recent = KEEP_RECENT_S if keep_recent_s is None else keep_recent_s
    try:
        entries = sorted(_entries(cache_dir), key=lambda e: e.used)
    except OSError as exc:
        log_event(log, logging.WARNING, "cache_prune_failed", folder=str(cache_dir), error=str(exc))
        return Pruned(0, 0, 0)
    total = sum(e.size for e in entries)
    removed = freed = 0
    now = clock()
    for entry in entries:
        if total <= limit:
            break
        # Wall clock against file times: a clock stepped back makes every file look
        # recent (kept, the safe side); one stepped forward makes them look old.
        if now - entry.used < recent:
            continue
        try:
            for path in entry.files:
                path.unlink(missing_ok=True)
        except OSError as exc:
            log_event(log, logging.WARNING, "cache_prune_failed", error=str(exc))
            continue
        total -= entry.size
        freed += entry.size
        removed += 1
    if removed:
        log_event(
            log,
            logging.INFO,
            "cache_pruned",
            folder=str(cache_dir),
            removed=removed,
            freed_mb=round(freed / 2**20, 1),
            kept_mb=round(total / 2**20, 1),
        )
    return Pruned(removed, freed, total)


def touch(*paths: Path) -> None:
    """Mark cache files as used now, in their access time only.

    Not the modification time: OpenVINO keys a compiled blob on the model file's write
    time too, so touching an IR's mtime made the next compile of it miss its blob (found
    when test_second_compile_comes_from_cache failed whenever the touch crossed a second).
    A read-only cache is no reason to fail a compile.
    """
    for path in paths:
        with contextlib.suppress(OSError):
            stat = path.stat()
            os.utime(path, ns=(time.time_ns(), stat.st_mtime_ns))
