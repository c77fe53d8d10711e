"""doctor on a disk that is full: said, not reported healthy.

On a 100 % full state disk `doctor` once answered problems [] and state_writable true: its
probe made an empty folder, which needs no data block, and nothing looked at free space.
The disk here refuses writes by the kernel's file size limit (tests/disk_kit.py), as a full
one does, and free space is the real figure of the test's own disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_agent.doctor import LOW_FREE_BYTES, collect, low_space
from edge_agent.paths import Layout
from tests.disk_kit import files_capped_at

MiB, GiB = 2**20, 2**30


def test_a_state_disk_that_takes_no_more_data_is_not_writable(tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    # Room for a file's name but not for a block of data, as on a disk at 100 %.
    with files_capped_at(1024):
        report = collect(layout)
    assert report.state_writable is False
    assert report.cache_writable is False
    assert any(
        p.startswith(f"state folder {layout.state} is not writable") for p in report.problems
    )
    assert [p.name for p in tmp_path.iterdir()] == []  # the probe left nothing behind


def test_free_space_is_reported_and_too_little_is_a_problem(tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    # A floor above what this disk has: the same disk, now too full for it.
    report = collect(layout, low_free_bytes=free + GiB)
    assert report.state_writable
    assert report.cache_writable
    assert report.state_free_bytes == pytest.approx(free, abs=256 * MiB)
    assert report.cache_free_bytes == pytest.approx(free, abs=256 * MiB)
    low = [p for p in report.problems if "MiB free" in p]
    assert [p.split(" has ")[0] for p in low] == [
        f"cache folder {layout.cache}",
        f"state folder {layout.state}",
    ]


@pytest.mark.parametrize(
    ("free", "total", "low"),
    [
        (LOW_FREE_BYTES - 1, 10 * GiB, True),  # under the floor
        (GiB, 10 * GiB, False),  # 10 %
        (GiB, 100 * GiB, True),  # 1 %: the floor alone is nothing on a large disk
        (0, 0, True),
    ],
)
def test_low_space_is_under_the_floor_or_under_five_percent(
    free: int, total: int, low: bool
) -> None:
    assert low_space(free, total) is low
