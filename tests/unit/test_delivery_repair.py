"""Repair requests as a box that is not what it says may send them: the fleet server answers
only on the asker's own reply topic, and the puller believes only answers to its requests."""

from __future__ import annotations

import base64
import logging
import random
from pathlib import Path

import pytest

from edge_agent.comms.base import Message, MqttVersion
from edge_agent.comms.fake import FakeBroker
from edge_agent.delivery.chunks import ChunkMap, read_chunk
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.delivery.puller import Puller, PullerOptions
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer, RepairLimits
from edge_agent.protocol.delivery import (
    MAX_REPAIR_BYTES,
    Frame,
    RepairError,
    RepairRequest,
    bit,
    bitmap,
    decode_bits,
    decode_frame,
    encode_bits,
)
from edge_agent.protocol.topics import Topics
from tests.delivery_kit import CHUNK, make_release

TOPICS = Topics()


def _serving(
    tmp_path: Path,
    size: int = 8 * CHUNK,
    now: list[float] | None = None,
    limits: RepairLimits | None = None,
) -> tuple[FakeBroker, FleetServer, ChunkMap]:
    signed, folder = make_release(tmp_path, size)
    repo = Repo(tmp_path / "repo")
    repo.add(signed, folder)
    broker = FakeBroker()
    clock = now or [0.0]
    server = FleetServer(
        broker.connect(), repo, instance="s1", limits=limits, clock=lambda: clock[0]
    )
    server.start()
    return broker, server, ChunkMap(signed.release)


def _pulling(
    tmp_path: Path,
    broker: FakeBroker,
    server: FleetServer,
    now: list[float],
    options: PullerOptions,
) -> tuple[Puller, Path]:
    """dev-1 pulling the served release m v1 on the fake clock `now`, started; and the
    folder of the release's files. Its join is never broadcast: the server is not stepped."""
    entry = server.repo.get("m", 1)
    assert entry is not None
    puller = Puller(
        broker.connect(),
        TOPICS,
        "dev-1",
        PartialTransfer(tmp_path / "pull", entry.signed),
        clock=lambda: now[0],
        options=options,
    )
    puller.start()
    return puller, entry.folder


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


def _repairing(
    tmp_path: Path,
    broker: FakeBroker,
    version: MqttVersion,
    asked: list[Message],
    chunks: int = 4,
    repair_blocks: int = 16,
) -> tuple[Puller, list[float]]:
    """A puller of `m` v1 with no broadcaster, gone to repair and sending its first request
    (each request lands in `asked`); nothing answers it."""
    signed, _ = make_release(tmp_path, chunks * CHUNK)
    broker.connect().subscribe(TOPICS.own_repair("dev-1"), asked.append)
    now = [0.0]
    puller = Puller(
        broker.connect(version),
        TOPICS,
        "dev-1",
        PartialTransfer(tmp_path / f"pull-{version}", signed),
        clock=lambda: now[0],
        options=PullerOptions(
            idle_s=0.5, rejoins=0, repair_spread_s=0.0, repair_blocks=repair_blocks
        ),
    )
    puller.start()
    for step in (0.6, 0.7):
        now[0] = step
        puller.tick(step)
    assert puller.state == "repair"
    assert len(asked) == 1
    return puller, now


def _error(rid: str, correlation: bytes | None) -> RepairError:
    text = base64.b64encode(correlation).decode() if correlation is not None else None
    return RepairError(
        release_id=rid, correlation_data=text, code="input.invalid", message="block_size"
    )


