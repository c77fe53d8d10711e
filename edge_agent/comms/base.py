"""The broker behind a three-method interface: publish, subscribe, stop.

Everything above comms (delivery, the agent, edge-fleet) talks to a
`Communicator`, never to paho, so it can be tested against the in-memory
`FakeBroker` (comms/fake.py) and run against a real broker (comms/session.py)
unchanged, the way Frigate's comms/base_communicator.py does it.

MQTT 5's request/response fields travel with a message (`response_topic`,
`correlation_data`); on an MQTT 3.1.1 session they are dropped on the wire, so
a protocol that needs them on 3.1.1 also puts them in its payload (see
delivery/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

MqttVersion = Literal["5", "3.1.1"]


@dataclass(frozen=True, slots=True)
class Message:
    """A message as received, detached from paho (safe to hand to another thread)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None
    expiry_s: int | None = None
    """MQTT 5: what was left of the sender's Message Expiry Interval when the broker sent
    it on. The broker counts it down on its own clock and drops the message once it runs
    out, so its presence says the message is within its lifetime, whatever the receiver's
    clock reads. None on 3.1.1, or when the sender set none."""


Handler = Callable[[Message], None]
"""Called on the session's dispatch thread, one message at a time: keep it short."""

Unsubscribe = Callable[[], None]


class Communicator(Protocol):
    """An MQTT session as the rest of edge-agent sees it."""

    mqtt_version: MqttVersion
    """The protocol on the wire, so a caller knows whether MQTT 5 properties arrive."""

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
    ) -> None:
        """Queue a message; never blocks on the network (QoS>0 survives a reconnect).
        `expiry_s` (MQTT 5 only): the broker drops it once it has held it that long."""

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Unsubscribe:
        """Deliver messages matching `topic_filter` (wildcards, `$share/<group>/...`) to
        `handler`, now and after every reconnect. Returns a function that undoes it."""

    def stop(self) -> None:
        """Disconnect cleanly and stop every thread; idempotent."""


def strip_share(topic_filter: str) -> str:
    """The filter a `$share/<group>/<filter>` subscription matches topics with."""
    if topic_filter.startswith("$share/"):
        parts = topic_filter.split("/", 2)
        return parts[2] if len(parts) == 3 else ""
    return topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT topic matching, with `+`, `#` and shared subscriptions (pure)."""
    pattern = strip_share(topic_filter).split("/")
    levels = topic.split("/")
    # A filter starting with a wildcard does not match $SYS-style topics (MQTT 4.7.2).
    if topic.startswith("$") and pattern and pattern[0] in ("+", "#"):
        return False
    for i, part in enumerate(pattern):
        if part == "#":
            return True
        if i >= len(levels):
            return False
        if part != "+" and part != levels[i]:
            return False
    return len(pattern) == len(levels)


def refusals(comm: Communicator) -> int:
    """Publishes of `comm`'s the broker took and refused so far: an MQTT 5 PUBACK with a
    failure reason (an ACL, a quota). 0 from one that cannot tell: on MQTT 3.1.1 a broker
    drops a refused publish in silence, and the fake broker refuses nothing."""
    return int(getattr(comm, "rejected", 0))


def last_refusal(comm: Communicator) -> str:
    """The broker's words for `comm`'s last refused publish, and the user it refused."""
    reason = getattr(comm, "last_refusal", None)
    said = f"{reason.getName()} (reason code {reason.value})" if reason is not None else "refused"
    user = getattr(getattr(comm, "settings", None), "username", None)
    return f"{said}, user {user or 'anonymous'}"
