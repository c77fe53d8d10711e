"""A slow uplink under a backlog: answers and fresh telemetry do not wait behind results.

The agent reaches mosquitto through a proxy that passes its bytes at 16 KB/s, a cellular
uplink (the broker's replies pass unthrottled); the console connects directly. The
agent's outbox starts with results an outage left, and some of that outage's telemetry:
about 15 s of sending at that rate. Measured with 14 cameras at 16 KB/s, a ping waited
4.2 s behind the batch of 200 results the pump had in flight (26-29 s at 2.5 KB/s), and
telemetry sat in line behind every result, the console's figures minutes old.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edge_agent.comms.local_broker import LocalBroker, free_port
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.outbox import Outbox, Priority
from tests.agent_kit import PREFIX, InProcessAgent, Watcher, write_config

RATE = 16_000
"""The uplink, bytes a second."""
RESULTS = 600
"""Results the outage left, about 420 bytes each with the topic: 250 KB, 16 s at RATE."""
TELEMETRY_EVERY = 100
"""One telemetry of the outage's every this many results."""
INTERVAL_S = 1.0
"""The agent's telemetry interval."""


class SlowUplink:
    """A TCP proxy to `target` that lets the client's bytes through at `rate` bytes a second
    (None: as fast as they come), each `delay_s` late (a satellite's or a congested cell's
    round trip, without taking from the rate); the server's go back unthrottled."""

    def __init__(self, target: int, rate: float | None, delay_s: float = 0.0) -> None:
        self.rate = rate
        self.delay_s = delay_s
        self.port = free_port()
        self._target = target
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, limited: bool) -> None:
        if limited and self.delay_s:
            self._delayed(source, sink)
            return
        with contextlib.suppress(OSError):
            while data := source.recv(1024 if limited else 65536):
                if limited and self.rate is not None:
                    time.sleep(len(data) / self.rate)
                sink.sendall(data)
        self._shut(source, sink)

    def _delayed(self, source: socket.socket, sink: socket.socket) -> None:
        # A line: each chunk leaves delay_s after it came, and no sooner than the rate
        # lets it follow the one before, so the link holds delay_s of bytes in flight.
        line: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

        def send() -> None:
            with contextlib.suppress(OSError):
                while (item := line.get()) is not None:
                    due, data = item
                    time.sleep(max(0.0, due - time.monotonic()))
                    sink.sendall(data)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        free_at = 0.0
        with contextlib.suppress(OSError):
            while data := source.recv(1024):
                now = time.monotonic()
                spacing = len(data) / self.rate if self.rate else 0.0
                free_at = max(now, free_at) + spacing
                line.put((free_at + self.delay_s, data))
        line.put(None)
        sender.join(self.delay_s + 5.0)
        self._shut(source, sink)

    @staticmethod
    def _shut(source: socket.socket, sink: socket.socket) -> None:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._server.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@dataclass
class Arrived:
    """One message as the console's stream got it."""

    leaf: str
    body: dict[str, Any]
    at: float


@dataclass
class Backlog:
    agent: InProcessAgent
    watcher: Watcher
    uplink: SlowUplink
    stream: list[Arrived]
    last_telemetry_n: int

    def results(self) -> int:
        return len({a.body["n"] for a in self.stream if a.leaf == "cam"})

    def own_telemetry(self) -> list[Arrived]:
        """The telemetry the agent made while the test ran (the outage's carry an `n`)."""
        return [a for a in self.stream if a.leaf == "telemetry" and "n" not in a.body]


