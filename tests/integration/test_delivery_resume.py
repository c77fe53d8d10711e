"""Interrupted transfers resume without fetching again what was verified.

- The broker is killed (SIGKILL) after the 15th chunk frame and comes back on
  the same port a second later.
- The puller process is killed (SIGKILL) after its 20th chunk frame, and a new
  one pulls again.
Both end with every chunk stored exactly once. The chunks that crossed the
wire twice are counted: at most the broadcast window was in flight.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from edge_agent.comms.base import Message
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.delivery.partial import ABANDONED_S, PartialTransfer
from edge_agent.delivery.pull import pull
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import FAULT_ENV, FAULT_EXIT
from edge_agent.paths import Layout
from edge_agent.protocol.delivery import Ack, Join, bitmap, decode_frame, encode_bits
from edge_agent.store.release import save_public_key
from edge_agent.store.store import ModelStore
from tests.agent_kit import InProcessAgent, write_config
from tests.broker import FAST, TOPICS, AfterFrames, Fleet, device_session

WINDOW = 4  # the broadcast window: at most this many frames are in flight to a device
REPO = Path(__file__).resolve().parents[2]


def test_broker_killed_mid_transfer_resumes(fleet: Fleet, tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    restart = threading.Timer(1.0, fleet.broker.start)

    def outage() -> None:
        fleet.broker.kill()
        restart.start()

    device = device_session(fleet.broker)
    cut = AfterFrames(device, 15, outage)
    try:
        result = pull(
            cut,
            ModelStore(layout),
            layout,
            "orient",
            device_id="dev-1",
            trusted_keys=[fleet.key.public_key()],
            options=FAST,
        )
    finally:
        device.stop()
        restart.join()
    assert device.reconnects >= 1
    stats = result.stats
    assert stats.stored == fleet.chunks  # every chunk stored once, none thrown away
    assert stats.rejoins + stats.repair_requests >= 1  # it had to ask again after the outage
    assert stats.duplicates <= WINDOW, f"{stats.duplicates} chunks were sent twice"
    print(
        f"broker outage: {stats.duplicates} chunks sent twice, {stats.rejoins} rejoins, "
        f"{stats.repaired} repaired"
    )


_CHILD = """
import os, signal, sys
from pathlib import Path
from edge_agent.delivery.pull import pull
from edge_agent.paths import Layout
from edge_agent.store.release import load_public_key
from edge_agent.store.store import ModelStore
from tests.broker import FAST, AfterFrames
from edge_agent.comms.session import connect
from edge_agent.comms.settings import BrokerSettings

port, state, pub = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
layout = Layout(cache=state / "cache", state=state)
session = AfterFrames(connect(BrokerSettings(port=port)), 20,
                      lambda: os.kill(os.getpid(), signal.SIGKILL))  # a real kill -9
pull(session, ModelStore(layout), layout, "orient", device_id="dev-9",
     trusted_keys=[load_public_key(pub)], options=FAST)
