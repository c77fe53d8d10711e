"""An idle agent sleeps, and still stops at once.

A box with no pipeline running should cost nothing: every wake-up of a thread takes a
core out of its idle state. The agent's loops used to poll, about 26 wakes a second
with nothing to do: the signal watcher 10, the MQTT network loop 10, the main loop 4,
the outbox pump 2. Now each sleeps until something wakes it (a signal, a packet, a
deadline, a message to send), and a timeout only bounds a wake-up that never comes.

The agent runs as systemd runs it, a process stopped by SIGTERM, on a real mosquitto.
A thread's voluntary context switches (from /proc) count how often it went to sleep,
so how often it was woken.
"""

from __future__ import annotations

import time
from pathlib import Path

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import connect
from tests.agent_kit import AgentProcess, Watcher, write_config
from tests.broker import broker_settings

DEVICE = "idle-1"
WINDOW_S = 4.0
MAX_WAKES_PER_S = 8.0
"""Left now: the MQTT loop's keepalive step and the main loop's bound, 1 s each, and the
command queue's worker; the rest is margin. The polling loops made 26."""


def _sleeps(pid: int) -> int:
    """Voluntary context switches over all of `pid`'s threads."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue  # a thread that ended between the listing and the read
        total += sum(int(v.split()[1]) for v in lines if v.startswith("voluntary_ctxt_switches"))
    return total


def test_an_idle_agent_wakes_a_few_times_a_second_and_stops_at_once(
    broker: LocalBroker, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "agent.toml",
        port=broker.port,
        device=DEVICE,
        state=tmp_path / "state",
        telemetry_s=600.0,  # nothing due during the window
        keepalive=30,
    )
    watcher = Watcher(broker.port, DEVICE)
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        watcher.wait_state(lambda s: s["online"] is True, 60.0)  # the birth
        time.sleep(1.0)  # the start's own work (restore, first state) settles
        before, t0 = _sleeps(agent.pid), time.monotonic()
        time.sleep(WINDOW_S)
        rate = (_sleeps(agent.pid) - before) / (time.monotonic() - t0)
        assert rate < MAX_WAKES_PER_S, f"{rate:.1f} wakes a second while idle"

        # Asleep is not deaf: a command is answered at once, and SIGTERM stops it cleanly.
        sent = time.monotonic()
        assert watcher.ok("ping")["pong"] is True
        assert time.monotonic() - sent < 2.0
        assert agent.stop() == 0, agent.tail()
        watcher.wait_state(lambda s: s["online"] is False, 10.0)  # fails the test if it never comes
    finally:
        agent.close()
        watcher.close()


def test_the_network_loop_leaves_its_wait_at_once_on_stop(broker: LocalBroker) -> None:
    # Right after an acknowledged publish the loop has just begun a fresh wait of its full
    # timeout (1 s), so a stop that does not wake it would take about that long.
    session = connect(broker_settings(broker))
    try:
        session.publish("idle/probe", b"x", qos=1)
        assert session.flush(5.0)
        t0 = time.monotonic()
        session.stop(5.0)
        took = time.monotonic() - t0
    finally:
        session.stop(1.0)
    assert not session._net.is_alive()
    assert took < 0.5, f"the stop took {took:.2f} s"
