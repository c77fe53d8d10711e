"""QoS 1 messages from one publisher reach a subscriber in the order they were published.

The agent's outbox pump publishes results from its own thread while the session's
network thread writes acknowledgements and queued messages. paho's write path takes no
lock, so before the session routed every write through the network thread, two packets
now and then went out swapped: 1 to 7 times in 20,000 messages here, and once as
results 77, 76 in the agent-loop test. The judge is `mosquitto_sub`, a client we did not
write, reading a real mosquitto.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings

MESSAGES = 6_000
"""Swaps came 1 to 7 times in 20,000 messages: a count this size may see none. What fails
at any count is the writers check (a thread other than the network thread on the socket);
the order check is mosquitto_sub's word on the result."""
BATCH = 200  # as the outbox pump sends: a batch, then wait for the broker's acknowledgements


def _session(broker: LocalBroker) -> MqttSession:
    return connect(BrokerSettings(host=broker.host, port=broker.port))


def test_qos1_order_survives_a_busy_network_thread(broker: LocalBroker, tmp_path: Path) -> None:
    received = tmp_path / "received.txt"
    with received.open("w") as out:
        sub = subprocess.Popen(
            [
                *("mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-q", "1"),
                *("-t", "out/#", "-C", str(MESSAGES), "-W", "120"),
            ],
            stdout=out,
        )
    publisher = _session(broker)
    other = _session(broker)
    stop = threading.Event()
    writers: set[str] = set()
    try:
        # Keep the publisher's network thread writing: acknowledgements of incoming QoS 1.
        publisher.subscribe("in/#", lambda message: None, qos=1)

        def pound() -> None:
            while not stop.is_set():
                for _ in range(50):
                    other.publish("in/load", b"x", qos=1)
                other.flush(5.0)

        load = threading.Thread(target=pound, name="load", daemon=True)
        load.start()
        time.sleep(0.5)  # mosquitto_sub and the load are under way

        # Which threads put bytes on the publisher's socket (paho's one send call).
        client: Any = publisher._client
        send = client._sock_send

        def watched(data: bytes) -> int:
            writers.add(threading.current_thread().name)
            result: int = send(data)
            return result

        client._sock_send = watched
        for i in range(MESSAGES):
            publisher.publish(f"out/{i % 3}", str(i).encode(), qos=1)
            if i % BATCH == BATCH - 1:
                assert publisher.flush(30.0), "the broker stopped acknowledging"
        assert sub.wait(timeout=120) == 0, "mosquitto_sub did not get every message"
    finally:
        stop.set()
        sub.kill()
        other.stop()
        publisher.stop()
    numbers = [int(line) for line in received.read_text().split()]
    assert len(numbers) == MESSAGES
    swapped = [(a, b) for a, b in itertools.pairwise(numbers) if b < a]
    assert swapped == [], f"{len(swapped)} messages out of order, e.g. {swapped[:5]}"
    assert writers == {"mqtt-net"}, f"threads that wrote to the socket: {sorted(writers)}"
