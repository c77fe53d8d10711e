"""An agent whose disks refuse writes at start still comes online and runs its pipelines.

Each of these ended `edge-agent run` before the box came online, and every restart under
systemd met the same disk until the unit's start limit left it down for good:
- a restore that raised something other than an operator's error (OpenVINO's own, saving
  an IR on a full cache disk: every agent upgrade converts every model again);
- an outbox or command log whose file the state disk refused: after a clean stop the -shm
  file is gone, and opening a WAL database must make it again.
A full disk is the kernel's file size limit here (tests/disk_kit.py): no mount, no root.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge_agent.agent import pump as pump_module
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import CommandLog
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.outbox import Outbox, Priority
from tests.agent_kit import REPO, InProcessAgent, Watcher, cache_dir, write_config

_RESTORE_FAILED = "pipelines_restore_failed"


def test_a_restore_that_raises_leaves_the_agent_online_and_says_why(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(self: Pipelines) -> list[str]:
        raise RuntimeError("basic_ios::clear: iostream error")

    # A fault injected where no real one is left to find: the guard is for bugs not known.
    monkeypatch.setattr(Pipelines, "restore", broken)
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "state")
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        assert watcher.ok("ping")["pong"] is True
        time.sleep(0.5)
        assert agent.thread.is_alive()
        said = [r for r in caplog.records if getattr(r, "event", None) == _RESTORE_FAILED]
        assert len(said) == 1
        assert said[0].levelno == logging.ERROR
        assert said[0].exc_info is not None, "a bug keeps its traceback"
    finally:
        watcher.close()
        agent.close()


def test_an_outbox_the_disk_refuses_at_start_serves_from_memory_then_moves_to_disk(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pump_module, "MOVE_EVERY_S", 0.3)
    state = tmp_path / "state"
    # sqlite cannot open a folder: `unable to open database file`, as on a read-only disk
    # (whose permission bits root would ignore).
    (state / "outbox.sqlite").mkdir(parents=True)
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state)
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        outbox = agent.service.outbox
        assert not outbox.on_disk
        # Answers and telemetry go out from memory; the pump's place goes well past the
        # numbers the file will give.
        for _ in range(10):
            assert watcher.ok("ping")["pong"] is True
        watcher.wait(lambda m: m.leaf == "telemetry", what="telemetry from memory")
        said = [r for r in caplog.records if getattr(r, "event", None) == "sqlite_in_memory"]
        assert len(said) == 1
        (state / "outbox.sqlite").rmdir()  # the disk takes the file again
        deadline = time.monotonic() + 10
        while not outbox.on_disk and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outbox.on_disk
        assert (state / "outbox.sqlite").is_file()
        # The first messages the file numbers go out: the pump's place started over.
        assert watcher.ok("ping", timeout=5)["pong"] is True
        seen = len(watcher.on("telemetry"))
        watcher.wait(
            lambda m: m.leaf == "telemetry" and len(watcher.on("telemetry")) > seen,
            what="telemetry through the file",
        )
        assert agent.thread.is_alive()
    finally:
        watcher.close()
        agent.close()


_CAPPED_AGENT = """
import runpy, sys
from tests.disk_kit import cap_files
cap_files(int(sys.argv[1]))
sys.argv = ["edge-agent", *sys.argv[2:]]
runpy.run_module("edge_agent", run_name="__main__", alter_sys=True)
"""


def test_an_agent_started_on_full_disks_comes_online_and_runs_its_pipelines(
    broker: LocalBroker, tmp_path: Path, camera: str
) -> None:
    # An upgrade on a box whose disks are full: no IR for this OpenVINO version in the
    # cache, and the outbox and command log closed cleanly (no -shm) by the old agent.
    state, cache = tmp_path / "state", tmp_path / "cache"
    shutil.copytree(cache_dir() / "models" / "face-blazeface", cache / "models" / "face-blazeface")
    outbox = Outbox(state / "outbox.sqlite")
    outbox.put("edge/v1/dev-1/resp", b"{}", Priority.CRITICAL)
    outbox.close()
    CommandLog(state / "agent" / "commands.sqlite").close()
    spec = {
        "id": "cam",
        "model": {"name": "face-blazeface"},
        "source": {"type": "stream", "url": camera},
    }
    (state / "agent" / "agent.json").write_text(json.dumps({"seq": 1, "pipelines": {"cam": spec}}))
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state, cache=cache)
    watcher = Watcher(broker.port, "dev-1")
    agent = subprocess.Popen(
        # Past 16 KiB no file grows: the -shm files (32 KiB) and the IR cannot be written.
        [sys.executable, "-c", _CAPPED_AGENT, str(16 * 1024), "run", "--config", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    logged: list[str] = []
    reader = threading.Thread(target=lambda: logged.extend(agent.stderr or []), daemon=True)
    reader.start()
    try:
        watcher.wait_state(
            lambda s: [(p["id"], p["status"]) for p in s["pipelines"]] == [("cam", "running")],
            timeout=60,
        )
        watcher.wait(lambda m: m.leaf == "results/cam", timeout=30, what="a result")
        assert watcher.ok("ping")["pong"] is True
        assert agent.poll() is None
        assert not list((cache / "ir").glob("*.xml")), "the IR was compiled from memory"
    finally:
        watcher.close()
        agent.terminate()
        code = agent.wait(20)
        reader.join(5)
        if agent.stderr is not None:
            agent.stderr.close()
    said = "".join(logged)
    assert code == 0, said[-3000:]
    assert said.count("event=sqlite_in_memory") == 2, said[-3000:]  # the outbox, the log
    assert said.count("event=ir_cache_unwritable") == 1, said[-3000:]
