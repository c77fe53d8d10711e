"""Which fleet servers a server counts as peers: those that say so, and not too many."""

from __future__ import annotations

import json
from pathlib import Path

from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import MAX_PEERS, FleetServer, owner
from edge_agent.protocol.delivery import Join, RepairError, ServerPresence, bitmap, encode_bits
from edge_agent.protocol.topics import Topics
from tests.delivery_kit import CHUNK, make_release

TOPICS = Topics()


def _presence(instance: str) -> bytes:
    return ServerPresence(instance=instance, started_at=1.0).model_dump_json().encode()


def test_only_a_server_presence_under_its_own_name_makes_a_peer(tmp_path: Path) -> None:
    # Any message on fleet/servers/<x> made <x> a live peer: 21 ghosts (repair answers the
    # server was tricked into sending there) were handed releases, and nothing was sent.
    signed, folder = make_release(tmp_path, 4 * CHUNK)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    chunks = ChunkMap(signed.release)
    broker = FakeBroker()
    server = FleetServer(broker.connect(), repo, instance="s1", clock=lambda: 0.0)
    server.start()
    other = broker.connect()
    # The release id changes with every run (it covers the release's creation time): the
    # ghosts are as many as it takes for them, counted, to own it (21 did in the review).
    ghosts = [f"ghost-{i}" for i in range(21)]
    while owner({"s1", *ghosts}, chunks.id) == "s1":
        ghosts.append(f"ghost-{len(ghosts)}")
    error = RepairError(release_id=chunks.id, code="store.not_found", message="no")
    for i, ghost in enumerate(ghosts):
        payload = [error.model_dump_json().encode(), b"x", _presence("s9")][i % 3]
        other.publish(TOPICS.server(ghost), payload, retain=True)
    assert server.servers == {"s1"}

    missing = encode_bits(bitmap(len(chunks), range(len(chunks))))
    join = Join(device_id="dev-1", release_id=chunks.id, chunks=len(chunks), missing=missing)
    other.publish(TOPICS.control("m", 1), join.model_dump_json().encode())
    server.step(1.0)
    assert any(m.topic == TOPICS.chunks("m", 1) for m in broker.published)

    # A real peer is one, until its will (an empty retained message) clears it.
    other.publish(TOPICS.server("s2"), _presence("s2"), retain=True)
    assert server.servers == {"s1", "s2"}
    other.publish(TOPICS.server("s2"), b"", retain=True)
    assert server.servers == {"s1"}


def test_no_more_peers_than_the_bound_are_counted(tmp_path: Path) -> None:
    broker = FakeBroker()
    server = FleetServer(broker.connect(), Repo(tmp_path / "repo"), instance="s1")
    server.start()
    other = broker.connect()
    for i in range(3 * MAX_PEERS):
        other.publish(TOPICS.server(f"s-{i}"), _presence(f"s-{i}"), retain=True)
    assert len(server.servers) == MAX_PEERS
    assert "s1" in server.servers
    other.publish(TOPICS.server("s-0"), b"", retain=True)  # one goes: room for another
    other.publish(TOPICS.server("s-late"), _presence("s-late"), retain=True)
    assert "s-late" in server.servers


def test_a_presence_with_fields_this_server_does_not_know_is_still_a_peer(
    tmp_path: Path,
) -> None:
    # Parsed with extra="forbid", a presence from a newer server (one field more) was no
    # presence: each of two servers counted only itself during a rolling upgrade, and
    # both broadcast the same releases.
    broker = FakeBroker()
    server = FleetServer(broker.connect(), Repo(tmp_path / "repo"), instance="s1")
    server.start()
    other = broker.connect()
    newer = {"instance": "s2", "started_at": 1.0, "serves": ["repair-v2"]}
    other.publish(TOPICS.server("s2"), json.dumps(newer).encode(), retain=True)
    assert server.servers == {"s1", "s2"}
    # What it does know is still checked: a presence whose fields are wrong is none.
    for wrong in ({**newer, "started_at": "soon"}, {**newer, "instance": "s9"}, [newer]):
        other.publish(TOPICS.server("s2"), json.dumps(wrong).encode(), retain=True)
        assert server.servers == {"s1"}
        other.publish(TOPICS.server("s2"), json.dumps(newer).encode(), retain=True)
