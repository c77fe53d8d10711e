"""The broadcast under forged control messages: a `device_id` in a join is whatever its
sender wrote, and every puller of a release may write its `ctl` topic."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery.broadcast import Broadcast, BroadcastOptions
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.delivery.joins import JoinGate, JoinLimits
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.delivery.puller import Puller, PullerOptions
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer
from edge_agent.protocol.delivery import Ack, BroadcastStatus, Join, bitmap, encode_bits
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import SignedRelease, generate_key, sign
from tests.delivery_kit import CHUNK, make_release

TOPICS = Topics()


def _serve(repo: Repo) -> tuple[FakeBroker, list[float], FleetServer]:
    """A fleet server of `repo` on a fake broker, started, on the fake clock it returns."""
    broker, now = FakeBroker(), [0.0]
    server = FleetServer(broker.connect(), repo, instance="s1", clock=lambda: now[0])
    server.start()
    return broker, now, server


def test_a_flood_of_joins_makes_a_paced_few_statuses_and_tracks_a_bounded_number(
    tmp_path: Path,
) -> None:
    # 20,000 forged joins that missed nothing made 1,683 status messages, each sent to every
    # puller of the release, and named all 20,000 invented devices.
    signed, _ = make_release(tmp_path, 4 * CHUNK)
    chunks = ChunkMap(signed.release)
    statuses: list[BroadcastStatus] = []
    options = BroadcastOptions()
    cast = Broadcast(chunks, lambda i: b"x", lambda p: None, statuses.append, "s1", options)
    nothing = encode_bits(bitmap(len(chunks), []))
    for i in range(20_000):
        now = i * 1e-5
        cast.join(
            Join(device_id=f"ghost-{i}", release_id=chunks.id, chunks=4, missing=nothing), now
        )
        cast.step(now)  # the server steps its broadcasts after every message
        assert cast.tracked <= options.max_pullers
    now = 0.2
    while now < 10.0:
        cast.step(now)
        now += 0.05
    assert len(statuses) <= options.status_burst + options.statuses_per_s * 10.0
    assert max(len(s.done) for s in statuses) <= options.max_done_names
    assert cast.stats.refused > 0
    assert sum(len(s.done) for s in statuses) + cast.stats.refused == 20_000  # each said once
    assert cast.step(10.0) is None  # all said: nothing more to come


@pytest.mark.parametrize("stale_ack", [False, True])
def test_a_fake_puller_that_rejoins_and_never_acks_holds_the_window_a_while_only(
    tmp_path: Path, stale_ack: bool
) -> None:
    # Rejoining every 1.4 s (under the 1.5 s stall) and never acking, a fake puller held
    # the window for ever: a deploy took 16.8 s instead of 0.15 s. It also rejoined in the
    # name of the real puller, with every chunk missing. Then an ack of seq 0 sent with
    # each join, which moves no puller on, started its joins in a row again: 12.65 s.
    signed, folder = make_release(tmp_path, 40 * CHUNK)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    broker, now, server = _serve(repo)
    puller = Puller(
        broker.connect(),
        TOPICS,
        "dock-1",
        PartialTransfer(tmp_path / "pull", signed),
        clock=lambda: now[0],
        options=PullerOptions(idle_s=2.0, rejoins=100),  # it takes the broadcast, or nothing
    )
    forger = broker.connect()
    everything = encode_bits(bitmap(40, range(40)))
    hog_at = 0.0
    puller.start()
    while not puller.done.is_set() and now[0] < 30.0:
        if now[0] >= hog_at:
            for device in ("ghost-hog", "dock-1"):
                join = Join(device_id=device, release_id=puller.rid, chunks=40, missing=everything)
                forger.publish(TOPICS.control("m", 1), join.model_dump_json().encode())
                if stale_ack:
                    ack = Ack(device_id=device, seq=0)
                    forger.publish(TOPICS.control("m", 1), ack.model_dump_json().encode())
            hog_at += 1.4
        now[0] += 0.05
        server.step(now[0])
        puller.tick(now[0])
    assert puller.state == "complete"
    assert puller.stats.repair_requests == 0
    # Three joins with no ack between them (a puller's join and its two rejoins), then
    # the stall: the window is its own again after 3 x 1.4 + 1.5 s, not after the deploy.
    assert now[0] < 3 * 1.4 + 1.5 + 1.0
    assert server.joins_refused > 0
    assert server.misnamed > 0  # dock-1's name on the fleet-wide topic, while it pulls


def test_a_device_id_joins_as_often_as_a_real_puller_does_and_no_more() -> None:
    gate = JoinGate()
    # A join, then a rejoin every 2 s (idle_s) with acks between: never refused.
    for n in range(100):
        assert gate.join("dock-1", 2.0 * n)
        gate.ack("dock-1")
    # A join and two rejoins with no ack, as a real puller before it repairs; no fourth.
    assert [gate.join("ghost", 2.0 * n) for n in range(4)] == [True, True, True, False]
    gate.ack("ghost")  # it receives after all
    assert gate.join("ghost", 8.0)
    # Faster than a puller ever rejoins, acking meanwhile: the burst, then one a second.
    taken = 0
    for n in range(100):
        taken += gate.join("fast", 0.01 * n)
        gate.ack("fast")
    assert JoinLimits().burst <= taken <= JoinLimits().burst + 1


def test_a_chunk_rotted_in_the_repository_is_never_sent_and_the_rest_still_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The server sent a chunk that no longer matched its hash: the box refused it, took it
    # for an answer and asked again at once (8,186 repair requests in its first second).
    # A read that failed (the file gone for a re-publish) ended `serve` outright.
    signed, folder = make_release(tmp_path, 40 * CHUNK)
    repo = Repo(tmp_path / "repo")
    entry = repo.add(signed, folder)
    damaged = entry.folder / "m.onnx"
    with damaged.open("r+b") as fh:
        fh.seek(3 * CHUNK + 7)
        fh.write(b"\x00\xff")
    broker, now, server = _serve(repo)
    puller = Puller(
        broker.connect(), TOPICS, "dock-1", PartialTransfer(tmp_path / "pull", signed),
        clock=lambda: now[0], options=PullerOptions(idle_s=2.0),
    )  # fmt: skip
    puller.start()
    while now[0] < 20.0:
        now[0] += 0.05
        server.step(now[0])
        puller.tick(now[0])
    assert puller.partial.received == 39  # every chunk but the rotted one
    assert puller.state != "complete"
    assert server.unreadable_chunks > 0
    assert puller.stats.repair_requests < 20, puller.stats  # asked, waited, asked again
    said = [r for r in caplog.records if r.getMessage() == "repo_chunk_unreadable"]
    assert len(said) == 1  # once a minute, not per frame
    assert "does not match the release" in said[0].fields["problem"]  # type: ignore[attr-defined]
    # Gone meanwhile (between a re-publish's renames): still no crash, still said.
    damaged.unlink()
    server.step(now[0] + 120)
    assert server.unreadable_chunks > 0


def test_a_release_published_again_is_served_by_a_server_that_ran_all_along(
    tmp_path: Path,
) -> None:
    # `publish-model` runs in another process than `serve`: a re-publish with a fresh
    # expiry (a new release id) was never seen by the running server, which refused every
    # join of it, and each deploy failed until `serve` was restarted.
    signed, folder = make_release(tmp_path, 6 * CHUNK)
    serving = Repo(tmp_path / "repo")
    serving.add(signed, folder)
    broker, now, server = _serve(serving)

    def pull(release: SignedRelease, device: str) -> Puller:
        puller = Puller(
            broker.connect(), TOPICS, device, PartialTransfer(tmp_path / device, release),
            clock=lambda: now[0], options=PullerOptions(idle_s=2.0),
        )  # fmt: skip
        puller.start()
        while not puller.done.is_set() and now[0] < 60.0:
            now[0] += 0.05
            server.step(now[0])
            puller.tick(now[0])
        return puller

    assert pull(signed, "dock-1").state == "complete"
    later = signed.release.expires_at + timedelta(days=1)
    again = sign(signed.release.model_copy(update={"expires_at": later}), generate_key())
    Repo(tmp_path / "repo").add(again, folder)  # the publishing process's own Repo
    assert ChunkMap(again.release).id != ChunkMap(signed.release).id
    assert pull(again, "dock-2").state == "complete"