"""


def _pull_in_a_child(
    fleet: Fleet, tmp_path: Path, script: str, env: dict[str, str] | None = None
) -> tuple[Path, subprocess.CompletedProcess[bytes]]:
    """Run `script` (a pull of orient as dev-9) in its own process; its state folder and
    how it ended."""
    state = tmp_path / "state"
    pub = tmp_path / "fleet.pub"
    save_public_key(fleet.key.public_key(), pub)
    child = subprocess.run(
        [sys.executable, "-c", script, str(fleet.broker.port), str(state), str(pub)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=60,
        check=False,
        capture_output=True,
    )
    return state, child


def test_puller_killed_mid_transfer_resumes(fleet: Fleet, tmp_path: Path) -> None:
    state, child = _pull_in_a_child(fleet, tmp_path, _CHILD)
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    layout = Layout(cache=state / "cache", state=state)
    device = device_session(fleet.broker)
    try:
        result = pull(
            device,
            ModelStore(layout),
            layout,
            "orient",
            device_id="dev-9",
            trusted_keys=[fleet.key.public_key()],
            options=FAST,
        )
    finally:
        device.stop()
    stats = result.stats
    assert 15 <= stats.resumed < fleet.chunks  # kept from before the kill, re-hashed locally
    assert stats.resumed + stats.stored == fleet.chunks  # nothing fetched again
    assert stats.duplicates <= WINDOW, f"{stats.duplicates} chunks were sent twice"
    print(f"puller kill: resumed {stats.resumed}/{fleet.chunks}, {stats.duplicates} sent twice")


def test_the_agent_sweeps_abandoned_partials_at_start(broker: LocalBroker, tmp_path: Path) -> None:
    # A cancelled deploy of a model never deployed again left its partial (up to a whole
    # model, on no quota) until a pull of that name: the agent now sweeps at start, and
    # daily, what sat idle for ABANDONED_S. A fresh one stays, to be resumed.
    state = tmp_path / "state"
    transfers = state / "transfers"
    old = transfers / "gone-3-0123456789abcdef"
    fresh = transfers / "orient-1-fedcba9876543210"
    for folder in (old, fresh):
        folder.mkdir(parents=True)
        (folder / "m.onnx.part").write_bytes(b"\0" * 4096)
    idle = time.time() - ABANDONED_S - 3600
    for path in (old / "m.onnx.part", old):
        os.utime(path, (idle, idle))
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state)
    agent = InProcessAgent(config)
    try:
        deadline = time.monotonic() + 20
        while old.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not old.exists()
        assert (fresh / "m.onnx.part").exists()
    finally:
        agent.close()


def test_a_resumed_pull_waits_for_the_carousel_to_wrap(fleet: Fleet, tmp_path: Path) -> None:
    # Another box is pulling everything, acking each frame 0.2 s late: the carousel goes
    # at about 20 frames a second. dev-1 resumes lacking only chunk 0, which the carousel
    # has passed: it sees 51 frames it holds before the wrap brings chunk 0, longer than
    # its stall_s. Counted as no progress, those frames failed the pull as stalled.
    release = fleet.signed.release
    rid = ChunkMap(release).id
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    partial = PartialTransfer(layout.transfers / f"orient-1-{rid}", fleet.signed)
    data = (fleet.source / release.files[0].path).read_bytes()
    for ref in partial.chunks.refs[1:]:
        assert partial.write(ref.index, data[ref.offset : ref.offset + ref.length])
    partial.sync()
    partial.close()

    other = device_session(fleet.broker)
    passed_zero = threading.Event()
    control = TOPICS.own_control("other", "orient", 1)

    def on_frame(message: Message) -> None:
        frame = decode_frame(message.payload)
        if frame is None:
            return
        if frame.index >= 2:
            passed_zero.set()
        ack = Ack(device_id="other", seq=frame.seq).model_dump_json().encode()
        threading.Timer(0.2, other.publish, (control, ack), {"qos": 0}).start()

    other.subscribe(TOPICS.chunks("orient", 1), on_frame, qos=0)
    every = encode_bits(bitmap(fleet.chunks, list(range(fleet.chunks))))
    join = Join(device_id="other", release_id=rid, chunks=fleet.chunks, missing=every)
    other.publish(control, join.model_dump_json().encode(), qos=1)
    device = device_session(fleet.broker)
    try:
        assert passed_zero.wait(10.0)
        options = replace(FAST, stall_s=1.0)
        result = pull(device, ModelStore(layout), layout, "orient", device_id="dev-1",
                      trusted_keys=[fleet.key.public_key()], options=options)  # fmt: skip
    finally:
        device.stop()
        other.stop()
    assert result.installed
    assert result.stats.resumed == fleet.chunks - 1
    assert result.stats.stored == 1
    assert result.stats.duplicates >= 20  # it did wait through the frames it held


@pytest.mark.parametrize("step", ["install.staged", "install.blobs"])
def test_a_power_cut_in_the_install_keeps_the_transfer(
    fleet: Fleet, tmp_path: Path, step: str
) -> None:
    # The store took the finished transfer's files by rename: cut at `step`, they were in
    # the store's tmp folder (swept by the next update) or its blobs (collected), and the
    # next pull found its bitmap full and its files empty, and fetched the whole model again.
    state, child = _pull_in_a_child(fleet, tmp_path, _CHILD_PLAIN, {FAULT_ENV: step})
    assert child.returncode == FAULT_EXIT, child.stderr.decode()[-2000:]
    layout = Layout(cache=state / "cache", state=state)
    device = device_session(fleet.broker)
    try:
        result = pull(device, ModelStore(layout), layout, "orient", device_id="dev-9",
                      trusted_keys=[fleet.key.public_key()], options=FAST)  # fmt: skip
    finally:
        device.stop()
    assert result.installed
    assert result.stats.resumed == fleet.chunks  # every chunk kept, re-hashed locally
    assert result.stats.stored == 0
    store = ModelStore(layout)
    store.activate("orient", 1, None)
    assert store.verify() == []
    assert list(layout.transfers.iterdir()) == []


_CHILD_PLAIN = """
import sys
from pathlib import Path
from edge_agent.delivery.pull import pull
from edge_agent.paths import Layout
from edge_agent.store.release import load_public_key
from edge_agent.store.store import ModelStore
from tests.broker import FAST
from edge_agent.comms.session import connect
from edge_agent.comms.settings import BrokerSettings

