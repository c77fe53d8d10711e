"""Delivery without a broker: frames, bitmaps, topic matching, the paced broadcast, and a
whole pull with loss over the in-memory FakeBroker (the fake that ships with comms)."""

from __future__ import annotations

import errno
import itertools
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.comms.base import Message, topic_matches
from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery import partial as partial_module
from edge_agent.delivery.broadcast import Broadcast, BroadcastOptions
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.delivery.partial import ABANDONED_S, PartialTransfer, sweep
from edge_agent.delivery.puller import Puller, PullerOptions
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer, owner
from edge_agent.protocol.delivery import (
    Ack,
    BroadcastStatus,
    Frame,
    Join,
    Leave,
    bitmap,
    decode_bits,
    decode_frame,
    encode_bits,
)
from edge_agent.protocol.topics import Topics
from tests.delivery_kit import CHUNK, make_release


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_frame_round_trip(data: bytes, index: int, seq: int) -> None:
    frame = Frame("0123456789abcdef", index, data, seq=seq, repair=seq % 2 == 1)
    assert decode_frame(frame.encode()) == frame


def test_truncated_or_foreign_payload_is_not_a_frame() -> None:
    encoded = Frame("0123456789abcdef", 3, b"abc").encode()
    assert decode_frame(encoded[:-1]) is None
    assert decode_frame(b'{"kind":"error"}') is None


@given(st.sets(st.integers(0, 199)))
def test_bitmap_round_trip(indices: set[int]) -> None:
    bits = decode_bits(encode_bits(bitmap(200, sorted(indices))), 200)
    assert bits is not None
    assert {i for i in range(200) if bits[i >> 3] & (1 << (i & 7))} == indices


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/+", "a/b/c", False),
        ("$share/g/edge/v1/delivery/repair", "edge/v1/delivery/repair", True),
        ("#", "$SYS/broker/bytes/sent", False),
        ("$SYS/broker/bytes/sent", "$SYS/broker/bytes/sent", True),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, matches: bool) -> None:
    assert topic_matches(topic_filter, topic) is matches


def test_window_paces_to_the_slowest_puller_and_drops_a_stalled_one(tmp_path: Path) -> None:
    signed, _ = make_release(tmp_path, 10 * CHUNK)
    chunks = ChunkMap(signed.release)
    sent: list[Frame] = []
    statuses: list[BroadcastStatus] = []
    cast = Broadcast(
        chunks,
        lambda i: b"x",
        lambda p: sent.append(decode_frame(p)),  # type: ignore[arg-type]
        statuses.append,
        "s1",
        BroadcastOptions(window=2, gather_s=0.0, stall_s=1.0),
    )
    everything = encode_bits(bitmap(10, range(10)))
    for device in ("fast", "slow"):
        cast.join(Join(device_id=device, release_id=chunks.id, chunks=10, missing=everything), 0)
    cast.step(0.0)
    assert len(sent) == 2  # the window, and no more until someone acks
    cast.ack(Ack(device_id="fast", seq=2), 0.1)
    cast.step(0.1)
    assert len(sent) == 2  # "slow" has acked nothing: still held
    cast.ack(Ack(device_id="slow", seq=1), 0.2)
    cast.step(0.2)
    assert len(sent) == 3
    cast.ack(Ack(device_id="fast", seq=3), 0.3)
    wait = cast.step(0.3)
    assert wait is not None  # waiting for "slow" until it counts as stalled
    cast.step(1.5)  # "slow" silent since 0.2: dropped; "fast" alone paces now
    assert cast.stats.stalls == 1
    for seq in range(4, 20):
        cast.ack(Ack(device_id="fast", seq=seq), 1.6)
        cast.step(1.6)
    assert sorted(f.index for f in sent) == list(range(10))  # each chunk once
    assert not any("fast" in s.done for s in statuses)  # it may yet say it is complete
    assert cast.step(2.7) is None  # past the grace, with no word from it: done, said
    assert any("fast" in s.done for s in statuses)


def test_done_names_only_the_pullers_that_did_not_say_they_are_complete(
    tmp_path: Path,
) -> None:
    # Every puller gets every status: naming all of a fleet that finished on one frame
    # sent 5,000 ids to each of 5,000 boxes through the broker at once. Those that left
    # complete within the grace need no `done`; only one that lost chunks does.
    signed, _ = make_release(tmp_path, 4 * CHUNK)
    chunks = ChunkMap(signed.release)
    statuses: list[BroadcastStatus] = []
    cast = Broadcast(
        chunks, lambda i: b"x", lambda p: None, statuses.append, "s1",
        BroadcastOptions(window=100, gather_s=0.0, done_grace_s=1.0),
    )  # fmt: skip
    everything = encode_bits(bitmap(4, range(4)))
    devices = [f"box-{i}" for i in range(50)]
    for device in devices:
        cast.join(Join(device_id=device, release_id=chunks.id, chunks=4, missing=everything), 0)
    assert cast.step(0.0) == pytest.approx(1.0)  # all sent; back when the grace ends
    for device in devices[1:]:
        cast.leave(Leave(device_id=device, reason="complete"))
    assert cast.step(1.0) is None
    assert [s.done for s in statuses if s.done] == [["box-0"]]
    assert statuses[-1].state == "idle"


