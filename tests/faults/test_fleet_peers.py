"""`serve`'s own link lost and back: a peer whose presence the broker no longer holds is gone.

A server counts its peers from their retained presence. On a resubscribe the broker sends
every presence it holds, and only those: one cleared while this server was away (a peer's
will, a broker restarted without persistence) is not sent, and the peer was counted for
ever. The releases the rendezvous hash gave it were broadcast by no one, and every box
pulling one fell back to repairs, one copy per box through the broker.

The broker keeps its retained messages over a restart (tests/retained_kit.py), and one
peer's presence is cleared while it is down; the peers are presences made by mosquitto_pub.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from itertools import permutations
from pathlib import Path

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.comms.base import Message
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import connect
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.fleet.publish import publish_release
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer, owner
from edge_agent.fleet.server_session import connect_server
from edge_agent.protocol.delivery import Join, bitmap, encode_bits
from edge_agent.store.release import generate_key
from tests.broker import TOPICS, broker_settings, signed_release
from tests.integration.test_fleet_console import mosquitto_pub
from tests.retained_kit import cleared_while_away, kept_broker, until


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[LocalBroker]:
    with kept_broker(tmp_path) as running:
        yield running


def _present(broker: LocalBroker, instance: str) -> None:
    """A peer's retained presence, as `serve` announces it."""
    body = {"instance": instance, "started_at": time.time()}
    mosquitto_pub(broker, TOPICS.server(instance), body, retain=True)


def test_a_peer_cleared_while_away_is_dropped_and_its_release_broadcast_here(
    kept: LocalBroker,
    tmp_path: Path,
    resolve: Callable[[str], ResolvedModel],
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = resolve("text-orientation")
    signed = signed_release(model, generate_key())
    chunks = ChunkMap(signed.release)
    # Peers named so that the one to go owns the release while all three count, and the
    # one that stays would take it from s1 if counted when the other goes: the release
    # lands on s1 only if exactly the peer that went is dropped.
    gone, stays = next(
        (a, b)
        for a, b in permutations([f"s{i}" for i in range(2, 40)], 2)
        if owner({"s1", a, b}, chunks.id) == a and owner({"s1", b}, chunks.id) == "s1"
    )
    for peer in (gone, stays):
        _present(kept, peer)
    caplog.set_level(logging.INFO, logger="edge_agent.fleet.server")
    session, started = connect_server(broker_settings(kept), TOPICS, "s1")  # as `serve`'s
    # The box's own link goes down with the broker too: its join must go out on the link
    # back, after its chunk subscription is made again, or the broadcast passes it by.
    box_links: list[object] = []
    box = connect(broker_settings(kept), on_connected=box_links.append)
    frames: list[Message] = []
    box.subscribe(TOPICS.chunks("orient", 1), frames.append, qos=0)
    stop = threading.Event()
    server = FleetServer(session, Repo(tmp_path / "repo"), instance="s1")
    runner = threading.Thread(target=server.run, args=(stop,), daemon=True)
    try:
        server.start()
        started(server)
        runner.start()
        publish_release(session, TOPICS, server.repo, signed, model.path.parent)
        until(lambda: server.servers == {"s1", gone, stays})
        cleared_while_away(kept, TOPICS.server(gone))
        # Back, the broker sends s1 its own presence and `stays`'s, not `gone`'s.
        until(lambda: server.servers == {"s1", stays})
        dropped = [r for r in caplog.records if r.getMessage() == "fleet_peer_gone"]
        # Only the peer that went, once: one whose presence came back was never dropped
        # (a flap would have two servers broadcast its releases for a moment, or none).
        assert [r.fields["peers"] for r in dropped] == [gone], dropped  # type: ignore[attr-defined]
        # A box pulling `gone`'s release rejoins: s1 owns it now, and broadcasts it.
        until(lambda: len(box_links) >= 2)
        everything = encode_bits(bitmap(len(chunks), range(len(chunks))))
        join = Join(device_id="box-1", release_id=chunks.id, chunks=len(chunks), missing=everything)
        box.publish(TOPICS.own_control("box-1", "orient", 1), join.model_dump_json().encode())
        until(lambda: bool(frames))
    finally:
        stop.set()
        runner.join(5.0)
        box.stop()
        session.stop()
    assert server.servers == {"s1", stays}
    # Its echo came back: nothing to say of it.
    assert not [r for r in caplog.records if r.getMessage() == "fleet_echo_lost"], caplog.text


def test_a_lost_echo_is_said_with_what_to_fix_as_the_peers_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An ACL that lets the server write its own presence only: the broker drops its echo,
    # and 10 s after each reconnect the peers not heard again went with no word of why.
    servers = TOPICS.servers_filter.removesuffix("+")
    acl = tmp_path / "acl"
    acl.write_text(
        "user admin\ntopic readwrite #\n\n"
        f"user s1\ntopic read {TOPICS.prefix}/#\ntopic readwrite {servers}s1\n"
    )
    (tmp_path / "broker").mkdir()
    caplog.set_level(logging.INFO, logger="edge_agent.fleet.server")
    with LocalBroker(folder=tmp_path / "broker", extra_config=f"acl_file {acl}\n") as guarded:
        done = subprocess.run(
            ["mosquitto_pub", "-p", str(guarded.port), "-u", "admin", "-q", "1", "-r",
             "-t", TOPICS.server("peer-1"),
             "-m", json.dumps({"instance": "peer-1", "started_at": time.time()})],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        settings = broker_settings(guarded).model_copy(update={"username": "s1"})
        session, started = connect_server(settings, TOPICS, "s1")
        server = FleetServer(session, Repo(tmp_path / "repo"), instance="s1")
        try:
            server.start()
            started(server)
            until(lambda: server.servers == {"s1", "peer-1"})
            guarded.restart()  # it keeps nothing: peer-1's presence is gone
            until(lambda: server.servers == {"s1"}, timeout=30.0)
        finally:
            session.stop()
    lost = [r for r in caplog.records if r.getMessage() == "fleet_echo_lost"]
    assert len(lost) == 1, caplog.text
    fields = lost[0].fields  # type: ignore[attr-defined]
    assert fields["peers"] == "peer-1"
    assert fields["echo"].startswith(f"{servers}echo-")
    assert "did not come back" in fields["detail"]
    assert f"publish and subscribe to {TOPICS.servers_filter}" in fields["fix"]
    assert lost[0].levelno == logging.WARNING