port, state, pub = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
layout = Layout(cache=state / "cache", state=state)
pull(connect(BrokerSettings(port=port)), ModelStore(layout), layout, "orient",
     device_id="dev-9", trusted_keys=[load_public_key(pub)], options=FAST)
"""


def test_a_full_disk_while_a_failed_install_is_taken_back_removes_the_transfer(
    fleet: Fleet, tmp_path: Path
) -> None:
    # As an install cut after its blobs went into the store: the transfer's file is the
    # store's read-only inode. The next pull copies it for itself, and the disk fills half
    # way: the half copy stayed, and the transfer with it, holding the disk full.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    release = fleet.signed.release
    folder = layout.transfers / f"orient-1-{ChunkMap(release).id}"
    partial = PartialTransfer(folder, fleet.signed)
    data = (fleet.source / release.files[0].path).read_bytes()
    for ref in partial.chunks.refs:
        assert partial.write(ref.index, data[ref.offset : ref.offset + ref.length])
    partial.close()
    blobs = layout.store / "blobs"
    blobs.mkdir(parents=True)
    taken = folder / "files" / release.files[0].path
    os.link(taken, blobs / release.files[0].sha256)
    taken.chmod(0o444)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as tests/disk_kit.py does
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(data) // 2, hard))
    device = device_session(fleet.broker)
    try:
        with pytest.raises(EdgeAgentError) as caught:
            pull(device, ModelStore(layout), layout, "orient", device_id="dev-1",
                 trusted_keys=[fleet.key.public_key()], options=FAST)  # fmt: skip
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
        device.stop()
    assert caught.value.code == "transfer.failed"
    assert "free space" in caught.value.fix
    assert not folder.exists()


def test_a_transfer_file_left_read_only_is_made_writable_again(
    fleet: Fleet, tmp_path: Path
) -> None:
    # A cut between the store's chmod of the linked file and its rename into the store left
    # the transfer's file read-only, with no other link: every resume by the agent's own
    # user (not root) was refused it, until the transfer was swept 14 days later.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    folder = layout.transfers / f"orient-1-{ChunkMap(fleet.signed.release).id}"
    PartialTransfer(folder, fleet.signed).close()
    taken = folder / "files" / fleet.signed.release.files[0].path
    taken.chmod(0o444)
    PartialTransfer(folder, fleet.signed).close()
    assert taken.stat().st_mode & 0o200