def _filtered(device: Any, keep: Callable[[Message], bool]) -> None:
    """Have `device` drop every message `keep` refuses, on each subscription it makes."""
    real_subscribe = device.subscribe

    def subscribe(topic_filter: str, handler, qos: int = 1):  # type: ignore[no-untyped-def]
        def maybe(message: Message) -> None:
            if keep(message):
                handler(message)

        return real_subscribe(topic_filter, maybe, qos)

    device.subscribe = subscribe


def _pull(
    server: FleetServer, device: Any, partial: PartialTransfer, now: list[float],
    options: PullerOptions, until_s: float = 100.0,
) -> Puller:  # fmt: skip
    """Pull `partial` from `server` on the fake clock `now`, in 50 ms steps."""
    puller = Puller(device, Topics(), "dev-1", partial, clock=lambda: now[0], options=options)
    puller.start()
    while not puller.done.is_set() and now[0] < until_s:
        now[0] += 0.05
        server.step(now[0])
        puller.tick(now[0])
    return puller


def test_pull_over_the_fake_broker_with_loss_repairs_everything(tmp_path: Path) -> None:
    signed, folder = make_release(tmp_path, 40 * CHUNK + 123)
    broker = FakeBroker()
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    now = [0.0]
    server = FleetServer(
        broker.connect(),
        repo,
        instance="s1",
        # `done` within the puller's idle_s, as the defaults have it (1 s against 2 s).
        options=BroadcastOptions(gather_s=0.0, done_grace_s=0.2),
        clock=lambda: now[0],
    )
    server.start()
    device = broker.connect("3.1.1")  # 3.1.1: response topic and correlation in the payload
    rng = random.Random(1)
    _filtered(device, lambda m: decode_frame(m.payload) is None or rng.random() >= 0.1)
    partial = PartialTransfer(tmp_path / "pull", signed)
    puller = _pull(server, device, partial, now, PullerOptions(idle_s=0.5, repair_timeout_s=0.5))
    assert puller.state == "complete"
    assert puller.stats.repaired > 0  # the loss was repaired, per device
    assert puller.stats.stored - puller.stats.repaired >= 30  # the rest came by broadcast
    assert puller.stats.duplicates == 0
    assert (partial.files_dir / "m.onnx").stat().st_size == 40 * CHUNK + 123
    assert (partial.files_dir / "m.onnx").read_bytes() == (folder / "m.onnx").read_bytes()


def test_every_gap_in_a_long_broadcast_is_rejoined_not_repaired(tmp_path: Path) -> None:
    # Three outages in one pull (a broker restart, a cellular handover, ...), each long
    # enough to spend both rejoins: the broadcast that flows again between them restores
    # the rejoins. Left spent, the third gap sent the rest as unicast repair, per box.
    signed, folder = make_release(tmp_path, 40 * CHUNK)
    broker, repo, now = FakeBroker(), Repo(tmp_path / "repo"), [0.0]
    repo.add(signed, folder)
    options = BroadcastOptions(gather_s=0.0)
    server = FleetServer(
        broker.connect(), repo, instance="s1", options=options, clock=lambda: now[0]
    )
    server.start()
    device = broker.connect()
    outage_until, received = [0.0], [0]

    def gap(message: Message) -> bool:
        if not message.topic.endswith("/chunks"):
            return True
        if now[0] < outage_until[0]:
            return False
        received[0] += 1
        if received[0] in (10, 20, 30):  # the link goes for 0.8 s: two idle spells
            outage_until[0] = now[0] + 0.8
        return True

    _filtered(device, gap)
    partial = PartialTransfer(tmp_path / "pull", signed)
    puller = _pull(server, device, partial, now, PullerOptions(idle_s=0.5, rejoins=2), 60.0)
    assert puller.state == "complete"
    assert puller.stats.rejoins >= 5  # more than one budget's worth
    assert puller.stats.repaired == 0  # every chunk came by the broadcast
    assert puller.stats.repair_requests == 0
    assert (partial.files_dir / "m.onnx").read_bytes() == (folder / "m.onnx").read_bytes()


