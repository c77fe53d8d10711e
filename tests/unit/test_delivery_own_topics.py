"""A device's joins, acks, leaves and repair requests on its own topics, where an ACL can tie
them to its box: the fleet server takes none there in another device's name, and the
fleet-wide topics speak only for devices of earlier builds."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from edge_agent.comms.base import Message
from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery.broadcast import BroadcastOptions
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.delivery.puller import Puller, PullerOptions
from edge_agent.fleet import server as server_module
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import OWN_HEARD_S, FleetServer
from edge_agent.protocol.delivery import (
    Join,
    Leave,
    RepairRequest,
    bitmap,
    decode_frame,
    encode_bits,
)
from edge_agent.protocol.topics import Topics
from tests.delivery_kit import CHUNK, make_release

TOPICS = Topics()
CHUNKS = 40


def _server(
    tmp_path: Path, now: list[float], shared_topics: bool = True
) -> tuple[FleetServer, FakeBroker]:
    """A started server of release m v1 (40 chunks) on the fake clock `now`, and its broker."""
    signed, folder = make_release(tmp_path, CHUNKS * CHUNK)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    broker = FakeBroker()
    server = FleetServer(
        broker.connect(),
        repo,
        instance="s1",
        options=BroadcastOptions(gather_s=0.0, done_grace_s=0.2),
        shared_topics=shared_topics,
        clock=lambda: now[0],
    )
    server.start()
    return server, broker


def _puller(
    server: FleetServer, broker: FakeBroker, tmp_path: Path, device: str, now: list[float]
) -> Puller:
    entry = server.repo.get("m", 1)
    assert entry is not None
    return Puller(
        broker.connect(),
        TOPICS,
        device,
        PartialTransfer(tmp_path / f"pull-{device}", entry.signed),
        clock=lambda: now[0],
        options=PullerOptions(idle_s=0.5, repair_timeout_s=0.5),
    )


def _drive(server: FleetServer, puller: Puller, now: list[float], until: float) -> None:
    """Step the fake clock `now` 50 ms at a time until the pull ends or `until`."""
    while not puller.done.is_set() and now[0] < until:
        now[0] += 0.05
        server.step(now[0])
        puller.tick(now[0])


def _join(server: FleetServer, device: str) -> bytes:
    entry = server.repo.get("m", 1)
    assert entry is not None
    everything = encode_bits(bitmap(CHUNKS, range(CHUNKS)))
    return (
        Join(device_id=device, release_id=entry.chunks.id, chunks=CHUNKS, missing=everything)
        .model_dump_json()
        .encode()
    )


def _repair(server: FleetServer, device: str) -> bytes:
    entry = server.repo.get("m", 1)
    assert entry is not None
    return (
        RepairRequest(
            device_id=device,
            name="m",
            version=1,
            release_id=entry.chunks.id,
            block_size=entry.chunks.chunk_size,
            offset=0,
            count=4,
            bitmap=encode_bits(bitmap(4, range(4))),
        )
        .model_dump_json(exclude_none=True)
        .encode()
    )


def _frames_to(broker: FakeBroker, device: str) -> int:
    reply = TOPICS.delivery_reply(device)
    return sum(1 for m in broker.published if m.topic == reply)


def test_a_puller_sends_on_its_own_topics_only(tmp_path: Path) -> None:
    # On the fleet-wide ctl and repair topics, which every box wrote, a broker ACL could
    # not tell a box's joins and requests from another's sent in its name.
    now = [0.0]
    server, broker = _server(tmp_path, now)
    puller = _puller(server, broker, tmp_path, "dock-1", now)
    rng = random.Random(3)
    real = puller.on_frame

    def lossy(message: Message) -> None:  # a tenth of the broadcast lost: it repairs
        if rng.random() >= 0.1:
            real(message)

    puller.on_frame = lossy  # type: ignore[method-assign]
    puller.start()
    _drive(server, puller, now, until=60.0)
    assert puller.state == "complete"
    assert puller.stats.repair_requests > 0
    sent = [m.topic for m in broker.published if m.topic.startswith("edge/v1/dock-1/delivery/")]
    assert TOPICS.own_control("dock-1", "m", 1) in sent
    assert TOPICS.own_repair("dock-1") in sent
    fleet_wide = {TOPICS.control("m", 1), TOPICS.repair}
    assert not [m for m in broker.published if m.topic in fleet_wide]
    assert server.misnamed == 0


def test_on_its_own_topics_a_box_speaks_for_itself_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # dock-2, on the topics its ACL lets it write, sends dock-1 to repair (a leave in its
    # name), asks for repairs in its name, and joins under an invented one.
    now = [0.0]
    server, broker = _server(tmp_path, now)
    puller = _puller(server, broker, tmp_path, "dock-1", now)
    dock2 = broker.connect()
    leave = Leave(device_id="dock-1", reason="complete").model_dump_json().encode()
    puller.start()
    rounds = 0
    with caplog.at_level(logging.WARNING, logger="edge_agent.fleet.server"):
        while not puller.done.is_set() and now[0] < 30.0:
            dock2.publish(TOPICS.own_control("dock-2", "m", 1), leave)
            dock2.publish(TOPICS.own_repair("dock-2"), _repair(server, "dock-1"))
            dock2.publish(TOPICS.own_control("dock-2", "m", 1), _join(server, "ghost-9"))
            now[0] += 0.05
            server.step(now[0])
            puller.tick(now[0])
            rounds += 1
    # The broadcast kept dock-1 and took no ghost: it got every chunk from it, nothing
    # by repair, and nothing came on its reply topic.
    assert puller.state == "complete"
    assert puller.stats.repair_requests == 0
    assert _frames_to(broker, "dock-1") == 0
    assert server.repairs_served == 0
    assert server.misnamed == 3 * rounds
    said = [r for r in caplog.records if getattr(r, "event", None) == "fleet_misnamed"]
    assert len(said) == 1  # once for dock-2's topics, however often
    # Its own name, on its own topics, is heard.
    dock2.publish(TOPICS.own_repair("dock-2"), _repair(server, "dock-2"))
    assert _frames_to(broker, "dock-2") == 4


def test_the_fleet_wide_topics_speak_for_devices_of_earlier_builds_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    server, broker = _server(tmp_path, now)
    other = broker.connect()
    with caplog.at_level(logging.WARNING, logger="edge_agent.fleet.server"):
        # A device of an earlier build (never heard on its own topics) is served there,
        # and named in the log once, as a box left to upgrade.
        for _ in range(3):
            other.publish(TOPICS.repair, _repair(server, "old-1"))
        assert _frames_to(broker, "old-1") == 3 * 4
        other.publish(TOPICS.control("m", 1), _join(server, "old-1"))
        assert ("m", 1) in server.broadcasts

        # One heard on its own topics is not, there: that is another box in its name.
        other.publish(TOPICS.own_repair("new-1"), _repair(server, "new-1"))
        assert _frames_to(broker, "new-1") == 4
        now[0] += OWN_HEARD_S - 1.0
        other.publish(TOPICS.repair, _repair(server, "new-1"))
        assert _frames_to(broker, "new-1") == 4
        assert server.misnamed == 1
        # Long after its last message as a later build (downgraded, say), it is again.
        now[0] += 2.0
        other.publish(TOPICS.repair, _repair(server, "new-1"))
        assert _frames_to(broker, "new-1") == 8
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("fleet_shared_topics") == 2  # old-1, then new-1 downgraded
    assert events.count("fleet_misnamed") == 1


def test_a_server_for_own_topics_only_hears_nothing_on_the_fleet_wide_ones(
    tmp_path: Path,
) -> None:
    now = [0.0]
    server, broker = _server(tmp_path, now, shared_topics=False)
    other = broker.connect()
    other.publish(TOPICS.repair, _repair(server, "old-1"))
    other.publish(TOPICS.control("m", 1), _join(server, "old-1"))
    assert _frames_to(broker, "old-1") == 0
    assert server.broadcasts == {}
    other.publish(TOPICS.own_control("old-1", "m", 1), _join(server, "old-1"))
    assert ("m", 1) in server.broadcasts


@pytest.mark.parametrize(
    ("topic", "parsed"),
    [
        ("edge/v1/dock-1/delivery/ctl/m/3", ("dock-1", "m", 3)),
        ("edge/v1/dock-1/delivery/ctl/m/latest", None),
        ("edge/v1/dock-1/delivery/ctl/m", None),
        ("edge/v1/dock-1/delivery/ctl/m/3/x", None),
        ("edge/v1/fleet/delivery/ctl/m/3", None),  # a reserved word is no device
        ("edge/v1/delivery/m/3/ctl", None),  # the fleet-wide topic
        ("other/v1/dock-1/delivery/ctl/m/3", None),
        ("x/edge/v1/dock-1/delivery/ctl/m/3", None),
    ],
)
def test_own_control_topics_parse_to_their_device_and_release(
    topic: str, parsed: tuple[str, str, int] | None
) -> None:
    assert TOPICS.parse_own_control(topic) == parsed


@pytest.mark.parametrize(
    ("topic", "device"),
    [
        ("edge/v1/dock-1/delivery/repair", "dock-1"),
        ("edge/v1/delivery/repair", None),
        ("edge/v1/group/delivery/repair", None),
        ("edge/v1/dock-1/delivery", None),
        ("edge/v1/dock-1/delivery/repair/x", None),
        ("edge/v1//delivery/repair", None),
    ],
)
def test_own_repair_topics_name_their_device(topic: str, device: str | None) -> None:
    assert TOPICS.own_repair_device(topic) == device


def test_frames_decode_on_the_reply_topic_of_an_own_topic_request(tmp_path: Path) -> None:
    # The answer to a request on a device's own topic still goes to its reply topic, as
    # frames of the release.
    now = [0.0]
    server, broker = _server(tmp_path, now)
    broker.connect().publish(TOPICS.own_repair("dock-3"), _repair(server, "dock-3"))
    reply = TOPICS.delivery_reply("dock-3")
    frames = [decode_frame(m.payload) for m in broker.published if m.topic == reply]
    assert [f.index for f in frames if f is not None] == [0, 1, 2, 3]


def test_forged_joins_on_the_fleet_wide_topic_do_not_spend_a_later_builds_own(
    tmp_path: Path,
) -> None:
    # One set of join limits for both kinds of topic: three joins forged on the fleet-wide
    # topic in dock-1's name while it was idle (not heard on its own topics) had its own
    # next join refused, and every chunk of its pull came by repair.
    now = [0.0]
    server, broker = _server(tmp_path, now)
    forger = broker.connect()
    for _ in range(4):
        forger.publish(TOPICS.control("m", 1), _join(server, "dock-1"))
    assert server.joins_refused == 1  # the fourth in a row with no ack, on that topic
    puller = _puller(server, broker, tmp_path, "dock-1", now)
    puller.start()
    _drive(server, puller, now, until=30.0)
    assert puller.state == "complete"
    assert (puller.stats.rejoins, puller.stats.repair_requests) == (0, 0)
    assert server.joins_refused == 1


def test_topics_of_neither_shape_speak_for_no_one(tmp_path: Path) -> None:
    # A box user named as a fleet-wide word writes <prefix>/fleet/delivery/repair, which
    # the own topics' filter brings to the server: it was taken for the fleet-wide topic.
    now = [0.0]
    server, broker = _server(tmp_path, now)
    box = broker.connect()
    box.publish(TOPICS.device("fleet", "delivery/repair"), _repair(server, "dock-1"))
    box.publish(TOPICS.device("dock-2", "delivery/repair/x"), _repair(server, "dock-1"))
    assert _frames_to(broker, "dock-1") == 0
    # The fleet-wide topic itself, where it is still open, is taken (dock-1 is no later
    # build's device here).
    box.publish(TOPICS.repair, _repair(server, "dock-1"))
    assert _frames_to(broker, "dock-1") == 4


@pytest.mark.parametrize(
    "topic",
    [
        "edge/v1/dock-2/delivery/ctl/1/x",  # an own topic's shape, not the fleet-wide one's
        "edge/v1/delivery/m/²/ctl",  # str.isdigit, not int
        "edge/v1/delivery/m/٣/ctl",  # read as 3 by int
        "edge/v1/delivery/m/" + "9" * 5000 + "/ctl",
        "edge/v1/x/delivery/m/3/ctl",
        "other/edge/v1/delivery/m/3/ctl",
    ],
)
def test_only_the_exact_fleet_wide_control_shape_parses(topic: str) -> None:
    assert TOPICS.parse_control(topic) is None
    assert TOPICS.parse_control("edge/v1/delivery/m/3/ctl") == ("m", 3)


@pytest.mark.parametrize("version", ["²", "٣", "9" * 5000, "-1", ""])
def test_an_own_control_topic_takes_ascii_versions_only(version: str) -> None:
    assert TOPICS.parse_own_control(f"edge/v1/dock-1/delivery/ctl/m/{version}") is None


def test_names_heard_on_the_fleet_wide_topics_do_not_silence_other_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "SAID_AT_MOST", 5)
    now = [0.0]
    server, broker = _server(tmp_path, now)
    box = broker.connect()
    with caplog.at_level(logging.WARNING, logger="edge_agent.fleet.server"):
        for i in range(20):  # invented names, each logged until the bound
            box.publish(TOPICS.repair, _repair(server, f"ghost-{i}"))
        box.publish(TOPICS.own_repair("dock-2"), _repair(server, "dock-1"))
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("fleet_shared_topics") == 5
    assert events.count("fleet_misnamed") == 1


def test_a_server_without_a_share_group_takes_each_repair_once(tmp_path: Path) -> None:
    # The demo's broker (amqtt) has no shared subscriptions: its one server took repairs
    # on the plain topic beside the `$share` one, which the session matches too, and
    # answered every request twice.
    signed, folder = make_release(tmp_path, CHUNKS * CHUNK)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    broker = FakeBroker()
    server = FleetServer(broker.connect(), repo, instance="s1", share_group=None)
    server.start()
    broker.connect().publish(TOPICS.own_repair("dock-1"), _repair(server, "dock-1"))
    broker.connect().publish(TOPICS.repair, _repair(server, "old-1"))
    assert (_frames_to(broker, "dock-1"), _frames_to(broker, "old-1")) == (4, 4)
    assert server.repairs_served == 2
