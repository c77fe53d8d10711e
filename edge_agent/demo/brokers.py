"""The demo's broker: `--broker URL`, else a private mosquitto, else an embedded amqtt.

mosquitto is the usual path (`make demo` installs it when it can) and speaks
MQTT 5. amqtt is a maintained pure-Python broker for machines where nothing
can be installed system-wide, but it speaks only MQTT 3.1.1 (it refuses a v5
CONNECT) and has no shared subscriptions, so with it the demo runs every
session on 3.1.1 and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from edge_agent.comms.base import MqttVersion
from edge_agent.comms.local_broker import LocalBroker, find_mosquitto, free_port
from edge_agent.comms.settings import BrokerSettings
from edge_agent.errors import EdgeAgentError


class RunningBroker(Protocol):
    def close(self) -> None:
        """Stop the broker if the demo started it."""


@dataclass(frozen=True, slots=True)
class BrokerChoice:
    """Where the demo's sessions connect, and what started the broker."""

    settings: BrokerSettings
    kind: str
    """`url`, `mosquitto` or `amqtt`: printed, so the operator knows what ran."""
    running: RunningBroker | None

    @property
    def version(self) -> MqttVersion:
        return self.settings.version

    def close(self) -> None:
        if self.running is not None:
            self.running.close()


class EmbeddedAmqtt:
    """amqtt on a free loopback port, on its own event loop thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        from amqtt.broker import Broker

        self.host = host
        self.port = free_port(host)
        config: dict[str, Any] = {
            "listeners": {"default": {"type": "tcp", "bind": f"{host}:{self.port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        self._loop = asyncio.new_event_loop()
        # Made on the loop's own thread, with the loop set there: Broker() makes the future
        # that tells its broadcast loop to stop on the thread's current loop, and one made
        # here, on another loop, never woke it. Every shutdown then waited out amqtt's 5 s
        # timeout, and logged a traceback, after the demo had finished.
        self._make = Broker
        self._config = config
        self._broker: Broker | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="amqtt", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._broker = broker = self._make(self._config, loop=self._loop)
            self._loop.run_until_complete(broker.start())
        except BaseException as exc:  # reported by start() on the caller's thread
            self._failed = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def start(self, timeout: float = 10.0) -> None:
        """Raises: EdgeAgentError broker.unreachable if it does not listen in time."""
        self._thread.start()
        # Broker.start() returns once its listener is bound: no probe connection needed
        # (amqtt logs an error for a connection that sends nothing).
        if self._ready.wait(timeout) and self._failed is None:
            return
        raise EdgeAgentError(
            f"the embedded amqtt broker did not start: {self._failed or 'no listener'}",
            "install mosquitto (apt-get install mosquitto) or pass --broker URL",
            code="broker.unreachable",
        )

    def close(self) -> None:
        if not self._thread.is_alive() or self._broker is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._broker.shutdown(), self._loop)
        with contextlib.suppress(Exception):
            future.result(5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


def _amqtt_available() -> bool:
    try:
        import amqtt.broker  # noqa: F401
    except ImportError:
        return False
    return True


def choose_broker(
    url: str | None, version: MqttVersion | None, embedded: bool = False
) -> BrokerChoice:
    """The broker the demo uses, started if it is ours.

    Args:
        url: `--broker URL`: use that broker, start nothing.
        version: `--mqtt-version`; default 5 (3.1.1 on amqtt, which has nothing else).
        embedded: use amqtt even where mosquitto is installed.

    Raises:
        EdgeAgentError: broker.unreachable when there is no URL, no mosquitto and no amqtt.
    """
    fast = {"reconnect_min_s": 0.2, "reconnect_max_s": 2.0}
    if url:
        settings = BrokerSettings.from_url(url, version=version or "5", **fast)
        return BrokerChoice(settings, "url", None)
    if not embedded and find_mosquitto() is not None:
        broker = LocalBroker()
        broker.start()
        settings = BrokerSettings(
            host=broker.host, port=broker.port, version=version or "5", **fast
        )
        return BrokerChoice(settings, "mosquitto", broker)
    if embedded and not _amqtt_available():
        raise EdgeAgentError(
            "the embedded broker needs amqtt, which is not installed",
            "pip install 'edge-agent[demo]', or drop --embedded-broker",
            code="install.incomplete",
        )
    if _amqtt_available():
        if version == "5":
            raise EdgeAgentError(
                "the embedded amqtt broker speaks only MQTT 3.1.1",
                "drop --mqtt-version 5, install mosquitto, or pass --broker URL",
                code="input.invalid",
            )
        server = EmbeddedAmqtt()
        server.start()
        settings = BrokerSettings(host=server.host, port=server.port, version="3.1.1", **fast)
        return BrokerChoice(settings, "amqtt", server)
    raise EdgeAgentError(
        "no MQTT broker: mosquitto is not installed and no --broker URL was given",
        "run `make demo` as root (it apt-installs mosquitto), `sudo apt-get install mosquitto`, "
        "pip install 'edge-agent[demo]' for the embedded broker, or pass --broker URL",
        code="broker.unreachable",
    )
