"""The flaky uplink, short: tools/soak_agent.py through one outage of each kind.

A real agent process with two realtime pipelines loses its broker three ways in turn: a
clean shutdown, a SIGKILL (a dropped connection) and a freeze (SIGSTOP: the socket stays
open and nothing answers, as a dead cellular link). The freeze lasts 13 s, so the agent's
5 s keepalive must notice it (within two keepalives, 10 s) and one reconnect hangs on the
frozen broker before the thaw.
After each, the agent must be back, answering and publishing, with its outbox drained and
nothing dropped; it must count exactly the links it lost, leak no descriptor or thread,
and stop cleanly. The long run (an hour of outages) is `python tools/soak_agent.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "tools" / "soak_agent.py"


def test_the_agent_rides_out_a_stopped_a_killed_and_a_frozen_broker() -> None:
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--cycles", "3", "--up-s", "4", "--down-s", "3",
         "--freeze-s", "13", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["problems"] == [], report
    assert proc.returncode == 0, proc.stderr[-2000:]
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
