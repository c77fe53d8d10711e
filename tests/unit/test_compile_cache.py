"""The compile cache stays under its cap, least recently used first, and never loses a
pair's half or an entry a compile may be reading right now."""

from __future__ import annotations

import os
from pathlib import Path

from edge_agent.runtime.cache import prune

NOW = 2_000_000_000.0
DAY = 86400.0


def _file(path: Path, size: int, used: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (used, used))
    return path


def _ir(cache: Path, key: str, size: int, used: float) -> None:
    _file(cache / "ir" / f"{key}.xml", 100, used)
    _file(cache / "ir" / f"{key}.bin", size - 100, used)


def _left(cache: Path) -> set[str]:
    return {p.name for p in cache.rglob("*") if p.is_file()}


def test_the_least_recently_used_go_first_until_the_cache_fits(tmp_path: Path) -> None:
    _ir(tmp_path, "old", 1000, NOW - 30 * DAY)
    _ir(tmp_path, "mid", 1000, NOW - 10 * DAY)
    _ir(tmp_path, "new", 1000, NOW - 2 * DAY)
    _file(tmp_path / "compiled" / "1.blob", 1000, NOW - 20 * DAY)
    _file(tmp_path / "compiled" / "2.blob", 1000, NOW - 3 * DAY)
    _file(tmp_path / "models" / "wheel.whl", 5000, NOW - 90 * DAY)  # not the cache's to prune
    pruned = prune(tmp_path, max_bytes=2500, keep_recent_s=3600, clock=lambda: NOW)
    assert _left(tmp_path) == {"new.xml", "new.bin", "2.blob", "wheel.whl"}
    assert (pruned.removed, pruned.freed_bytes, pruned.kept_bytes) == (3, 3000, 2000)


def test_a_cache_under_its_cap_is_left_alone(tmp_path: Path) -> None:
    _ir(tmp_path, "a", 1000, NOW - 300 * DAY)
    _file(tmp_path / "compiled" / "1.blob", 1000, NOW - 300 * DAY)
    assert prune(tmp_path, max_bytes=2000, clock=lambda: NOW).removed == 0
    assert _left(tmp_path) == {"a.xml", "a.bin", "1.blob"}


def test_entries_used_in_the_last_hour_are_kept_over_the_cap(tmp_path: Path) -> None:
    # Another thread may have just found this IR and be about to compile it.
    _ir(tmp_path, "busy", 1000, NOW - 60)
    _ir(tmp_path, "idle", 1000, NOW - 2 * DAY)
    pruned = prune(tmp_path, max_bytes=0, keep_recent_s=3600, clock=lambda: NOW)
    assert _left(tmp_path) == {"busy.xml", "busy.bin"}
    assert pruned.kept_bytes == 1000


def test_a_read_counts_as_use(tmp_path: Path) -> None:
    # OpenVINO only reads its blobs: relatime records that in the access time.
    blob = _file(tmp_path / "compiled" / "read.blob", 1000, NOW - 30 * DAY)
    os.utime(blob, (NOW - DAY, NOW - 30 * DAY))
    _file(tmp_path / "compiled" / "unread.blob", 1000, NOW - 20 * DAY)
    prune(tmp_path, max_bytes=1000, keep_recent_s=0, clock=lambda: NOW)
    assert _left(tmp_path) == {"read.blob"}


def test_a_missing_cache_is_nothing_to_do(tmp_path: Path) -> None:
    assert prune(tmp_path / "nowhere", max_bytes=0).removed == 0
