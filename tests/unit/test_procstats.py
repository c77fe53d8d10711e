"""Process figures come from the real /proc and /sys of this machine."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edge_agent.procstats import (
    CpuMeter,
    cgroup_cpu_quota,
    hottest_celsius,
    rss_bytes,
    status_bytes,
    usable_cpus,
)


@contextmanager
def _fresh_pages(size: int = 64 * 1024 * 1024) -> Iterator[None]:
    """Make `size` bytes of new anonymous memory resident for the duration of the block.

    Straight from the kernel, not from malloc: late in the suite the heap holds hundreds of MB
    that earlier tests freed but malloc kept, and it serves a 64 MiB request from those
    resident pages before it maps new ones. A numpy array then left RSS unchanged to the byte
    (one CI run saw exactly that).
    """
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(pages, dtype=np.uint8)
    view[:] = 1  # written, so every page is faulted in
    try:
        yield
    finally:
        del view
        pages.close()


def test_rss_grows_with_memory_we_touch() -> None:
    before = rss_bytes()
    with _fresh_pages():
        after = rss_bytes()
    assert before > 10 * 1024 * 1024
    assert after - before > 48 * 1024 * 1024


def test_status_reads_bytes_that_move_with_the_heap_and_nothing_for_a_gone_process() -> None:
    before = status_bytes()
    with _fresh_pages():
        after = status_bytes()
    assert after["RssAnon"] - before["RssAnon"] > 48 * 1024 * 1024  # the heap grew, in bytes
    assert after["VmHWM"] >= after["VmRSS"] > after["RssAnon"] > 0
    assert abs(after["VmRSS"] - after["RssAnon"] - after["RssFile"]) < 16 * 1024 * 1024
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert status_bytes(int(child.stdout)) == {}  # exited and reaped


def test_cpu_meter_sees_a_busy_loop_and_an_idle_sleep() -> None:
    meter = CpuMeter()
    # Spin for 0.2 s of CPU time, not wall time, so a busy machine only stretches the loop.
    start = time.process_time()
    while time.process_time() - start < 0.2:
        pass
    busy = meter.percent()
    time.sleep(0.3)
    idle = meter.percent()
    assert busy > 25.0
    assert idle < 10.0


def test_temperature_reads_the_hottest_zone(tmp_path: Path) -> None:
    for i, milli in enumerate(("41000", "57500", "garbage")):
        zone = tmp_path / f"thermal_zone{i}"
        zone.mkdir()
        (zone / "temp").write_text(milli + "\n")
    assert hottest_celsius(tmp_path) == 57.5
    assert hottest_celsius(tmp_path / "none") is None


def test_a_cgroup_quota_under_the_cpus_is_what_the_agent_may_use(tmp_path: Path) -> None:
    # Under CPUQuota=150% on a box of many cores, the agent at 150% has taken all it may:
    # counted out of the cores, it never read as full.
    cgroups = tmp_path / "cgroup"
    unit = cgroups / "system.slice" / "edge-agent.service"
    unit.mkdir(parents=True)
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/edge-agent.service\n")
    (cgroups / "cpu.max").write_text("max 100000\n")
    (unit / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_quota(cgroups, own) == 1.5
    assert usable_cpus(cgroups, own) == min(1.5, len(os.sched_getaffinity(0)))
    # A parent's quota binds too; "max" is none.
    (cgroups / "system.slice" / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_quota(cgroups, own) == 0.5
    (unit / "cpu.max").write_text("max 100000\n")
    (cgroups / "system.slice" / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(cgroups, own) is None
    assert usable_cpus(cgroups, own) == len(os.sched_getaffinity(0))
    # cgroup v1, or none: the affinity alone.
    own.write_text("12:cpu,cpuacct:/system.slice\n")
    assert cgroup_cpu_quota(cgroups, own) is None
    assert cgroup_cpu_quota(cgroups, tmp_path / "absent") is None