def test_unanswered_repairs_are_spread_and_back_off(tmp_path: Path) -> None:
    # A fleet's boxes leave the broadcast on one status message; a repair server that
    # drops a burst drops it for all. Resent every 3.0 s exactly, the dropped all came
    # back together, for ever: each box now spreads its first request and backs off.
    signed, _ = make_release(tmp_path, 3 * CHUNK)
    broker, now = FakeBroker(), [0.0]
    asked: dict[str, list[float]] = {}
    server = broker.connect()
    server.subscribe(
        Topics().own_repair_filter,
        lambda m: asked.setdefault(json.loads(m.payload)["device_id"], []).append(now[0]),
    )
    pullers = []
    for i in range(40):
        puller = Puller(
            broker.connect(),
            Topics(),
            f"dev-{i}",
            PartialTransfer(tmp_path / f"pull-{i}", signed),
            clock=lambda: now[0],
            options=PullerOptions(idle_s=0.5, rejoins=0),  # no broadcaster: straight to repair
            rng=random.Random(i),
        )
        puller.start()
        pullers.append(puller)
    while now[0] < 200.0:
        now[0] += 0.05
        for puller in pullers:
            puller.tick(now[0])
    firsts = sorted(times[0] for times in asked.values())
    assert len(firsts) == 40
    assert firsts[-1] - firsts[0] > 0.5  # spread over a second, not one instant
    for times in asked.values():
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert 3.0 <= gaps[0] <= 4.6
        assert all(later > 1.2 * earlier for earlier, later in itertools.pairwise(gaps[:4]))
        assert max(gaps) <= 30.0 * 1.5 + 0.1  # backed off to the cap, no further
    # The fourth resend of each box: spread over seconds, not in step.
    fourth = sorted(times[4] for times in asked.values())
    assert fourth[-1] - fourth[0] > 5.0


def test_rendezvous_owner_is_stable_and_spreads() -> None:
    servers = {"a", "b", "c"}
    owners = {owner(servers, f"{i:016x}") for i in range(30)}
    assert owners == servers
    assert owner(servers, "00000000000000ff") == owner({"c", "b", "a"}, "00000000000000ff")


def test_a_frame_outside_the_release_is_counted_bad_not_raised(tmp_path: Path) -> None:
    signed, _ = make_release(tmp_path, 3 * CHUNK)
    partial = PartialTransfer(tmp_path / "pull", signed)
    assert not partial.has(10**6)
    assert not partial.has(-1)
    puller = Puller(FakeBroker().connect(), Topics(), "dev-1", partial, clock=lambda: 0.0)
    assert puller._store(10**6, b"x") == 0
    assert puller._store(-1, b"x") == 0
    assert puller.stats.bad == 2
    assert puller.error is None


NOW = 1_800_000_000.0


def test_sweep_removes_replaced_and_abandoned_partials_only(tmp_path: Path) -> None:
    root = tmp_path / "transfers"
    rid = "0123456789abcdef"

    def partial(name: str, age_s: float = 0.0) -> Path:
        folder = root / name
        (folder / "files").mkdir(parents=True)
        (folder / "chunks.bitmap").write_bytes(b"\x00")
        stamp = NOW - age_s
        for path in (folder, folder / "files", folder / "chunks.bitmap"):
            os.utime(path, (stamp, stamp))
        return folder

    keep = partial(f"person-det-3-{rid}")
    older = partial(f"person-det-2-{rid}")  # the same model, replaced by v3
    resigned = partial("person-det-3-fedcba9876543210")  # v3 signed again
    other = partial(f"person-1-{rid}")  # another model whose name is a prefix: kept
    stale = partial(f"face-1-{rid}", age_s=ABANDONED_S + 60)
    stranger = partial("not-a-transfer")
    removed = sweep(root, keep=keep, now=NOW)
    assert sorted(removed) == sorted([older, resigned, stale])
    assert sorted(p for p in root.iterdir()) == sorted([keep, other, stranger])


def test_a_partial_from_an_unset_clock_is_not_taken_for_abandoned(tmp_path: Path) -> None:
    # Written while the box's clock read 1970, it looked 55 years idle once NTP synced,
    # and the resumable pull of a whole model was thrown away by the next pull.
    root = tmp_path / "transfers"
    rid = "0123456789abcdef"
    folders = {}
    for name, stamp in (("early", 100.0), ("ahead", NOW + 86400.0), ("idle", NOW - 30 * 86400)):
        folder = root / f"{name}-1-{rid}"
        (folder / "files").mkdir(parents=True)
        for path in (folder, folder / "files"):
            os.utime(path, (stamp, stamp))
        folders[name] = folder
    keep = root / f"other-1-{rid}"
    assert sweep(root, keep=keep, now=NOW) == [folders["idle"]]
    # And a box whose own clock is unset ages nothing at all.
    assert sweep(root, keep=keep, now=200.0) == []
    assert sorted(root.iterdir()) == sorted([folders["early"], folders["ahead"]])


