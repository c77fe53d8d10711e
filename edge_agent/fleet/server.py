"""`edge-fleet serve`: answers repair requests and paces broadcasts.

Scale-out without a coordinator: the broker is the distributed engine.
- Repair requests arrive on an MQTT shared subscription (`$share/<group>/...`):
  each goes to one of the running servers, and a dead one's share moves to
  the others.
- Each release has one broadcaster, chosen by rendezvous hashing over the
  servers present (each keeps a retained presence message that its will
  clears). Every server sees every join and ack and acts only for the releases
  it owns; when a server appears or vanishes, the owners move, and the pullers
  of a release whose broadcaster vanished rejoin after `idle_s` and are picked up.
  After its own reconnect, a server counts again only the peers whose presence
  the broker sends again (`on_connected`).
- A repair is answered on the asking device's own reply topic only, at most
  `MAX_REPAIR_BYTES` of it, and what each device id is answered with is limited
  in bytes (`RepairLimits`): a request is a few hundred bytes, its answer megabytes.
- A device sends its joins, acks, leaves and repair requests on its own topics
  (`Topics.own_control`, `own_repair`), which the shipped ACL lets its box alone
  write; what one says in another device's name there is dropped. The fleet-wide
  topics devices of earlier builds send on are taken too (`shared_topics`), except
  in the name of a device heard on its own: there, only a forger still writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from edge_agent.comms.base import Communicator, Message
from edge_agent.config_files import drop_unknown_fields
from edge_agent.delivery.broadcast import Broadcast, BroadcastOptions
from edge_agent.delivery.buckets import TokenBuckets
from edge_agent.delivery.chunks import ChunkRef, read_chunk
from edge_agent.delivery.joins import JoinGate, JoinLimits
from edge_agent.fleet.recheck import SETTLE_MAX_S, Recheck
from edge_agent.fleet.repo import Repo, RepoEntry
from edge_agent.logs import Throttle, log_event
from edge_agent.protocol.delivery import (
    CONTROL,
    MAX_REPAIR_BYTES,
    Ack,
    BroadcastStatus,
    Frame,
    Join,
    RepairError,
    RepairRequest,
    ServerPresence,
    bit,
    decode_base64,
    decode_bits,
)
from edge_agent.protocol.topics import DEFAULT_SHARE_GROUP, FANIN_QOS, RESERVED_IDS, Topics

log = logging.getLogger(__name__)

MAX_PEERS = 64
"""Fleet servers counted at most (itself included); a fleet runs a handful. Every release's
broadcaster is chosen among them, so a flood of presences must not make thousands."""
OWN_HEARD_S = 300.0
"""How long a device heard on its own delivery topics is not taken on the fleet-wide ones.
Every server hears a pull's joins and acks; a repair request goes to one server of several
(a shared subscription, round robin in mosquitto), at least every 45 s from a device
still repairing, so a handful of servers each hear it well within this. With many more,
or one started in the middle of a long repair, a server can take a request in its name
on the fleet-wide topic meanwhile: the reason the shipped ACL keeps that topic closed. A
box downgraded to an earlier build deploys again this long after its last message as the
later one."""
PRESENCE_QOS = 1
"""The servers' presence, subscribed at: the echo that follows them after a reconnect is
subscribed at it too, or it could pass them (`Recheck`)."""
SAID_AT_MOST = 10_000
"""Devices whose refused or limited requests are logged (once each); past it, only counted."""


@dataclass(frozen=True, slots=True)
class RepairLimits:
    """How much one device id may have a server answer it with, and refuse it.

    A request is charged for the chunks it is answered with (a short last chunk as a whole
    one), in full answers of `MAX_REPAIR_BYTES` (2 MiB). One the server refuses takes
    from the device id's budget of refusals instead (the same numbers, in errors sent),
    and one that asks for no chunk the release has, from neither. Any box may ask in
    another's name: charged before it was even read, a flood of refused requests (a wrong
    block_size) starved the named device's real repair.

    A puller keeps one request outstanding and sends the next when the last is answered
    (or again after `repair_timeout_s`, 3 s and backing off), each for at most 16 chunks
    within a span of 64. Losses a broadcast left scattered take about a request per 64
    chunks, and a release lost whole one per 16: 60 and 240 requests for 500 MB. `burst`
    lets all of those through at once, and `per_s` 16 MiB/s after it: a puller repairing
    a lossy transfer is not limited, a box that floods is.
    """

    burst: int = 256
    """Full answers (512 MiB in all) a device that was quiet may have at once."""
    per_s: float = 8.0
    """Full answers a second (16 MiB/s) a device may go on having after its burst."""
    devices: int = 100_000
    """Device ids whose buckets are kept (the least recently heard are forgotten)."""


def _limits_key(device: str, own: bool) -> str:
    """Whose joins and repair budgets a message spends: its device's, on its own topics; on
    the fleet-wide ones, a set of the device's own apart. One set for both let a box that
    forged three joins on a fleet-wide topic, in the name of a later build's device, have
    that device's next real join refused, and its pull sent to repair. A device id has no
    '/', so the two never meet."""
    return device if own else f"fleet-wide/{device}"


def owner(servers: set[str], release_id: str) -> str:
    """Rendezvous (highest random weight) hashing: the server that broadcasts a release."""
    return max(servers, key=lambda s: hashlib.sha256(f"{s}/{release_id}".encode()).digest())


class FleetServer:
    """One `serve` instance. `start()`, then `run(stop)` on a thread of your choosing."""

    def __init__(
        self,
        comm: Communicator,
        repo: Repo,
        *,
        instance: str,
        topics: Topics | None = None,
        share_group: str | None = DEFAULT_SHARE_GROUP,
        options: BroadcastOptions | None = None,
        limits: RepairLimits | None = None,
        join_limits: JoinLimits | None = None,
        shared_topics: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.comm = comm
        self.repo = repo
        self.instance = instance
        self.topics = topics or Topics()
        self.share_group = share_group
        self.options = options or BroadcastOptions()
        self.clock = clock
        self.broadcasts: dict[tuple[str, int], Broadcast] = {}
        self.servers: set[str] = {instance}
        self.repairs_served = 0
        self.repair_chunks = 0
        self.unreadable_chunks = 0
        """Chunks the repository could not give as the release says, each time asked."""
        self._unreadable_said = Throttle(60.0)
        self.repairs_refused = 0
        """Requests that named a reply topic other than their device's own: dropped."""
        self.repairs_limited = 0
        """Requests past their device's budget of answers, or of refusals (`RepairLimits`):
        dropped."""
        limits = limits or RepairLimits()
        self._buckets = TokenBuckets(limits.burst, limits.per_s, limits.devices)
        self._refusals = TokenBuckets(limits.burst, limits.per_s, limits.devices)
        self._said: set[tuple[str, str]] = set()
        self._heard_shared: set[str] = set()
        """Device ids heard on the fleet-wide topics and logged (`fleet_shared_topics`):
        a set of its own, so that invented names do not use up `_said`."""
        self._joins = JoinGate(join_limits)
        self.joins_refused = 0
        """Joins past their device id's limits (`JoinLimits`): ignored."""
        self.shared_topics = shared_topics
        self._own: OrderedDict[str, float] = OrderedDict()
        """When each device was last heard on its own topics, the latest last (at most
        `limits.devices`, none older than OWN_HEARD_S): the fleet-wide topics do not
        speak for them."""
        self._own_limit = limits.devices
        self.misnamed = 0
        """Messages dropped for the device they named: another than their own topic's, or,
        on a fleet-wide topic, one heard on its own."""
        self._cond = threading.Condition()
        self._started = time.time()
        self._peers = Recheck(self._cond, self._peers_gone, qos=PRESENCE_QOS, lost=self._echo_lost)
        """The peers counted at the last reconnect whose presence has not come since."""

    def start(self) -> None:
        self.comm.subscribe(self.topics.servers_filter, self.on_presence, qos=PRESENCE_QOS)
        # Joins, acks and repair requests come from the whole fleet at once: at QoS 0, as
        # the console follows the fleet (`FANIN_QOS`), or the broker drops what is
        # past its queue for this one client. The devices publish at QoS 1, and ask again
        # (rejoin, resend) what a lost connection drops.
        topics, group = self.topics, self.share_group

        def repairs(topic_filter: str) -> str:
            # None: a broker without shared subscriptions (amqtt), and a single server.
            return topic_filter if group is None else topics.shared(topic_filter, group)

        self.comm.subscribe(topics.own_control_filter, self.on_control, qos=FANIN_QOS)
        self.comm.subscribe(repairs(topics.own_repair_filter), self.on_repair, qos=FANIN_QOS)
        if self.shared_topics:
            self.comm.subscribe(topics.control_filter, self.on_control, qos=FANIN_QOS)
            self.comm.subscribe(repairs(topics.repair), self.on_repair, qos=FANIN_QOS)
        self.announce()

    def announce(self) -> None:
        """Publish the retained presence; again after every reconnect (a broker restarted
        without persistence has forgotten it)."""
        presence = ServerPresence(instance=self.instance, started_at=self._started)
        self.comm.publish(
            self.topics.server(self.instance), presence.model_dump_json().encode(), retain=True
        )

    def on_connected(self) -> None:
        """To be called on every connect of the session (its `on_connected`): every peer
        counted then is counted on only if the broker sends its presence again, and the
        presence is announced again.

        The broker sends every retained presence again as the session resubscribes, and
        only those: a peer whose presence was cleared while this server was away (its will,
        a broker restarted without persistence) was counted for ever, and the releases the
        rendezvous hash gave it were broadcast by no one; their pullers went to repair, one
        copy per box through the broker. This server sends itself an echo behind the
        presences (fleet/recheck.py) and drops the peers not heard by then
        (`fleet_peer_gone`). One whose presence comes is never dropped, so the owners do not
        move and back; this server is never one to check. A peer dropped and then heard of
        (its own reconnect announces it) is counted again.

        The releases a dropped peer owned are this server's or another's from the next
        join of their pullers on (`on_control` asks `owner` at each): a puller whose
        broadcast stopped rejoins after `idle_s`, one that had already given up on the
        broadcast is repairing.
        """
        # On the presence topics, which `serve`'s user may write (systemd/mosquitto/
        # fleet.acl): every server hears it, and takes it for what it is, an empty
        # presence of no server.
        echo = self.topics.server(f"echo-{uuid.uuid4().hex}")
        self._peers.reconnected(self.comm, echo, lambda: self.servers - {self.instance})
        self.announce()

    def _peers_gone(self, peers: set[str]) -> None:
        """The presences have all come again: drop the peers not among them. Holding
        `_cond` (`Recheck`)."""
        if not peers:
            return
        self.servers -= peers
        log_event(
            log,
            logging.WARNING,
            "fleet_peer_gone",
            peers=",".join(sorted(peers)),
            servers=",".join(sorted(self.servers)),
            detail="its presence was not on the broker after this server's reconnect",
        )

    def _echo_lost(self, echo: str, peers: set[str]) -> None:
        """The echo of `on_connected` did not come back: say so, and what to fix. Holding
        `_cond` (`Recheck`).

        Without it, a broker whose ACL refuses the echo (a user that may write its own
        presence only) had every peer not heard again dropped 10 s after each reconnect,
        and the operator saw peers vanish for no reason given.
        """
        log_event(
            log,
            logging.WARNING,
            "fleet_echo_lost",
            echo=echo,
            peers=",".join(sorted(peers)) or "-",
            detail=f"this server's echo did not come back within {SETTLE_MAX_S:g} s of its "
            "reconnect, so it could not tell when the broker had sent every peer's "
            "presence again; the peers not heard by then are dropped (one heard later "
            "is counted again), and this repeats at every reconnect",
            fix=f"let this server's MQTT user publish and subscribe to "
            f"{self.topics.servers_filter} (the broker's ACL; see systemd/mosquitto/"
            "fleet.acl)",
        )

    def close(self) -> None:
        """Withdraw the presence (a clean stop; the will covers the unclean one)."""
        self.comm.publish(self.topics.server(self.instance), b"", retain=True)

    def run(self, stop: threading.Event) -> None:
        """Pace every broadcast this server owns until `stop` is set."""
        while not stop.is_set():
            with self._cond:
                wait = self._step_all(self.clock())
                self._cond.wait(0.5 if wait is None else min(wait, 0.5))

    def step(self, now: float) -> float | None:
        """Pace every broadcast once (what `run` does in a loop); for single-threaded drivers."""
        with self._cond:
            return self._step_all(now)

    def _step_all(self, now: float) -> float | None:
        soonest: float | None = None
        for key, broadcast in list(self.broadcasts.items()):
            wait = broadcast.step(now)
            if wait is not None:
                soonest = wait if soonest is None else min(soonest, wait)
            if not broadcast.active and wait is None:
                del self.broadcasts[key]
        return soonest

    # --- handlers (dispatch thread) --------------------------------------------------------
    def on_presence(self, message: Message) -> None:
        instance = message.topic.rsplit("/", 1)[-1]
        if instance == self.instance:
            return
        if not message.payload:  # a will, or a clean stop (or a server's echo)
            with self._cond:
                self.servers.discard(instance)
                self._peers.heard(instance)
            return
        # Only a presence under its own name is a peer: any message there used to make
        # one, and a release handed to a server that is not there is never broadcast.
        # A field a newer server adds is dropped, not the peer: refused whole, that server
        # went uncounted here while it counted this one, and during a rolling upgrade
        # both took the same releases for their own and broadcast them twice.
        try:
            presence, _ = drop_unknown_fields(
                ServerPresence.model_validate, json.loads(message.payload)
            )
        except (ValueError, RecursionError):  # ValidationError is a ValueError
            presence = None
        with self._cond:
            self._peers.heard(instance)
            if presence is None or presence.instance != instance:
                self.servers.discard(instance)
                self._say_once(
                    "fleet_peer_refused", instance, instance=instance, detail="not a presence"
                )
            elif instance in self.servers or len(self.servers) < MAX_PEERS:
                self.servers.add(instance)
            else:
                self._say_once(
                    "fleet_peer_refused", instance, instance=instance, detail="too many peers"
                )

    def on_control(self, message: Message) -> None:
        # Each shape exactly: a topic that comes on the own topics' filter and does not
        # parse as one is no fleet-wide topic (`<device>/delivery/ctl/1/x` read loosely as
        # release "ctl" v1 was, and then spoke for any device).
        own = self.topics.parse_own_control(message.topic)
        where = own[1:] if own else None
        if own is None and self.shared_topics:
            where = self.topics.parse_control(message.topic)
        if where is None:
            return
        try:
            control = CONTROL.validate_json(message.payload)
        except ValidationError:
            return
        # A join looks at the release file again (it may have been published anew since);
        # an ack or a leave, which only a joined puller sends, takes the entry it joined.
        entry = self.repo.get(*where, recheck=isinstance(control, Join))
        if entry is None:
            return
        now = self.clock()
        device = control.device_id
        with self._cond:
            if not self._sender_named(device, own[0] if own else None):
                return
            if owner(self.servers, entry.chunks.id) != self.instance:
                self.broadcasts.pop(where, None)
                return
            key = _limits_key(device, own is not None)
            if isinstance(control, Join) and not self._joins.join(key, now):
                self.joins_refused += 1
                self._say_once("fleet_join_refused", control.device_id, device=control.device_id)
                return
            broadcast = self.broadcasts.get(where)
            if broadcast is not None and broadcast.chunks.id != entry.chunks.id:
                # Published again since (a fresh expiry, another chunk size): a new release
                # id, which the old broadcast refused every join of until `serve` restarted.
                # Its pullers fetch the release again when their transfer fails.
                del self.broadcasts[where]
                broadcast = None
            if broadcast is None:
                if not isinstance(control, Join):
                    return
                broadcast = self._broadcast(entry)
                self.broadcasts[where] = broadcast
            if isinstance(control, Join):
                broadcast.join(control, now)
            elif isinstance(control, Ack):
                # Only an ack that moved its puller on starts its joins in a row again:
                # taken from any ack in its name, a stale one sent with each rejoin kept a
                # fake puller's joins coming, and the window waiting on it, for good.
                if broadcast.ack(control, now):
                    self._joins.ack(key)
            else:
                broadcast.leave(control)
            self._cond.notify()

    def _broadcast(self, entry: RepoEntry) -> Broadcast:
        release = entry.signed.release
        chunk_topic = self.topics.chunks(release.name, release.version)
        status_topic = self.topics.status(release.name, release.version)

        def send_frame(payload: bytes) -> None:
            self.comm.publish(chunk_topic, payload, qos=0)

        def send_status(status: BroadcastStatus) -> None:
            self.comm.publish(status_topic, status.model_dump_json().encode(), qos=1)

        return Broadcast(
            entry.chunks,
            lambda i: self._chunk(entry, entry.chunks[i]),
            send_frame,
            send_status,
            self.instance,
            self.options,
        )

    def on_repair(self, message: Message) -> None:
        sender = self.topics.own_repair_device(message.topic)
        if sender is None and (not self.shared_topics or message.topic != self.topics.repair):
            return  # neither shape: a reserved word's `<prefix>/fleet/delivery/repair`, say
        try:
            request = RepairRequest.model_validate_json(message.payload)
        except ValidationError as exc:
            log_event(log, logging.INFO, "fleet_bad_repair", error=exc.errors()[0]["msg"])
            return
        with self._cond:
            if not self._sender_named(request.device_id, sender):
                return
        own = sender is not None
        reply = self._reply_topic(request, message.response_topic)
        if reply is None:
            return
        correlation = message.correlation_data
        if correlation is None and request.correlation_data:
            correlation = decode_base64(request.correlation_data)
            if correlation is None:
                log_event(log, logging.INFO, "fleet_bad_repair", error="correlation_data")
                return
        entry = self.repo.get(request.name, request.version)
        problem = self._check(request, entry)
        if problem is not None or entry is None:
            if not self._take(self._refusals, request.device_id, own, 1.0):
                return
            error = RepairError(
                release_id=request.release_id,
                correlation_data=base64.b64encode(correlation).decode() if correlation else None,
                code=problem[0] if problem else "store.not_found",
                message=problem[1] if problem else "not published here",
            )
            self.comm.publish(
                reply, error.model_dump_json().encode(), qos=1, correlation_data=correlation
            )
            return
        answer = self._answer(request, entry)
        # Charged for what it is answered with, as the budget is bytes sent to one device:
        # counted per request, a box asking for one chunk in another's name 8 times a
        # second spent all of that device's repair, at a sixteenth of what it allows.
        cost = len(answer) * entry.chunks.chunk_size / MAX_REPAIR_BYTES
        if not answer or not self._take(self._buckets, request.device_id, own, cost):
            return
        self.repairs_served += 1
        for ref in answer:
            data = self._chunk(entry, ref)
            if data is None:
                continue  # unanswered, the box asks again after its own wait
            frame = Frame(entry.chunks.id, ref.index, data, repair=True)
            self.comm.publish(reply, frame.encode(), qos=0, correlation_data=correlation)
            self.repair_chunks += 1

    def _chunk(self, entry: RepoEntry, ref: ChunkRef) -> bytes | None:
        """Chunk `ref` as the release says it is, or None (said, once a minute).

        Checked against its sha256 before it goes out: a file rotted, edited in place or cut
        short in the repository sent every box bytes it refused, each box asked again at
        once, and 5,000 of them asked at their whole repair budget. A read that fails (a
        re-publish replacing the files, an I/O error) ended `serve` and every broadcast."""
        try:
            data = read_chunk(entry.folder, ref)
        except OSError as exc:
            why = f"cannot be read: {exc.strerror or exc}"
        else:
            if entry.chunks.matches(ref.index, data):
                return data
            why = f"does not match the release ({len(data)} of {ref.length} bytes read)"
        release = entry.signed.release
        self.unreadable_chunks += 1
        if self._unreadable_said.ready(f"{release.name}/{release.version}"):
            log_event(
                log,
                logging.ERROR,
                "repo_chunk_unreadable",
                model=release.name,
                version=release.version,
                file=ref.file.path,
                chunk=ref.index,
                problem=why,
                unreadable_total=self.unreadable_chunks,
                fix="publish the release again with edge-fleet publish-model (the same "
                "version and files), from the model files themselves",
            )
        return None

    def _sender_named(self, named: str, sender: str | None) -> bool:
        """Whether a message that names device `named` may speak for it, having come on
        `sender`'s own topic (None: a fleet-wide one). Holding `_cond`.

        On its own topic a device speaks for itself alone. A fleet-wide topic, which every
        box may write, speaks for a device of an earlier build, not for one heard on its
        own within OWN_HEARD_S: what comes there in its name is then another box's."""
        now = self.clock()
        own = self._own
        while own and (len(own) > self._own_limit or now - next(iter(own.values())) > OWN_HEARD_S):
            own.popitem(last=False)
        if sender is not None:
            if named == sender:
                own[sender] = now
                own.move_to_end(sender)
                return True
        elif named not in own:
            # Named, so the operator knows which boxes still need the fleet-wide topics
            # (and the ACL lines that let any box write them).
            if named not in self._heard_shared and len(self._heard_shared) < SAID_AT_MOST:
                self._heard_shared.add(named)
                log_event(
                    log,
                    logging.WARNING,
                    "fleet_shared_topics",
                    device=named,
                    detail="an earlier build: upgrade it, then serve with --own-topics-only",
                )
            return True
        self.misnamed += 1
        self._say_once(
            "fleet_misnamed",
            sender or named,
            device=named,
            topic_device=sender or "(fleet-wide)",
            detail="a device speaks on its own topics, for itself only",
        )
        return False

    def _take(self, buckets: TokenBuckets, device: str, own: bool, cost: float) -> bool:
        """Take `cost` from `device`'s bucket for what it asked on its own topics (`own`) or
        on the fleet-wide one (`_limits_key`); False (counted, said once) if it lacks it."""
        key = _limits_key(device, own)
        if buckets.take(key, self.clock(), cost):
            return True
        self.repairs_limited += 1
        self._say_once("fleet_repair_limited", key, device=device, fleet_wide=not own)
        return False

    @staticmethod
    def _answer(request: RepairRequest, entry: RepoEntry) -> list[ChunkRef]:
        """The chunks `request` is answered with: the first it asks for that the release
        has, up to MAX_REPAIR_BYTES (a request of 64 big chunks made one message of 200
        bytes into 8 MiB; the puller asks no more than that). None for a bitmap that is
        not one."""
        bits = decode_bits(request.bitmap, request.count)
        if bits is None:
            return []
        chunks = entry.chunks
        answer: list[ChunkRef] = []
        room = MAX_REPAIR_BYTES
        for k in range(request.count):
            index = request.offset + k
            if bit(bits, k) and index < len(chunks):
                if chunks[index].length > room:
                    break
                room -= chunks[index].length
                answer.append(chunks[index])
        return answer

    def _reply_topic(self, request: RepairRequest, named: str | None) -> str | None:
        """Where to answer `request`: its device's own reply topic, the one every agent
        names, or None (dropped) when it names another. Answering wherever a request said
        let any box send RepairErrors to another's reply topic (aborting its pull) and
        have this server publish megabytes of frames on topics that box may not write."""
        reply = self.topics.delivery_reply(request.device_id)
        named_topics = {t for t in (named, request.response_topic) if t}
        if request.device_id not in RESERVED_IDS and named_topics <= {reply}:
            return reply
        self.repairs_refused += 1
        self._say_once(
            "fleet_repair_refused",
            request.device_id,
            device=request.device_id,
            reply_topic=",".join(sorted(named_topics)),
            detail=f"a repair answers only on {reply}",
        )
        return None

    def _say_once(self, event: str, who: str, /, **fields: object) -> None:
        """Log `event` for `who` (a device, a peer) the first time only: a box that keeps
        asking must not fill the journal. Bounded: the names are whatever messages say."""
        if (event, who) in self._said or len(self._said) >= SAID_AT_MOST:
            return
        self._said.add((event, who))
        log_event(log, logging.WARNING, event, **fields)

    @staticmethod
    def _check(request: RepairRequest, entry: RepoEntry | None) -> tuple[str, str] | None:
        if entry is None:
            return ("store.not_found", f"{request.name} v{request.version} is not published here")
        if request.release_id != entry.chunks.id:
            return ("release.invalid", "release id does not match the published release")
        if request.block_size != entry.chunks.chunk_size:
            return ("input.invalid", f"block_size must be {entry.chunks.chunk_size}")
        if request.offset >= len(entry.chunks):
            return ("input.invalid", f"offset past the last chunk ({len(entry.chunks) - 1})")
        return None
