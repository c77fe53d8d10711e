"""Process figures come from the real /proc and /sys of this machine."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edge_agent.agent.procstats import CpuMeter, hottest_celsius, rss_bytes, status_bytes


def test_rss_grows_with_memory_we_touch() -> None:
    before = rss_bytes()
    block = np.ones(64 * 1024 * 1024, dtype=np.uint8)  # 64 MiB, written so it is resident
    after = rss_bytes()
    assert before > 10 * 1024 * 1024
    assert after - before > 48 * 1024 * 1024
    del block


def test_status_reads_bytes_that_move_with_the_heap_and_nothing_for_a_gone_process() -> None:
    before = status_bytes()
    block = np.ones(64 * 1024 * 1024, dtype=np.uint8)
    after = status_bytes()
    assert after["RssAnon"] - before["RssAnon"] > 48 * 1024 * 1024  # the heap grew, in bytes
    assert after["VmHWM"] >= after["VmRSS"] > after["RssAnon"] > 0
    assert abs(after["VmRSS"] - after["RssAnon"] - after["RssFile"]) < 16 * 1024 * 1024
    del block
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
