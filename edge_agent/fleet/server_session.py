"""The MQTT session of a fleet server: `edge-fleet serve`'s, and the demo's embedded one.

A server's presence is retained and its will clears it. After every reconnect the server
announces itself again (a broker restarted without persistence forgot it) and counts on
only the peers whose presence the broker sends again (`FleetServer.on_connected`). Wired
by `serve` alone, the demo's server did neither after a broker restart mid-demo: its
releases' pullers saw no broadcaster, and a peer gone meanwhile was counted for good.
"""

from __future__ import annotations

from collections.abc import Callable

from edge_agent.comms.session import MqttSession, Will, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.fleet.server import FleetServer
from edge_agent.protocol.topics import Topics


def connect_server(
    settings: BrokerSettings, topics: Topics, instance: str, *, fail_fast: bool = True
) -> tuple[MqttSession, Callable[[FleetServer], None]]:
    """Connect the session of the fleet server `instance`.

    Args:
        fail_fast: As `connect`'s: `serve`, which may start before its broker, passes False.

    Returns:
        The session, and `started`: to be called with the server once its `start()` has
        run; every reconnect from then on calls the server's `on_connected`. Not before:
        at the first connect the server is not started yet, and it announces as it starts.
    """
    started: list[FleetServer] = []

    def connected(_session: MqttSession) -> None:
        for running in started:
            running.on_connected()

    session = connect(
        settings,
        fail_fast=fail_fast,
        will=lambda: Will(topics.server(instance), b"", retain=True),
        on_connected=connected,
    )
    return session, started.append