@contextlib.contextmanager
def backlog_behind_a_slow_uplink(
    broker: LocalBroker,
    tmp_path: Path,
    *,
    rate: float = RATE,
    delay_s: float = 0.0,
    results: int = RESULTS,
    result_bytes: int = 360,
) -> Iterator[Backlog]:
    """An agent on an outbox an outage filled, behind a `RATE` uplink, and the stream of
    what it sends as the broker orders it (at QoS 0: the broker's queue for a QoS 1
    subscriber would drop part of the final burst). Each message of the outage carries
    `n`, its place in the outbox."""
    state = tmp_path / "state"
    outbox = Outbox(state / "outbox.sqlite")
    last_telemetry_n = 0
    made = time.time() - 3600.0
    for n in range(results + results // TELEMETRY_EVERY):
        if n % (TELEMETRY_EVERY + 1) == TELEMETRY_EVERY:
            body: dict[str, object] = {"n": n, "ts": made + n}
            outbox.put(f"{PREFIX}/dev-1/telemetry", json.dumps(body).encode(), Priority.TELEMETRY)
            last_telemetry_n = n
        else:
            body = {"n": n, "ts": made + n, "detections": "x" * result_bytes}
            outbox.put(f"{PREFIX}/dev-1/results/cam", json.dumps(body).encode(), Priority.RESULT)
    outbox.close()
    stream: list[Arrived] = []
    console: MqttSession = connect(BrokerSettings(port=broker.port))
    console.subscribe(
        f"{PREFIX}/dev-1/#",
        lambda m: stream.append(
            Arrived(m.topic.rsplit("/", 1)[-1], json.loads(m.payload), time.time())
        ),
        qos=0,
    )
    watcher = Watcher(broker.port, "dev-1")
    uplink = SlowUplink(broker.port, rate, delay_s)
    config = write_config(
        tmp_path / "agent.toml", port=uplink.port, state=state, telemetry_s=INTERVAL_S
    )
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"], timeout=30)
        yield Backlog(agent, watcher, uplink, stream, last_telemetry_n)
    finally:
        uplink.rate = None  # the stop flushes what it can
        agent.close()
        watcher.close()
        console.stop()
        uplink.close()


def test_an_answer_waits_behind_a_small_window_not_a_batch_of_results(
    broker: LocalBroker, tmp_path: Path
) -> None:
    with backlog_behind_a_slow_uplink(broker, tmp_path) as backlog:
        waited = []
        for _ in range(3):
            # One after the other: each asked just as the pump has sent its next results.
            sent = time.time()
            ping = backlog.watcher.send("ping")
            backlog.watcher.final(ping, timeout=20)
            answered = [m for m in backlog.watcher.on("resp") if m.json()["id"] == ping]
            waited.append(round(answered[0].at - sent, 2))
        assert max(waited) < 2.0, f"pings answered in {waited} s"
        assert backlog.results() < RESULTS, "the backlog was gone before the pings"


@pytest.mark.parametrize("acks", ["kept", "refused"])
def test_fresh_telemetry_goes_ahead_of_results_and_the_rest_keeps_its_place(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, acks: str
) -> None:
    with backlog_behind_a_slow_uplink(broker, tmp_path) as backlog:
        if acks == "refused":
            # A disk gone read-only: every row stays, and what went ahead must not go again.
            outbox = backlog.agent.service.outbox
            monkeypatch.setattr(outbox, "ack", lambda seqs: None)
        deadline = time.monotonic() + 10
        while len(backlog.own_telemetry()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        fresh = backlog.own_telemetry()
        lags = [round(a.at - a.body["ts"], 2) for a in fresh]
        assert len(fresh) >= 3, f"{len(fresh)} telemetry messages in 10 s (lags {lags})"
        # The console shows the newest: figures at most two intervals old.
        assert max(lags) < 2 * INTERVAL_S, f"telemetry {lags} s old on arrival"
        assert backlog.results() < RESULTS * 0.8, "the backlog was gone before the telemetry"

        backlog.uplink.rate = None
        deadline = time.monotonic() + 20
        while backlog.results() < RESULTS and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2 * INTERVAL_S)  # anything sent twice would be by now

    outage = [a.body["n"] for a in backlog.stream if "n" in a.body]
    assert sorted(outage) == list(range(RESULTS + RESULTS // TELEMETRY_EVERY)), "lost or twice"
    # In order, but for the newest telemetry waiting when the pump started: it may have
    # gone ahead of the rest (the agent's own came later), nothing else.
    ahead = {n for i, n in enumerate(outage) if any(later < n for later in outage[i + 1 :])}
    assert ahead <= {backlog.last_telemetry_n}, sorted(ahead)
    own = [a.body["ts"] for a in backlog.own_telemetry()]
    assert len(own) == len(set(own)), "telemetry sent twice"


def test_a_long_round_trip_keeps_the_link_busy(broker: LocalBroker, tmp_path: Path) -> None:
    # Sized by the rate it measured alone, the window shrank each batch on a link whose
    # round trip neared half a second, to its 4 KB floor: 4 KB a round trip, however fast
    # the link (7 KB/s of a 200 KB/s one here), where 200 messages a batch had kept up.
    results = 150  # 1.5 KB each: 230 KB, a second at the link's rate
    with backlog_behind_a_slow_uplink(
        broker, tmp_path, rate=200_000, delay_s=0.6, results=results, result_bytes=1500
    ) as backlog:
        started = time.monotonic()
        while backlog.results() < results and time.monotonic() - started < 30:
            time.sleep(0.05)
        took = time.monotonic() - started
    assert backlog.results() == results
    # paho keeps 20 QoS 1 messages in flight: 30 KB a 0.6 s round trip, 5 s for all of
    # them; at 4 KB a round trip they took over half a minute.
    assert took < 15.0, f"{results} results took {took:.1f} s behind a 0.6 s round trip"
