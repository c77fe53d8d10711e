"""Repair requests as a box that is not what it says may send them: the fleet server answers
only on the asker's own reply topic, and the puller believes only answers to its requests."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer
from edge_agent.protocol.delivery import RepairRequest, bitmap, decode_frame, encode_bits
from edge_agent.protocol.topics import Topics
from tests.delivery_kit import CHUNK, make_release

TOPICS = Topics()


def _serving(tmp_path: Path, chunks: int = 8) -> tuple[FakeBroker, FleetServer, ChunkMap]:
    signed, folder = make_release(tmp_path, chunks * CHUNK)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    broker = FakeBroker()
    server = FleetServer(broker.connect(), repo, instance="s1", clock=lambda: 0.0)
    server.start()
    return broker, server, ChunkMap(signed.release)


def _request(chunks: ChunkMap, device: str, **fields: object) -> bytes:
    count = min(len(chunks), 64)
    body: dict[str, object] = {
        "device_id": device,
        "name": "m",
        "version": 1,
        "release_id": chunks.id,
        "block_size": chunks.chunk_size,
        "offset": 0,
        "count": count,
        "bitmap": encode_bits(bitmap(count, range(count))),
        **fields,
    }
    return RepairRequest.model_validate(body).model_dump_json(exclude_none=True).encode()


def _on(broker: FakeBroker, topic: str) -> list[bytes]:
    return [m.payload for m in broker.published if m.topic == topic]


def test_the_server_answers_a_repair_only_on_the_askers_own_reply_topic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A box asked the server to answer on another box's topics: RepairErrors on dock-1's
    # reply topic aborted its deploy, and one 194-byte request put 6.8 MB of frames on
    # dock-1's cmd topic, which dock-2 may not write itself.
    broker, server, chunks = _serving(tmp_path)
    dock2 = broker.connect()
    victim_cmd = TOPICS.device("dock-1", "cmd")
    victim_reply = TOPICS.delivery_reply("dock-1")
    with caplog.at_level(logging.INFO, logger="edge_agent.fleet.server"):
        dock2.publish(TOPICS.repair, _request(chunks, "dock-2"), response_topic=victim_cmd)
        dock2.publish(
            TOPICS.repair, _request(chunks, "dock-2", block_size=1), response_topic=victim_reply
        )
        # On 3.1.1 the reply topic rides in the payload: the same rule.
        old = broker.connect("3.1.1")
        old.publish(TOPICS.repair, _request(chunks, "dock-2", response_topic=victim_cmd))
        # A reserved word is no device: its "reply topic" would be a fleet-wide one.
        dock2.publish(TOPICS.repair, _request(chunks, "fleet"))
    assert _on(broker, victim_cmd) == []
    assert _on(broker, victim_reply) == []
    assert _on(broker, TOPICS.delivery_reply("fleet")) == []
    assert server.repairs_refused == 4
    said = [r for r in caplog.records if getattr(r, "event", None) == "fleet_repair_refused"]
    assert len(said) == 2  # once per device, however often it asks
    assert server.repair_chunks == 0

    # Its own requests are answered where the protocol says, as every agent names them:
    # the Response Topic (MQTT 5), the payload (3.1.1), or none at all.
    own = TOPICS.delivery_reply("dock-2")
    dock2.publish(TOPICS.repair, _request(chunks, "dock-2"), response_topic=own)
    old.publish(TOPICS.repair, _request(chunks, "dock-2", response_topic=own))
    dock2.publish(TOPICS.repair, _request(chunks, "dock-2"))
    frames = [decode_frame(p) for p in _on(broker, own)]
    assert len(frames) == 3 * len(chunks)
    assert all(f is not None and f.repair for f in frames)