@pytest.mark.parametrize("version", ["5", "3.1.1"])
def test_a_puller_believes_only_the_errors_that_answer_its_own_requests(
    tmp_path: Path, version: MqttVersion
) -> None:
    # Correlation data was a counter from 1: a box that had the fleet server send an error
    # naming the release to another box's reply topic (or sent it there itself) aborted
    # that box's pull, whatever correlation the error carried.
    broker, asked = FakeBroker(), list[Message]()
    puller, _ = _repairing(tmp_path, broker, version, asked)
    request = RepairRequest.model_validate_json(asked[0].payload)
    sent = asked[0].correlation_data if version == "5" else None
    if sent is None:
        assert request.correlation_data is not None
        sent = base64.b64decode(request.correlation_data)
    assert len(sent) >= 8  # random, not a counter from 1
    assert sent != (1).to_bytes(4, "big")
    reply = TOPICS.delivery_reply("dev-1")
    forger = broker.connect()
    for guess in [(n).to_bytes(4, "big") for n in range(1, 5)] + [None]:
        error = _error(puller.rid, guess).model_dump_json().encode()
        forger.publish(reply, error, correlation_data=guess)
    assert (puller.state, puller.error) == ("repair", None)
    assert puller.stats.ignored == 5

    # The server's own answer to the request names its correlation: that one stops the pull.
    server = broker.connect(version)
    error = _error(puller.rid, sent).model_dump_json().encode()
    server.publish(reply, error, correlation_data=sent)
    assert puller.state == "stopped"
    assert puller.error is not None
    assert puller.error.code == "transfer.failed"
    assert "block_size" in str(puller.error)


@pytest.mark.parametrize("correlation", [b"other", None], ids=["other", "none"])
def test_frames_from_no_request_of_the_puller_are_kept_but_answer_nothing(
    tmp_path: Path, correlation: bytes | None
) -> None:
    # A frame is checked against the release's chunk hashes wherever it came from, so it is
    # kept; but one no request of this puller asked for must not put off the resend. On
    # MQTT 5 that was so only for a frame with other correlation data: one with none
    # (the answer to a request sent in this device's name without any) was an answer.
    broker, asked = FakeBroker(), list[Message]()
    puller, now = _repairing(tmp_path, broker, "5", asked)
    folder = tmp_path / "src"
    chunks = puller.partial.chunks
    frame = Frame(chunks.id, 0, read_chunk(folder, chunks[0]), repair=True).encode()
    now[0] = 3.6  # just before the first resend can be due (3.7 s at the soonest)
    broker.connect().publish(TOPICS.delivery_reply("dev-1"), frame, correlation_data=correlation)
    assert puller.partial.has(0)
    assert puller.stats.ignored == 1
    now[0] = 0.7 + 3.0 * 1.5 + 0.01  # the longest first wait: the resend is due regardless
    puller.tick(now[0])
    assert len(asked) == 2


def test_answers_to_requests_forged_in_its_name_do_not_keep_a_puller_on_a_gone_broadcast(
    tmp_path: Path,
) -> None:
    # A frame on the reply topic counted as the broadcast being alive: one request a second
    # forged as dev-1 (for a chunk it has) kept a puller whose broadcaster was gone waiting
    # for 600 s with no repair request, and its pull then failed at stall_s.
    now = [0.0]
    broker, server, chunks = _serving(tmp_path, size=8 * CHUNK, now=now)
    puller, folder = _pulling(tmp_path, broker, server, now, PullerOptions(idle_s=2.0, rejoins=2))
    # A broadcast that sends only a chunk the puller has (others need it) is alive all the
    # same: a frame every 1.5 s keeps it from rejoining, however long.
    fleet = broker.connect()
    chunk0 = read_chunk(folder, chunks[0])
    for seq in range(1, 8):
        fleet.publish(TOPICS.chunks("m", 1), Frame(chunks.id, 0, chunk0, seq=seq).encode())
        now[0] += 1.5
        puller.tick(now[0])
    assert (puller.state, puller.stats.rejoins) == ("broadcast", 0)

    # The broadcaster goes; a box asks for chunk 0 as dev-1 once a second, and a server
    # that takes such requests (one of an earlier build) answers each on dev-1's topic.
    answer = Frame(chunks.id, 0, chunk0, repair=True).encode()
    gone, forged = now[0], 0
    while not puller.done.is_set() and now[0] < gone + 60.0:
        if round(now[0] - gone, 2) % 1.0 == 0.0:
            fleet.publish(TOPICS.delivery_reply("dev-1"), answer)
            forged += 1
        now[0] = round(now[0] + 0.05, 2)
        puller.tick(now[0])
    assert forged >= 5  # answers came once a second all along its wait
    assert puller.state == "complete"
    assert puller.stats.rejoins == 2
    assert puller.stats.repair_requests > 0
    # Two rejoins of 2 s of silence each, then repair: as with nobody forging.
    assert now[0] - gone < 3 * 2.0 + PullerOptions().repair_spread_s + 0.5


