"""The soaks, short, as their own processes so that their memory, thread and descriptor
counts are their own: tools/soak.py for 34 s, and tools/soak_agent.py through one outage of
each kind. The long runs are `python tools/soak.py` (30 minutes) and `python
tools/soak_agent.py` (an hour of outages).

Both start together (`soaks`): each is mostly waiting (paced cameras, a broker that is
away), two paced pipelines each take a few percent of a core, and one after the other
they were 80 s of the suite's 15 minutes.

The flaky uplink: a real agent process with two realtime pipelines loses its broker three
ways in turn: a clean shutdown, a SIGKILL (a dropped connection) and a freeze (SIGSTOP:
the socket stays open and nothing answers, as a dead cellular link). The freeze lasts
13 s, so the agent's 5 s keepalive must notice it (within two keepalives, 10 s) and one
reconnect hangs on the frozen broker before the thaw. After each, the agent must be back,
answering and publishing, with its outbox drained and nothing dropped; it must count
exactly the links it lost, leak no descriptor or thread, and stop cleanly.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
SOAK = TOOLS / "soak.py"
SOAK_AGENT = TOOLS / "soak_agent.py"


class Soaks:
    """The two soak processes, started at once; `report` waits for one's last line.

    Their output goes to files: a pipe left unread while the other is waited for would
    fill, and stop its writer."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        # A swap every 5 s: after the warm-up (2.5 swaps; the sample at 15 s) the samples
        # at 15 to 30 s are two periods of two swaps, what the memory judgement needs, and
        # the end makes 8 samples. 34 s, not 35: a swap due at the very end may or may not run.
        self.pipelines = self._start(
            "soak", SOAK, "--duration", "34", "--swap-every", "5", "--fail-every", "10", "--json"
        )
        self.uplink = self._start(
            "uplink", SOAK_AGENT, "--cycles", "3", "--up-s", "3", "--down-s", "3",
            "--freeze-s", "13", "--json",
        )  # fmt: skip

    def _start(self, name: str, tool: Path, *args: str) -> subprocess.Popen[bytes]:
        out, err = self._folder / f"{name}.out", self._folder / f"{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            command = [sys.executable, str(tool), *args]
            return subprocess.Popen(command, stdout=stdout, stderr=stderr)

    def report(self, proc: subprocess.Popen[bytes]) -> tuple[dict[str, Any], int, str]:
        """The tool's JSON report, exit status and stderr."""
        code = proc.wait(timeout=300)
        name = "soak" if proc is self.pipelines else "uplink"
        out = (self._folder / f"{name}.out").read_text()
        err = (self._folder / f"{name}.err").read_text(errors="replace")
        assert out.strip(), err[-3000:]
        return json.loads(out.splitlines()[-1]), code, err

    def close(self) -> None:
        for proc in (self.pipelines, self.uplink):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def soaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Soaks]:
    running = Soaks(tmp_path_factory.mktemp("soaks"))
    yield running
    running.close()


def test_half_a_minute_of_swaps_and_failing_sinks_holds_steady(soaks: Soaks) -> None:
    report, code, err = soaks.report(soaks.pipelines)
    assert report["problems"] == [], report
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
    assert report["swaps"] == 6
    assert report["raised"] > 0
    assert report["sink_failures"] == report["raised"]
    assert all(frames > 300 for frames in report["frames"].values())
    assert report["frame_failures"] == 0
    assert report["stop_s"] < 2.0
    assert report["leaked_threads"] == []
    assert report["rss_end_mb"] <= 1.1 * report["rss_start_mb"]
    # From its warm sample at 15 s, two periods of two 5 s swaps (2 samples each).
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


def test_the_agent_rides_out_a_stopped_a_killed_and_a_frozen_broker(soaks: Soaks) -> None:
    report, code, err = soaks.report(soaks.uplink)
    assert report["problems"] == [], report
    assert code == 0, err[-2000:]
    cycles = report["cycles"]
    assert [c["outage"] for c in cycles] == ["stop", "kill", "freeze"]
    assert all(c["reconnected"] for c in cycles)
    # Back within the shortest delays: the backoff starts again after every lost link
    # (reconnect_min_s 0.2 s, max 2 s here), and a thawed broker answers the connect that
    # was waiting on it.
    assert all(c["online_s"] < 5.0 for c in cycles), cycles
    # Results made while the broker was away were buffered and sent: the outbox held them.
    # Seen in the freeze, which the console's own link lives through (its keepalive is
    # 30 s): after a stop or a kill the agent may be back, and its outbox empty, before the
    # console has subscribed again on the restarted broker (an hour's soak saw it once).
    assert cycles[2]["backlog"] > 10, cycles
    assert report["reconnects"] == report["connections"] == 3
    assert report["outbox_dropped"] == 0
    assert report["exit_code"] == 0
    assert report["tracebacks"] == 0
    assert min(report["results"].values()) > 100
