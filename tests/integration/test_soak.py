"""The soak, short: tools/soak.py for 40 s, as its own process so that its memory and
thread counts are its own. The 30-minute run is `python tools/soak.py`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SOAK = Path(__file__).resolve().parents[2] / "tools" / "soak.py"


def test_forty_seconds_of_swaps_and_failing_sinks_holds_steady() -> None:
    # A swap every 6 s: after the warm-up (2.5 swaps, 15 s) 25 s hold two periods of two
    # swaps, what the memory judgement needs, in 40 s of the suite's budget, not 60.
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--duration", "40", "--swap-every", "6",
         "--fail-every", "10", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["problems"] == [], report
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert report["swaps"] == 6
    assert report["raised"] > 0
    assert report["sink_failures"] == report["raised"]
    assert all(frames > 300 for frames in report["frames"].values())
    assert report["frame_failures"] == 0
    assert report["stop_s"] < 2.0
    assert report["leaked_threads"] == []
    assert report["rss_end_mb"] <= 1.1 * report["rss_start_mb"]
    # After its 15 s warm-up, 25 s hold two periods of two 6 s swaps (2 samples each).
    assert report["rss_judged_by"] == "period peaks"
    assert report["rss_growth"] <= 0.10
    # Every sample is split into heap and file-backed pages, which add up to it: within
    # the report's rounding to 0.1 MB each, and shared memory, of which there is next to none.
    rss, anon, files = (
        report[k] for k in ("rss_samples_mb", "rss_anon_samples_mb", "rss_file_samples_mb")
    )
    assert len(rss) == len(anon) == len(files) >= 8
    assert all(a > 0 for a in anon)
    assert all(f > 0 for f in files)
    assert all(abs(r - a - f) <= 2.0 for r, a, f in zip(rss, anon, files, strict=True))


def _soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_growth_is_judged_on_period_peaks_not_on_where_two_samples_land() -> None:
    growth = _soak_module().rss_growth
    # Memory swinging 200-230 MB with a period of 4 samples, no trend: a start on a trough
    # and an end on a crest read +15%, the peaks of the first and last period 0%.
    swing = [200.0, 215.0, 230.0, 215.0] * 6 + [230.0]
    assert swing[-1] / swing[0] - 1 == pytest.approx(0.15)
    assert growth(swing, 0, 4) == (0.0, "period peaks")
    # A real rise shows in the peaks too.
    rising = [v + 10 * (i // 4) for i, v in enumerate(swing)]
    rise, how = growth(rising, 0, 4)
    assert how == "period peaks"
    assert rise > 0.2
    # Too short for two periods: the last sample against the warm one.
    assert growth([200.0, 210.0, 220.0], 1, 4) == (220.0 / 210.0 - 1, "start and end")