def test_frames_that_answer_no_request_do_not_put_off_a_resend_on_mqtt_3(
    tmp_path: Path,
) -> None:
    # On 3.1.1 a frame carries no correlation data, and every frame was taken for an
    # answer: a chunk the puller has, answering a request forged in its name each second,
    # put off the resend of its own lost request for as long as they came.
    broker, asked = FakeBroker(), list[Message]()
    puller, now = _repairing(tmp_path, broker, "3.1.1", asked)
    chunks = puller.partial.chunks
    frame = Frame(chunks.id, 0, read_chunk(tmp_path / "src", chunks[0]), repair=True).encode()
    fleet = broker.connect("3.1.1")
    while now[0] < 12.0:
        if round(now[0] % 1.0, 2) == 0.0:
            fleet.publish(TOPICS.delivery_reply("dev-1"), frame)
        now[0] = round(now[0] + 0.05, 2)
        puller.tick(now[0])
    assert puller.partial.has(0)  # a chunk it asked for: kept, and an answer
    assert puller.stats.ignored >= 10  # the same chunk again answers nothing
    # Answered at 1 s, the request is due again 3 s later, not when the frames stop.
    assert len(asked) >= 2


def test_a_box_that_floods_repair_requests_is_answered_at_its_rate_and_no_faster(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    limits = RepairLimits(burst=4, per_s=1.0)
    # 32 chunks of 64 KiB: a request for all of them is one full answer (MAX_REPAIR_BYTES).
    broker, server, chunks = _serving(tmp_path, size=32 * CHUNK, now=now, limits=limits)
    dock2, dock1 = broker.connect(), broker.connect()
    own, other = TOPICS.delivery_reply("dock-2"), TOPICS.delivery_reply("dock-1")
    with caplog.at_level(logging.INFO, logger="edge_agent.fleet.server"):
        for _ in range(limits.burst + 10):
            dock2.publish(TOPICS.repair, _request(chunks, "dock-2"))
        assert len(_on(broker, own)) == limits.burst * len(chunks)
        assert server.repairs_limited == 10
        dock1.publish(TOPICS.repair, _request(chunks, "dock-1"))  # its own bucket: answered
        assert len(_on(broker, other)) == len(chunks)
        # A request is charged for what it is answered with: a second's budget is one
        # full answer, or 32 answers of one 64 KiB chunk.
        now[0] = 1.0
        one = _request(chunks, "dock-2", count=1, bitmap=encode_bits(bitmap(1, [0])))
        for _ in range(50):
            dock2.publish(TOPICS.repair, one)
    assert len(_on(broker, own)) == limits.burst * len(chunks) + 32
    said = [r for r in caplog.records if getattr(r, "event", None) == "fleet_repair_limited"]
    assert len(said) == 1


def test_requests_the_server_refuses_do_not_spend_the_named_devices_repairs(
    tmp_path: Path,
) -> None:
    # The bucket was taken before the request was read: a box flooding requests "as dev-1"
    # with a wrong block_size (each answered with an error dev-1 ignores) emptied dev-1's
    # budget, and its own repair was then dropped: 32 of 40 chunks in 400 s.
    now = [0.0]
    limits = RepairLimits(burst=4, per_s=1.0)
    broker, server, chunks = _serving(tmp_path, size=4 * CHUNK, now=now, limits=limits)
    forger, dev1 = broker.connect(), broker.connect()
    reply = TOPICS.delivery_reply("dev-1")
    refused = [
        _request(chunks, "dev-1", block_size=1),
        _request(chunks, "dev-1", release_id="0" * 16),
        _request(chunks, "dev-1", name="other"),
        _request(chunks, "dev-1", offset=len(chunks)),
    ]
    for _ in range(100):
        for payload in refused:
            forger.publish(TOPICS.repair, payload)
    # Errors have a budget of their own (the same numbers): a flood is not answered in full.
    assert len(_on(broker, reply)) == limits.burst
    assert server.repairs_limited == 4 * 100 - limits.burst
    dev1.publish(TOPICS.repair, _request(chunks, "dev-1"))
    frames = [decode_frame(p) for p in _on(broker, reply)]
    assert sum(f is not None for f in frames) == len(chunks)


def test_a_flood_of_small_requests_in_its_name_leaves_a_puller_its_repair(
    tmp_path: Path,
) -> None:
    # Counted per request, 20 requests a second for one 64 KiB chunk in dev-1's name spent
    # a budget of 2 full answers (4 MiB) a second: dev-1's own requests went unanswered.
    now = [0.0]
    limits = RepairLimits(burst=8, per_s=2.0)
    broker, server, chunks = _serving(tmp_path, size=8 * CHUNK, now=now, limits=limits)
    forger = broker.connect()
    forged = _request(chunks, "dev-1", count=1, bitmap=encode_bits(bitmap(1, [0])))

    def step() -> None:
        if round(now[0] % 0.05, 3) in (0.0, 0.05):  # 20 a second
            forger.publish(TOPICS.repair, forged)
        now[0] = round(now[0] + 0.01, 2)

    while now[0] < 3.0:  # flooding before the pull starts, as after it
        step()
    # A request per chunk: a pull that needs many answers, as a big release does.
    options = PullerOptions(idle_s=0.5, rejoins=0, repair_spread_s=0.0, repair_blocks=1)
    puller, _ = _pulling(tmp_path, broker, server, now, options)
    while not puller.done.is_set() and now[0] < 60.0:
        step()
        puller.tick(now[0])
    assert puller.state == "complete"
    assert now[0] < 3.0 + 0.5 + 1.0
    assert server.repairs_limited == 0


def test_one_request_is_answered_with_at_most_max_repair_bytes(tmp_path: Path) -> None:
    # 64 chunks of 128 KiB from one 200-byte message was 8 MiB; the first that fit are sent.
    broker, _, chunks = _serving(tmp_path, size=64 * CHUNK)
    broker.connect().publish(TOPICS.repair, _request(chunks, "dock-2"))
    frames = [decode_frame(p) for p in _on(broker, TOPICS.delivery_reply("dock-2"))]
    assert [f.index for f in frames if f is not None] == list(range(MAX_REPAIR_BYTES // CHUNK))


def test_a_puller_asks_for_no_more_than_a_server_answers(tmp_path: Path) -> None:
    asked = list[Message]()
    _repairing(tmp_path, FakeBroker(), "5", asked, chunks=64, repair_blocks=64)
    request = RepairRequest.model_validate_json(asked[0].payload)
    assert request.count * CHUNK <= MAX_REPAIR_BYTES


def test_a_puller_that_lost_the_whole_broadcast_repairs_it_unlimited(tmp_path: Path) -> None:
    # The most a legitimate puller asks: every chunk by repair, each request sent the
    # instant the last is answered (the fake broker answers before the publish returns).
    now = [0.0]
    broker, server, chunks = _serving(tmp_path, size=100 * CHUNK, now=now)
    options = PullerOptions(idle_s=0.5, rejoins=0, repair_spread_s=0.0)
    puller, _ = _pulling(tmp_path, broker, server, now, options)
    while not puller.done.is_set() and now[0] < 10.0:
        now[0] += 0.05
        puller.tick(now[0])
    assert puller.state == "complete"
    assert puller.stats.repaired == len(chunks)
    assert puller.stats.repair_requests >= len(chunks) // 16
    assert server.repairs_limited == 0


def test_correlation_data_that_is_not_base64_drops_the_request_not_the_handler(
    tmp_path: Path,
) -> None:
    # It raised in the server's message handler: a traceback in the journal per request.
    broker, server, chunks = _serving(tmp_path)
    old = broker.connect("3.1.1")
    old.publish(TOPICS.repair, _request(chunks, "dock-2", correlation_data="not base64!"))
    assert _on(broker, TOPICS.delivery_reply("dock-2")) == []
    assert server.repairs_served == 0


class _SlowDownlink:
    """A box's downlink at `bytes_per_s`: the server answers every repair request in full,
    and its frames reach the puller in order, no faster than the link carries them."""

    mqtt_version: MqttVersion = "5"

    def __init__(self, chunks: ChunkMap, folder: Path, bytes_per_s: float) -> None:
        self.chunks, self.folder, self.rate = chunks, folder, bytes_per_s
        self.queued: list[tuple[bytes, bytes | None]] = []
        self.sent = 0
        self.most_queued = 0
        self.puller: Puller | None = None
        self._budget = 0.0

    def subscribe(self, topic_filter: str, handler: object, qos: int = 1) -> object:
        return lambda: None

    def publish(self, topic: str, payload: bytes, **kw: object) -> None:
        if not topic.endswith("/repair"):
            return  # joins, acks, leaves: no broadcast here
        request = RepairRequest.model_validate_json(payload)
        wanted = decode_bits(request.bitmap, request.count)
        assert wanted is not None
        for k in range(request.count):
            if bit(wanted, k):
                ref = self.chunks[request.offset + k]
                data = read_chunk(self.folder, ref)
                frame = Frame(self.chunks.id, ref.index, data, repair=True).encode()
                self.queued.append((frame, kw.get("correlation_data")))  # type: ignore[arg-type]
                self.sent += len(frame)
        self.most_queued = max(self.most_queued, sum(len(f) for f, _ in self.queued))

    def carry(self, seconds: float) -> None:
        assert self.puller is not None
        self._budget += self.rate * seconds
        while self.queued and self._budget >= len(self.queued[0][0]):
            frame, correlation = self.queued.pop(0)
            self._budget -= len(frame)
            reply = TOPICS.delivery_reply(self.puller.device_id)
            self.puller.on_reply(Message(reply, frame, correlation_data=correlation))
        if not self.queued:
            self._budget = min(self._budget, self.rate * seconds)


@pytest.mark.parametrize("seed", range(3))
def test_a_slow_downlink_is_waited_for_not_flooded_with_resends(tmp_path: Path, seed: int) -> None:
    # A resend waited a flat 3 s after the last answer, less than one 64 KiB chunk takes
    # at 128 kbit/s (a weak cellular link): each slow frame sent the whole request again,
    # the answers piled up for the box faster than it could take them, and the backoff
    # never began.
    signed, folder = make_release(tmp_path, 16 * CHUNK)
    chunks = ChunkMap(signed.release)
    link = _SlowDownlink(chunks, folder, bytes_per_s=128_000 / 8)
    now = [0.0]
    puller = Puller(
        link, TOPICS, "dev-1", PartialTransfer(tmp_path / "pull", signed),  # type: ignore[arg-type]
        clock=lambda: now[0], rng=random.Random(seed),
    )  # fmt: skip
    link.puller = puller
    puller.start()
    puller._to_repair()  # the broadcast is over for this box: the rest comes by repair
    size = sum(f.size for f in signed.release.files)
    while not puller.done.is_set() and now[0] < 600.0:
        now[0] += 0.05
        link.carry(0.05)
        puller.tick(now[0])
    assert puller.state == "complete"
    ideal = size / link.rate  # 66 s for 1 MiB at 128 kbit/s
    assert now[0] < 2 * ideal, now[0]
    # At most one resend of the first request, sent before its first answer could come
    # (5.8 times the release went, and the queue for the box grew all along).
    assert link.sent <= 2 * size + 2 * CHUNK, (link.sent, size)
    assert link.most_queued < 2.5 * MAX_REPAIR_BYTES, link.most_queued
