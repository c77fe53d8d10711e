"""set_telemetry on a full state disk: the interval is in force, and the answer says it
could not be kept.

The record was written before the interval was applied, so a full disk kept the old
interval too, and the answer was `internal` with a traceback. A real agent on a real
mosquitto; the one write that fails (agent.json's) is the injected fault.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from edge_agent.comms.local_broker import LocalBroker
from tests.agent_kit import InProcessAgent, Watcher, write_config

DEVICE = "interval-dev"


def test_an_interval_that_cannot_be_saved_is_still_in_force_and_the_answer_says_so(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(
        tmp_path / "agent.toml",
        port=broker.port,
        device=DEVICE,
        state=tmp_path / "state",
        telemetry_s=60.0,
    )
    agent = InProcessAgent(config)
    w = Watcher(broker.port, DEVICE)
    try:
        w.wait_state(lambda s: s["online"])

        fsync = os.fsync

        def disk_full(fd: int) -> None:
            # The record's fsync fails as the kernel reports it: naming no file.
            if "agent.json" in str(Path(f"/proc/self/fd/{fd}").readlink()):
                raise OSError(errno.ENOSPC, "No space left on device")
            fsync(fd)

        monkeypatch.setattr(os, "fsync", disk_full)
        answer = w.final(w.send("set_telemetry", {"interval_s": 1.0}))
        assert answer["status"] == "error", answer
        assert answer["error"]["code"] == "path.unwritable"
        assert "1 s from now on" in answer["error"]["message"]
        assert "agent.json" in answer["error"]["message"]
        assert w.ok("get_status")["telemetry_interval_s"] == 1.0
        # In force on the wire: telemetry now comes every second, not every minute.
        sent = len(w.on("telemetry"))
        w.wait(lambda m: m.leaf == "telemetry" and m.json()["interval_s"] == 1.0, 5.0)
        w.wait(lambda m: len(w.on("telemetry")) >= sent + 2, 5.0, "two telemetry ticks")
    finally:
        w.close()
        agent.close()
