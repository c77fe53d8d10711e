"""An in-memory broker and sessions for unit tests: no sockets, no threads.

Delivery is synchronous: a publish delivers to matching handlers before it
returns, and what handlers publish meanwhile is delivered in order after them
(a queue, not recursion, so a long exchange cannot overflow the stack).
Retained messages are kept, and as mosquitto does, the retain flag is set only on
what a subscription receives from that store, never on a message passed on live
(the fleet console tells a live birth from a stored one by it). Shared
subscriptions hand each message to one member of the group (round robin), and
MQTT 5 request/response fields pass through unless the session says 3.1.1.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict, deque

from edge_agent.comms.base import Handler, Message, MqttVersion, Unsubscribe, topic_matches


class FakeBroker:
    """Routes messages between `FakeCommunicator`s in one process."""

    def __init__(self) -> None:
        self.retained: dict[str, Message] = {}
        self.published: list[Message] = []
        self._subs: list[tuple[str, Handler, FakeCommunicator]] = []
        self._turn: defaultdict[str, itertools.count[int]] = defaultdict(itertools.count)
        self._queue: deque[Message] = deque()
        self._routing = False

    def connect(self, mqtt_version: MqttVersion = "5") -> FakeCommunicator:
        return FakeCommunicator(self, mqtt_version)

    def route(self, message: Message) -> None:
        self.published.append(message)
        self._queue.append(message)
        if self._routing:
            return
        self._routing = True
        try:
            while self._queue:
                self._route(self._queue.popleft())
        finally:
            self._routing = False

    def _route(self, message: Message) -> None:
        if message.retain:
            if message.payload:
                self.retained[message.topic] = message
            else:
                self.retained.pop(message.topic, None)
            message = dataclasses.replace(message, retain=False)
        shared: defaultdict[str, list[tuple[Handler, FakeCommunicator]]] = defaultdict(list)
        for topic_filter, handler, session in list(self._subs):
            if not topic_matches(topic_filter, message.topic):
                continue
            if topic_filter.startswith("$share/"):
                shared[topic_filter].append((handler, session))
            else:
                session.deliver(handler, message)
        for topic_filter, members in shared.items():
            handler, session = members[next(self._turn[topic_filter]) % len(members)]
            session.deliver(handler, message)

    def add(self, topic_filter: str, handler: Handler, session: FakeCommunicator) -> None:
        self._subs.append((topic_filter, handler, session))
        if not topic_filter.startswith("$share/"):
            for topic, message in list(self.retained.items()):
                if topic_matches(topic_filter, topic):
                    session.deliver(handler, message)

    def remove(self, topic_filter: str, handler: Handler, session: FakeCommunicator) -> None:
        self._subs = [s for s in self._subs if s != (topic_filter, handler, session)]


class FakeCommunicator:
    """A `Communicator` connected to a `FakeBroker`."""

    def __init__(self, broker: FakeBroker, mqtt_version: MqttVersion = "5") -> None:
        self.broker = broker
        self.mqtt_version: MqttVersion = mqtt_version
        self.stopped = False

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
        if self.stopped:
            return
        v5 = self.mqtt_version == "5"
        self.broker.route(
            Message(
                topic,
                bytes(payload),
                qos,
                retain,
                response_topic if v5 else None,
                correlation_data if v5 else None,
                max(1, expiry_s) if v5 and expiry_s is not None else None,
            )
        )

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Unsubscribe:
        self.broker.add(topic_filter, handler, self)
        return lambda: self.broker.remove(topic_filter, handler, self)

    def deliver(self, handler: Handler, message: Message) -> None:
        if self.stopped:
            return
        if self.mqtt_version != "5":  # a 3.1.1 subscriber never sees properties
            message = Message(message.topic, message.payload, message.qos, message.retain)
        handler(message)

    def stop(self) -> None:
        self.stopped = True
