"""pytest plugin: a real mosquitto on a free loopback port, and a fleet serving a model.

Registered from conftest.py (`pytest_plugins`). Each test gets a fresh broker
(starting one takes tens of milliseconds); `broker.restart()` keeps the port,
so clients that were connected see an outage and must reconnect by themselves.
`fleet` adds an `edge-fleet serve` instance (in-process, on its own MQTT
session) that has published the reference model text-orientation as `orient`.
`ShippedBroker` is mosquitto as `systemd/mosquitto/` sets it up for a fleet: users,
passwords and the ACL.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.comms.base import Handler, Message, MqttVersion, Unsubscribe
from edge_agent.comms.local_broker import LocalBroker, find_mosquitto, free_port
from edge_agent.comms.session import MqttSession, Will, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.delivery.pull import PullOptions
from edge_agent.delivery.puller import PullerOptions
from edge_agent.fleet.publish import publish_release
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import SignedRelease, build_release, generate_key, sign

TOPICS = Topics()
SHIPPED_BROKER = Path(__file__).resolve().parents[1] / "systemd" / "mosquitto"
FAST = PullOptions(
    release_timeout_s=5.0, stall_s=30.0, puller=PullerOptions(idle_s=0.5, repair_timeout_s=1.0)
)
"""Pull timings for tests: an outage is noticed in half a second, not two."""


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    if find_mosquitto() is None:
        pytest.fail("mosquitto is not installed: run `make system-deps`")
    folder: Path = tmp_path_factory.mktemp("mosquitto")
    with LocalBroker(folder=folder) as running:
        yield running


class ShippedBroker(LocalBroker):
    """mosquitto with the shipped `edge-agent.conf` and ACLs, on free loopback ports.

    Only the listeners' ports and the folder of the files they name are changed, so a
    shipped line mosquitto refuses, or one that lets a box too far, fails the tests that
    use this. The boxes' listener is `port`, the fleet's `fleet_port`.

    Args:
        folder: For the config, the password files, the ACL and the log.
        boxes: The boxes' users and passwords (user name = device id).
        fleet: The fleet listener's users and passwords.
        acl_extra: Lines added to the boxes' ACL, as systemd/README.md has an operator
            add them (a group's members).
        fleet_acl_extra: Lines added to the fleet's ACL (a user of narrower rights).
    """

    def __init__(
        self,
        folder: Path,
        boxes: Mapping[str, str],
        fleet: Mapping[str, str],
        acl_extra: str = "",
        fleet_acl_extra: str = "",
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        super().__init__(folder=folder)
        self.fleet_port = self.port
        while self.fleet_port == self.port:
            self.fleet_port = free_port(self.host)
        for name, users in (("boxes.passwd", boxes), ("fleet.passwd", fleet)):
            path = folder / name
            path.write_text("")
            for user, password in users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
        for acl, extra in (("boxes.acl", acl_extra), ("fleet.acl", fleet_acl_extra)):
            (folder / acl).write_text((SHIPPED_BROKER / acl).read_text() + extra)
        config = (SHIPPED_BROKER / "edge-agent.conf").read_text()
        for shipped, here in (
            ("\nlistener 1883\n", f"\nlistener {self.port} {self.host}\n"),
            ("\nlistener 1884 127.0.0.1\n", f"\nlistener {self.fleet_port} {self.host}\n"),
            ("/etc/mosquitto/edge-agent/", f"{folder}/"),
        ):
            assert shipped in config, f"edge-agent.conf no longer has {shipped.strip()!r}"
            config = config.replace(shipped, here)
        # LocalBroker's own settings (log, no persistence), without its anonymous listener.
        own = self.config.read_text().splitlines(keepends=True)
        kept = [line for line in own if not line.startswith(("listener ", "allow_anonymous "))]
        self.config.write_text(config + "".join(kept))


def broker_settings(broker: LocalBroker, **kw: object) -> BrokerSettings:
    """Settings for `broker` that reconnect fast (tests take the broker away)."""
    return BrokerSettings.model_validate(
        {"port": broker.port, "reconnect_min_s": 0.05, "reconnect_max_s": 0.5, **kw}
    )


def device_session(broker: LocalBroker, version: MqttVersion = "5") -> MqttSession:
    return connect(broker_settings(broker, version=version))


@dataclass
class Fleet:
    broker: LocalBroker
    key: Ed25519PrivateKey
    repo: Repo
    signed: SignedRelease
    source: Path
    server: FleetServer
    session: MqttSession

    @property
    def chunks(self) -> int:
        return sum(len(f.chunks) for f in self.signed.release.files)


def signed_release(model: ResolvedModel, key: Ed25519PrivateKey, version: int = 1) -> SignedRelease:
    release = build_release(
        name="orient",
        version=version,
        folder=model.path.parent,
        files=[model.path.name],
        model=model.path.name,
        manifest=model.manifest,
    )
    return sign(release, key)


@pytest.fixture
def fleet(
    broker: LocalBroker, tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> Iterator[Fleet]:
    model = resolve("text-orientation")
    key = generate_key()
    signed = signed_release(model, key)
    repo = Repo(tmp_path / "repo")
    session = connect(
        broker_settings(broker), will=lambda: Will(TOPICS.server("s1"), b"", retain=True)
    )
    server = FleetServer(session, repo, instance="s1")
    server.start()
    publish_release(session, TOPICS, repo, signed, model.path.parent)
    assert session.flush(5.0)
    stop = threading.Event()
    runner = threading.Thread(target=server.run, args=(stop,), daemon=True)
    runner.start()
    yield Fleet(broker, key, repo, signed, model.path.parent, server, session)
    stop.set()
    runner.join(5.0)
    session.stop()


class AfterFrames:
    """A Communicator that runs `action` once, when the `n`-th chunk frame arrives.

    Takes the broker or the process away at an exact point of a transfer, which a
    progress callback (on another thread, behind the frames) cannot.
    """

    def __init__(self, inner: MqttSession, n: int, action: Callable[[], None]) -> None:
        self.inner = inner
        self.mqtt_version: MqttVersion = inner.mqtt_version
        self.n = n
        self.action = action
        self.seen = 0

    def publish(self, topic: str, payload: bytes, **kw: object) -> None:
        self.inner.publish(topic, payload, **kw)  # type: ignore[arg-type]

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Unsubscribe:
        if not topic_filter.endswith("/chunks"):
            return self.inner.subscribe(topic_filter, handler, qos)

        def counted(message: Message) -> None:
            self.seen += 1
            if self.seen == self.n:
                self.action()
            handler(message)

        return self.inner.subscribe(topic_filter, counted, qos)

    def stop(self) -> None:
        self.inner.stop()
