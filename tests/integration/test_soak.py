"""The soak, short: tools/soak.py for 60 s, as its own process so that its memory and
thread counts are its own. The 30-minute run is `python tools/soak.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "tools" / "soak.py"


def test_a_minute_of_swaps_and_failing_sinks_holds_steady() -> None:
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--duration", "60", "--swap-every", "10",
         "--fail-every", "10", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["problems"] == [], report
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert report["swaps"] == 5
    assert report["raised"] > 0
    assert report["sink_failures"] == report["raised"]
    assert all(frames > 300 for frames in report["frames"].values())
    assert report["frame_failures"] == 0
    assert report["stop_s"] < 2.0
    assert report["leaked_threads"] == []
    assert report["rss_end_mb"] <= 1.1 * report["rss_start_mb"]
