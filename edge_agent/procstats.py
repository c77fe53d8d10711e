"""The agent's own CPU, memory and the box's temperature, from /proc and /sys (Linux).

No psutil: three small files tell all of it, and reading them costs microseconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), from /proc/PID/statm."""
    statm = Path(f"/proc/{pid or os.getpid()}/statm")
    try:
        resident_pages = int(statm.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def status_bytes(pid: int | None = None) -> dict[str, int]:
    """The memory lines of /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile, ...) in bytes,
    for this process by default; empty once the process is gone (an exited process, a zombie,
    has no memory map left to report)."""
    try:
        text = Path(f"/proc/{pid or os.getpid()}/status").read_text()
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields = value.split()
        if len(fields) == 2 and fields[1] == "kB":
            found[key] = int(fields[0]) * 1024
    return found


def hottest_celsius(root: Path = Path("/sys/class/thermal")) -> float | None:
    """The hottest thermal zone in degrees C, or None where the box exposes none."""
    readings = []
    for zone in root.glob("thermal_zone*/temp"):
        try:
            readings.append(int(zone.read_text().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    return max(readings) if readings else None


def usable_cpus(
    cgroups: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")
) -> float:
    """CPUs this process may use, not the box's count: its affinity (a cgroup's cpuset,
    `taskset`, a unit's CPUAffinity=), or less where its cgroup's CPU quota says so (a
    unit's CPUQuota=150% is 1.5)."""
    try:
        cpus = float(max(1, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):  # not Linux
        cpus = float(max(1, os.cpu_count() or 1))
    quota = cgroup_cpu_quota(cgroups, own)
    return cpus if quota is None else min(cpus, quota)


def cgroup_cpu_quota(cgroups: Path, own: Path) -> float | None:
    """The tightest CPU quota (cgroup v2 `cpu.max`, in CPUs) over this process's cgroup and
    its parents; None with no quota, or no cgroup v2."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    tightest: float | None = None
    folder = cgroups / path.lstrip("/")
    for where in (folder, *folder.parents):
        try:
            quota, period = (where / "cpu.max").read_text().split()
            if quota != "max" and int(period) > 0:
                share = int(quota) / int(period)
                tightest = share if tightest is None else min(tightest, share)
        except (OSError, ValueError):
            pass
        if where == cgroups:
            break
    return tightest


class CpuMeter:
    """Process CPU over the interval since the last call: 100 means one core busy."""

    def __init__(self) -> None:
        self._last_cpu = time.process_time()
        self._last_wall = time.monotonic()

    def percent(self) -> float:
        """CPU percent since the previous call (or since construction)."""
        cpu, wall = time.process_time(), time.monotonic()
        used, spent = cpu - self._last_cpu, wall - self._last_wall
        self._last_cpu, self._last_wall = cpu, wall
        return max(0.0, 100.0 * used / spent) if spent > 0 else 0.0