@given(
    wants=st.lists(st.sets(st.integers(0, 20), min_size=1), min_size=1, max_size=6),
    leaves=st.sets(st.integers(0, 5)),
    cut=st.integers(0, 30),
)
def test_the_carousel_sends_what_its_pullers_still_need_and_nothing_else(
    tmp_path_factory: pytest.TempPathFactory, wants: list[set[int]], leaves: set[int], cut: int
) -> None:
    # Joins add each puller's bitmap to the count of pullers needing each chunk, and a
    # leave takes it away (whole arrays since a per-chunk loop cost 0.9 ms a join): a
    # count off by one sends a chunk nobody needs, forever, or skips one a puller needs.
    signed, _ = make_release(tmp_path_factory.mktemp("r"), 21 * CHUNK)
    chunks = ChunkMap(signed.release)
    sent: list[int] = []
    cast = Broadcast(
        chunks, lambda i: b"x", lambda p: sent.append(decode_frame(p).index),  # type: ignore[union-attr]
        lambda s: None, "s1", BroadcastOptions(window=1000, gather_s=0.0),
    )  # fmt: skip
    needs = {f"d{k}": set(want) for k, want in enumerate(wants)}
    for device, want in needs.items():
        cast.join(Join(device_id=device, release_id=chunks.id, chunks=21,
                       missing=encode_bits(bitmap(21, sorted(want)))), 0.0)  # fmt: skip
    while cast.active and len(sent) < cut:  # part of a pass, one frame at a time
        before = len(sent)
        cast._send_next(0.0)
        index = sent[-1]
        assert len(sent) == before + 1
        assert any(index in want for want in needs.values())  # somebody needed it
        for want in needs.values():
            want.discard(index)
    for k in leaves:
        cast.leave(Leave(device_id=f"d{k}", reason="cancelled"))
        needs.pop(f"d{k}", None)
    rest = len(sent)
    cast.step(0.0)
    after = sent[rest:]
    assert len(after) == len(set(after))  # a chunk goes once per pass
    assert set(after) == set().union(*needs.values())  # exactly what the others lack


def test_a_broadcast_that_flows_past_a_puller_it_does_not_count_is_taken_for_silence(
    tmp_path: Path,
) -> None:
    # dev-1 lacks chunk 0; the broadcast carries 1-3 for boxes still in its window, lap
    # after lap, never 0: dev-1 was dropped from the window behind a flaky link, or its
    # join refused. Each frame kept it waiting for the broadcast, for as long as the fleet
    # kept joining. After one dry lap it rejoins, and after its rejoins it repairs.
    signed, folder = make_release(tmp_path, 4 * CHUNK)
    data = (folder / "m.onnx").read_bytes()
    partial = PartialTransfer(tmp_path / "pull", signed)
    for ref in partial.chunks.refs[1:]:
        partial.write(ref.index, data[ref.offset : ref.offset + ref.length])
    now = [0.0]
    options = PullerOptions(idle_s=0.5, rejoins=2)
    puller = Puller(FakeBroker().connect(), Topics(), "dev-1", partial, clock=lambda: now[0],
                    options=options)  # fmt: skip
    puller.start()
    seq = 0
    while puller.state == "broadcast" and now[0] < 30.0:
        now[0] += 0.05
        seq += 1
        i = 1 + seq % 3
        ref = partial.chunks.refs[i]
        frame = Frame(partial.chunks.id, i, data[ref.offset : ref.offset + ref.length], seq=seq)
        puller.on_frame(Message(topic="chunks", payload=frame.encode()))
        puller.tick(now[0])
    assert puller.state == "repair", (puller.state, puller.stats)
    assert puller.stats.rejoins == 2
    assert puller.flowing_at < now[0] - options.idle_s  # the pull's stall timer runs again
    puller.stop()
    partial.close()


def test_a_partial_that_cannot_be_read_leaks_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failing SD card (EIO on every read), faked as this machine has none: each retried
    # pull leaked the descriptors of the partial's files and bitmap.
    signed, _ = make_release(tmp_path, 4 * CHUNK)
    PartialTransfer(tmp_path / "t", signed).close()

    monkeypatch.setattr(partial_module, "os", _FailingOs())
    before = len(list(Path("/proc/self/fd").iterdir()))
    for _ in range(5):
        with pytest.raises(OSError, match="Input/output"):
            PartialTransfer(tmp_path / "t", signed)
    assert len(list(Path("/proc/self/fd").iterdir())) == before


class _FailingOs:
    """`os` as the partial module sees it, with every pread failing as a dying card's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def pread(*_args: object) -> bytes:
        raise OSError(errno.EIO, "Input/output error")
