"""The MQTT session on paho-mqtt 2.x: one network thread, one dispatch thread.

- MQTT 5 by default; with `persistent` the session (subscriptions, QoS 1 queued
  for us) outlives a disconnect: session expiry on 5, clean_session=false on 3.1.1.
- Reconnects itself with bounded exponential backoff and full jitter (so a
  fleet that lost its broker does not come back in lock-step), resubscribing
  every filter on every CONNACK. The backoff starts again after a link that
  stayed up `stable_after_s`; links dropped sooner, again and again (two boxes
  with one client id), keep backing off and are logged as `mqtt.unstable_link`.
- The will is asked for before every connect, so it can carry a per-connection
  sequence number (Sparkplug's bdSeq); `on_connected` runs after every connect,
  on the dispatch thread, to publish a birth message.
- paho callbacks only copy the message into a queue; handlers run on the
  dispatch thread, so a slow handler never stalls keepalives.
- A QoS 1 message is acknowledged (PUBACK) once its handlers have returned, not on
  arrival: a process killed in between leaves it with the broker, which sends it
  again to the persistent session's next connection. A command is recorded by its
  handler, so no command the broker took is lost to a kill.
- Every wait has a timeout: connect, flush, stop.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edge_agent.comms.base import Handler, Message, MqttVersion, Unsubscribe, topic_matches
from edge_agent.comms.held_filters import HeldFilters
from edge_agent.comms.settings import BrokerSettings
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import Throttle, log_crash, log_event

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Will:
    """What the broker publishes for us when we vanish without a DISCONNECT."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = True


_CONNECTED = object()


@dataclass(frozen=True, slots=True)
class _Received:
    """A message on its way to the dispatch thread, with what acknowledging it needs."""

    message: Message
    mid: int
    link: int


_LOOP_S = 1.0
"""The network loop's select timeout, as paho's loop_forever. Incoming packets, our publishes
and `stop` all wake it; the timeout only paces keepalive checks, which need no finer step."""
_EARLY_S = 5.0
_STOP = object()
_DROPPED_KEPT = 256
"""Filters let go of and unsubscribed again on each connect (each pull adds one)."""
_SHORT_LINKS_WARN = 3
"""Links in a row lost before `stable_after_s` that make the session say so."""
_WARN_AFTER_S = 15.0
"""Connect failures are logged at INFO until they have lasted this long..."""
_WARN_EVERY_S = 60.0
"""...then at WARNING, at most this often."""


def backoff_delay(attempt: int, low: float, high: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in [low, min(high, low * 2**(attempt + 1))].

    Even the first retry is spread, over [low, 2 low]: after a lost link every box starts
    again at attempt 0, and a fleet whose broker restarted must not come back in one instant.
    """
    ceiling = min(high, low * (2 ** min(attempt + 1, 30)))
    return rng.uniform(low, max(low, ceiling))


def _network_thread_writes(client: paho.Client, userdata: Any, sock: Any) -> None:
    """paho's "socket wants writing" hook: nothing to do, the network loop writes."""


class MqttSession:
    """A `Communicator` on a real broker. Call `start()`, then use it; `stop()` at the end."""

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        will: Callable[[], Will] | None = None,
        on_connected: Callable[[MqttSession], None] | None = None,
        held: HeldFilters | None = None,
    ) -> None:
        """
        Args:
            held: where a persistent session keeps the filters it holds, for the next
                process: those that process does not subscribe again it unsubscribes on
                connect, as it does with filters let go of during an outage.
        """
        if settings.persistent and not settings.client_id:
            raise EdgeAgentError(
                "a persistent MQTT session needs a fixed client id",
                "set client_id",
                code="config.invalid",
            )
        self.settings = settings
        self.mqtt_version: MqttVersion = settings.version
        self._will = will
        self._on_connected = on_connected
        self.connected = threading.Event()
        self._beats = {"mqtt-net": time.monotonic(), "mqtt-rx": time.monotonic()}
        """When each thread last showed it was not stuck: a pass of its loop, or (waiting out
        a reconnect backoff) when it will next be due. Read by `stale`."""
        self.reconnects = 0
        """Links to the broker lost after they were up (a failed connect is not one)."""
        self._up_at = 0.0  # monotonic time of the last CONNACK; only the network thread
        self._short_links = 0  # links in a row lost before stable_after_s
        self._short_warned = Throttle(_WARN_EVERY_S)
        self._refused_warned = Throttle(_WARN_EVERY_S)  # keyed by the refusal's reason
        self.dropped = 0
        """QoS 0 messages dropped because handlers fell behind by dispatch_limit_bytes."""
        self.rejected = 0
        """QoS 1 messages the broker acknowledged with a failure reason (MQTT 5)."""
        self.last_refusal: ReasonCode | None = None
        """The broker's reason for the latest of those ("Not authorized", "Quota exceeded")."""
        self.last_error: str | None = None
        """Why the last connect failed, for an operator."""
        self.refused = False
        """Whether it was an answer (refused, no such host, CONNACK no) rather than silence."""
        self._connect_warned = Throttle(_WARN_EVERY_S)
        self._failing_since: float | None = None
        self._lost_at: float | None = None  # monotonic: when a link that was up was lost
        self._back_warned = Throttle(_WARN_EVERY_S)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._subs: dict[str, tuple[int, list[Handler]]] = {}
        self._dropped: dict[str, None] = {}  # filters to unsubscribe on each connect, oldest first
        self._unsub_mids: dict[int, str] = {}  # UNSUBSCRIBEs of `_dropped` filters awaiting acks
        self._unsub_early: set[int] = set()  # UNSUBACKs read before their mid was recorded
        self._online = False  # under _lock: subscriptions go out now (set with their snapshot)
        # Counts connections; an ack belongs to the one it came on. Written by the network
        # thread under _lock; read there freely, and under _lock elsewhere.
        self._link = 0
        # Held from deciding to send a SUBSCRIBE or UNSUBSCRIBE until paho has queued it, by
        # subscribe, unsubscribe and _on_connect alike: the broker must get them in the order
        # they were decided, or a reconnect's resubscribe can follow (and undo) a newer
        # UNSUBSCRIBE. Taken before _held_lock and _lock; never in paho's ack callbacks.
        self._send_lock = threading.Lock()
        self._held = held
        self._held_lock = threading.Lock()  # taken before _lock, never after
        self._held_saved: list[str] = []
        if held is not None:
            # What the last process held and this one has not subscribed (yet): let go of on
            # connect unless subscribed again first, which takes it out of the list.
            self._held_saved = sorted(held.load())
            for topic_filter in self._held_saved[-_DROPPED_KEPT:]:
                self._dropped[topic_filter] = None
        # Never held while calling into paho: paho calls _on_publish with its own mutexes
        # held (on the network thread, or at once inside publish() for a QoS 0 write), so
        # holding ours across client.publish() deadlocks against it.
        self._acked = threading.Condition(threading.Lock())
        self._pending: set[int] = set()
        self._early: dict[int, float] = {}
        """mids acknowledged before publish() recorded them (and QoS 0 writes), by time."""
        self._queue: queue.Queue[object] = queue.Queue()
        self._queued_bytes = 0
        self._count_lock = threading.Lock()
        self._rng = random.Random()
        self._client = self._make_client()
        self._net = threading.Thread(target=self._network, name="mqtt-net", daemon=True)
        self._dispatch = threading.Thread(target=self._dispatcher, name="mqtt-rx", daemon=True)

    # --- setup -------------------------------------------------------------------------
    def _make_client(self) -> paho.Client:
        s = self.settings
        v5 = s.version == "5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if v5 else not s.persistent,
            reconnect_on_failure=False,  # we reconnect ourselves, with jitter
            # paho acknowledges a QoS 1 message as on_message returns, which is when it is
            # queued here, before any handler has seen it: a kill in between lost it.
            manual_ack=True,
        )
        client.connect_timeout = s.connect_timeout_s
        # Bounded: a broker that is away must not make paho hold unbounded QoS 1 messages.
        client.max_queued_messages_set(10_000)
        if s.username is not None:
            password = s.password.get_secret_value() if s.password is not None else None
            client.username_pw_set(s.username, password)
        if s.tls is not None:
            try:
                client.tls_set(
                    ca_certs=str(s.tls.ca_file) if s.tls.ca_file else None,
                    certfile=str(s.tls.cert_file) if s.tls.cert_file else None,
                    keyfile=str(s.tls.key_file) if s.tls.key_file else None,
                    cert_reqs=ssl.CERT_REQUIRED,
                )
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                files = [str(f) for f in (s.tls.ca_file, s.tls.cert_file, s.tls.key_file) if f]
                raise EdgeAgentError(
                    f"cannot set up TLS from {', '.join(files) or 'the system CA store'}: "
                    f"{getattr(exc, 'strerror', None) or exc}",
                    "check that the CA, certificate and key files exist and are PEM",
                    code="config.invalid",
                ) from None
            client.tls_insecure_set(s.tls.insecure)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_unsubscribe = self._on_unsubscribe
        # Only the network thread writes to the socket. Without an "external loop" callback,
        # paho's publish() writes from the caller's thread too, and its write path takes no
        # lock: with the network thread writing at the same moment (acknowledgements,
        # queued messages) two packets went out in swapped order, 1 to 7 times in 20,000
        # QoS 1 messages (tests/integration/test_session_order.py). With the
        # callback set, publish() only queues the packet and wakes the network thread.
        client.on_socket_register_write = _network_thread_writes
        return client

    def start(self) -> MqttSession:
        self._beats = dict.fromkeys(self._beats, time.monotonic())
        self._dispatch.start()
        self._net.start()
        return self

    def wait_connected(self, timeout: float) -> bool:
        return self.connected.wait(timeout)

    # --- Communicator ----------------------------------------------------------------------
    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 1,
        retain: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        expiry_s: int | None = None,
    ) -> None:
        props: Properties | None = None
        if self.mqtt_version == "5" and (
            response_topic or correlation_data is not None or expiry_s is not None
        ):
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation_data is not None:
                props.CorrelationData = correlation_data
            if expiry_s is not None:
                props.MessageExpiryInterval = max(1, expiry_s)
        if self._stopping.is_set():
            return  # after stop(), as documented: nothing more goes out
        try:
            info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        except OSError:
            return  # raced stop() closing paho's wake-up socket: dropped, as after stop()
        if qos > 0 and info.rc != MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            with self._acked:
                # Only a fresh entry is this publish's ack, come before the lock: an old one
                # is a QoS 0 write (or a late ack) of the id paho numbered this one with once
                # its ids wrapped, and taken for acked, its outbox row was deleted unsent.
                at = self._early.pop(info.mid, None)
                if at is None or time.monotonic() - at >= _EARLY_S:
                    self._pending.add(info.mid)
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            log_event(log, logging.WARNING, "mqtt.queue_full", topic=topic)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Unsubscribe:
        with self._send_lock:
            with self._lock:
                known = topic_filter in self._subs
                handlers = self._subs.setdefault(topic_filter, (qos, []))[1]
                handlers.append(handler)
                self._dropped.pop(topic_filter, None)
                # Decided under the lock _on_connect snapshots under: either that snapshot
                # has this filter, or this call sends it.
                send = not known and self._online
            if not known:
                # On disk before the broker hears of it: a process killed in between must
                # not leave a filter its successor does not know.
                self._save_held()
            if send:
                self._client.subscribe(topic_filter, qos)

        def unsubscribe() -> None:
            with self._send_lock:
                with self._lock:
                    entry = self._subs.get(topic_filter)
                    if entry is None or handler not in entry[1]:
                        return
                    entry[1].remove(handler)
                    last = not entry[1]
                    if last:
                        del self._subs[topic_filter]
                        # Sent now if connected, and again on every connect until subscribed
                        # anew: a persistent session keeps a filter the broker never heard
                        # dropped (during an outage, or an UNSUBSCRIBE lost with the link),
                        # and the broker goes on sending it.
                        self._dropped[topic_filter] = None
                        while len(self._dropped) > _DROPPED_KEPT:
                            del self._dropped[next(iter(self._dropped))]
                    send = last and self._online
                if send:
                    self._unsubscribe(topic_filter)
            if last:
                self._save_held()

        return unsubscribe

    def stale(self, limit_s: float) -> list[str]:
        """The session's threads that have shown no sign of life for `limit_s`: one stuck in
        a handler (a command blocked on a hung disk) or in the network, though alive."""
        now = time.monotonic()
        return [name for name, beat in self._beats.items() if now - beat > limit_s]

    def flush(self, timeout: float) -> bool:
        """Wait until every QoS>0 message published so far is acknowledged by the broker."""
        deadline = time.monotonic() + timeout
        with self._acked:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._acked.wait(left)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()  # the network thread sends DISCONNECT: paho is not ours to race
        self._wake_network()
        if self._net.is_alive():
            self._net.join(timeout)
        self._queue.put(_STOP)
        if self._dispatch.is_alive() and threading.current_thread() is not self._dispatch:
            self._dispatch.join(timeout)

    # --- network thread ------------------------------------------------------------------
    def _network(self) -> None:
        s = self.settings
        attempt = 0
        while not self._stopping.is_set():
            if self._will is not None:
                will = self._will()
                self._client.will_set(will.topic, will.payload, will.qos, will.retain)
            up_at = self._up_at
            try:
                if s.version == "5":
                    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                    props.SessionExpiryInterval = s.session_expiry_s if s.persistent else 0
                    if s.max_packet_bytes is not None:
                        props.MaximumPacketSize = s.max_packet_bytes
                    self._client.connect(
                        s.host, s.port, s.keepalive, clean_start=not s.persistent, properties=props
                    )
                else:
                    self._client.connect(s.host, s.port, s.keepalive)
            except (OSError, ssl.SSLError) as exc:
                delay = backoff_delay(attempt, s.reconnect_min_s, s.reconnect_max_s, self._rng)
                attempt += 1
                self.last_error = _connect_error(exc)
                self.refused = _is_refusal(exc)
                # Seen at the default log level once the failures have lasted a while, then
                # once a minute: a box that cannot reach its broker must say so without -v,
                # and without a line every retry (a command line's connect() says it itself).
                now = time.monotonic()
                if self._failing_since is None:
                    self._failing_since = now
                loud = now - self._failing_since >= _WARN_AFTER_S and self._connect_warned.ready()
                log_event(
                    log,
                    logging.WARNING if loud else logging.INFO,
                    "mqtt.connect_failed",
                    host=s.host,
                    port=s.port,
                    error=self.last_error,
                    retry_s=round(delay, 2),
                )
                self._beats["mqtt-net"] = time.monotonic() + delay  # asleep on purpose
                self._stopping.wait(delay)
                continue
            self._no_delay()
            disconnecting = False
            try:
                while self._client.loop(timeout=_LOOP_S) == MQTTErrorCode.MQTT_ERR_SUCCESS:
                    self._beats["mqtt-net"] = time.monotonic()
                    if self._stopping.is_set():
                        if not self.connected.is_set():
                            break
                        if not disconnecting:  # paho closes the socket once DISCONNECT is out
                            disconnecting = True
                            self._client.disconnect()
            except Exception:
                # Our callbacks run inside loop(): a bug in one must not end this thread, or
                # the session stays offline for good. Drop the link and connect again.
                log_crash(log, "mqtt.network_failed")
                self._client._reset_sockets()
                self._mark_offline()
            self.connected.clear()
            if self._stopping.is_set():
                break
            # Whether this connection was ever up (a CONNACK came and set `_up_at`), not
            # `connected`, which `_on_disconnect` has already cleared by now: read from it,
            # the backoff never started again after a lost link, so a box's every outage
            # after its first few waited up to reconnect_max_s to come back
            # (tools/soak_agent.py).
            if self._up_at != up_at:
                # Only a link that was up is lost. A connect a dead link swallowed (the TCP
                # handshake done, no CONNACK before the keepalive ran out) is a failed
                # attempt: counted, a frozen broker read as 11 reconnects for two outages.
                self.reconnects += 1
                self._lost_at = time.monotonic()
                # A link lost right after it came up does not start the backoff again: two
                # boxes cloned with one client id take the session from each other on every
                # connect, and would otherwise do so as fast as reconnect_min_s allows.
                up_s = time.monotonic() - self._up_at
                if up_s >= s.stable_after_s:
                    attempt = self._short_links = 0
                else:
                    self._short_links += 1
                    self._say_unstable(up_s)
            delay = backoff_delay(attempt, s.reconnect_min_s, s.reconnect_max_s, self._rng)
            attempt += 1
            log_event(log, logging.INFO, "mqtt.disconnected", host=s.host, retry_s=round(delay, 2))
            self._stopping.wait(delay)
        self._close_socket()

    def _say_unstable(self, up_s: float) -> None:
        # mosquitto closes a taken-over connection without MQTT 5's "session taken over"
        # reason, so the pattern is what tells: accepted, then dropped at once, again.
        if self._short_links >= _SHORT_LINKS_WARN and self._short_warned.ready():
            log_event(
                log,
                logging.WARNING,
                "mqtt.unstable_link",
                client_id=self.settings.client_id,
                links=self._short_links,
                up_s=round(up_s, 2),
                hint="the broker accepts this client and drops it at once, again and again: "
                "another client with the same client id (two boxes with one device_id?), a "
                "broker limit, or a link that keeps failing",
            )

    def _say_back(self, down_s: float) -> None:
        # WARNING, as the outage's connect failures were: the service's journal hides INFO,
        # and showed when an outage began but never when it ended. Once a minute at most:
        # a link dropped again and again (mqtt.unstable_link) would fill the journal.
        log_event(
            log,
            logging.WARNING if self._back_warned.ready() else logging.INFO,
            "mqtt.reconnected",
            host=self.settings.host,
            down_s=round(down_s, 1),
            reconnects=self.reconnects,
        )

    def _wake_network(self) -> None:
        # paho's own way out of loop()'s select, the one its publish() takes: a byte on its
        # wake-up socket pair. Private (absent before the first loop): were a paho release
        # to drop it, a stop would only wait out one _LOOP_S.
        wake = getattr(self._client, "_sockpairW", None)
        if isinstance(wake, socket.socket):
            with contextlib.suppress(OSError):
                wake.send(b"0")

    def _no_delay(self) -> None:
        # paho leaves Nagle's algorithm on: a small PUBLISH then waits for the peer's delayed
        # ACK, ~40 ms each way on Linux (a command round trip took 88 ms instead of 0.5 ms).
        sock = self._client.socket()
        if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _close_socket(self) -> None:
        # stop() queued a DISCONNECT: let paho write it (it closes the socket after), and
        # close the socket ourselves if that does not happen in time (or stop() came
        # during a connect attempt).
        deadline = time.monotonic() + 1.0
        while self._client.socket() is not None and time.monotonic() < deadline:
            if self._client.loop(timeout=0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                break
        # loop() made a wake-up socket pair that paho closes only in __del__, which a
        # reference cycle (its callbacks are our methods) delays to some later GC:
        # close it, and a socket the broker never closed, now.
        self._client._reset_sockets()

    # --- paho callbacks: copy and hand over, nothing else ---------------------------------
    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            log_event(log, logging.WARNING, "mqtt.refused", reason=str(reason))
            self.last_error = f"the broker refused the connection: {reason}"
            # Busy or unavailable is a broker still starting or shedding load: worth waiting for.
            self.refused = reason.value not in _CONNACK_TRANSIENT
            return
        with self._send_lock:
            with self._lock:
                if not flags.session_present:
                    self._dropped.clear()  # a new session holds no old filters
                filters = [(f, q) for f, (q, _) in self._subs.items()]
                dropped = list(self._dropped)
                self._online = True
                self._link += 1
            for topic_filter, qos in filters:
                client.subscribe(topic_filter, qos)
            for topic_filter in dropped:
                self._unsubscribe(topic_filter)
        if not flags.session_present:
            self._save_held()
        self.last_error, self.refused = None, False
        self._failing_since = None
        self._up_at = time.monotonic()
        if self._lost_at is not None:
            self._say_back(self._up_at - self._lost_at)
            self._lost_at = None
        self.connected.set()
        self._queue.put(_CONNECTED)

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._mark_offline()

    def _mark_offline(self) -> None:
        with self._lock:
            self._online = False
            self._unsub_mids.clear()  # unacknowledged: sent again on the next connect
            self._unsub_early.clear()
        self.connected.clear()

    def _unsubscribe(self, topic_filter: str) -> None:
        _, mid = self._client.unsubscribe(topic_filter)
        if mid is None:
            return
        with self._lock:
            # On loopback the network thread can read the UNSUBACK before this thread gets
            # the lock: then the filter was let go of already (it stayed on the resend list
            # for good once, and in the held-filters record).
            acked = mid in self._unsub_early
            if acked:
                self._unsub_early.discard(mid)
                self._let_go(topic_filter)
            else:
                self._unsub_mids[mid] = topic_filter
        if acked:
            self._save_held()

    def _let_go(self, topic_filter: str) -> None:
        # Under _lock. The broker has it: the filter need not be sent again on later connects.
        if topic_filter not in self._subs:
            self._dropped.pop(topic_filter, None)

    def _on_unsubscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        with self._lock:
            topic_filter = self._unsub_mids.pop(mid, None)
            if topic_filter is not None:
                self._let_go(topic_filter)
            elif len(self._unsub_early) < _DROPPED_KEPT:
                self._unsub_early.add(mid)
        if topic_filter is not None:
            self._save_held()

    def _save_held(self) -> None:
        """Record the filters the broker may hold for this session, when they changed."""
        if self._held is None:
            return
        with self._held_lock:
            with self._lock:
                now = sorted(set(self._subs) | set(self._dropped))
            if now != self._held_saved:
                self._held.save(now)
                self._held_saved = now

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason.is_failure:
            # MQTT 5: the broker took the message and refused it (not authorised, over a
            # quota, a bad topic). Sending it again gets the same answer, so it counts as
            # acknowledged, but never in silence.
            self.rejected += 1
            self.last_refusal = reason
            # Once a minute per reason, with the running count: a broker that refuses every
            # result (an ACL changed, a quota hit) would otherwise log a line per message,
            # 30 a second, and rotate every useful line out of the journal within days.
            if self._refused_warned.ready(str(reason)):
                log_event(
                    log,
                    logging.WARNING,
                    "mqtt.publish_refused",
                    mid=mid,
                    reason=str(reason),
                    refused_total=self.rejected,
                )
        with self._acked:
            if mid in self._pending:
                self._pending.discard(mid)
                if not self._pending:
                    self._acked.notify_all()
                return
            # Acked before publish() got the lock back (or a QoS 0 write): keep it briefly.
            # Every old entry goes, oldest first: the last writes of a burst were kept for
            # good when only the next callbacks swept them.
            now = time.monotonic()
            self._early.pop(mid, None)
            self._early[mid] = now
            while self._early:
                old, at = next(iter(self._early.items()))  # oldest first
                if now - at < _EARLY_S:
                    break
                del self._early[old]

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        size = len(msg.payload)
        with self._count_lock:
            if msg.qos == 0 and self._queued_bytes + size > self.settings.dispatch_limit_bytes:
                self.dropped += 1
                return
            self._queued_bytes += size
        props = msg.properties
        response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        expiry = getattr(props, "MessageExpiryInterval", None) if props is not None else None
        message = Message(
            msg.topic, bytes(msg.payload), msg.qos, msg.retain, response_topic, correlation, expiry
        )
        # No lock: `_on_connect`, the one writer of `_link`, runs on this thread too.
        self._queue.put(_Received(message, msg.mid, self._link))

    # --- dispatch thread -----------------------------------------------------------------
    def _dispatcher(self) -> None:
        while True:
            self._beats["mqtt-rx"] = time.monotonic()
            try:
                # Not for ever: an idle thread must still show it is not stuck.
                item = self._queue.get(timeout=_LOOP_S)
            except queue.Empty:
                continue
            if item is _STOP:
                return
            if item is _CONNECTED:
                if self._on_connected is not None:
                    self._guard(self._on_connected, self)
                continue
            assert isinstance(item, _Received)
            message = item.message
            with self._count_lock:
                self._queued_bytes -= len(message.payload)
            with self._lock:
                subs = list(self._subs.items())
            matched = [h for f, (_, hs) in subs if topic_matches(f, message.topic) for h in hs]
            for handler in matched:
                self._guard(handler, message)
            self._ack(item)

    def _ack(self, item: _Received) -> None:
        if item.message.qos == 0 or self._stopping.is_set():
            return  # after stop() nothing goes out: the broker sends it again next time
        with self._lock:
            # On a later connection the broker sends the message again (persistent) or has
            # let it go (clean): either way this packet id is not ours to acknowledge there.
            current = self._online and item.link == self._link
        if not current:
            return
        try:
            self._client.ack(item.mid, item.message.qos)
        except OSError:
            # The session stopping (paho closed its wake-up socket) or the link going: the
            # broker sends the message again, to a persistent session, on the next link.
            pass
        except Exception:
            log_crash(log, "mqtt.ack_failed")  # never the dispatch thread's end

    @staticmethod
    def _guard(fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception:
            # A handler bug must not kill the session: log it with its traceback and go on.
            log_crash(log, "mqtt.handler_failed")


def connect(
    settings: BrokerSettings, timeout: float = 10.0, fail_fast: bool = True, **kwargs: Any
) -> MqttSession:
    """Start a session and wait for its first CONNACK.

    Args:
        fail_fast: give up at the first refusal (nothing listens on the port, the name does
            not resolve, the broker says no), with its cause, as mosquitto_pub does; a
            command line wants that answer now. A server that may start before its broker
            (`edge-fleet serve`) passes False and waits out `timeout`.

    Raises:
        EdgeAgentError: broker.unreachable.
    """
    session = MqttSession(settings, **kwargs).start()
    deadline = time.monotonic() + timeout
    while not session.wait_connected(min(0.05, max(0.0, deadline - time.monotonic()))):
        if (fail_fast and session.refused) or time.monotonic() >= deadline:
            session.stop(1.0)
            why = f": {session.last_error}" if session.last_error else f" within {timeout:g} s"
            raise EdgeAgentError(
                f"cannot reach the MQTT broker at {settings.host}:{settings.port}{why}",
                "check the broker address, port, credentials and TLS settings",
                code="broker.unreachable",
            )
    return session


# CONNACK reasons that say "not now" rather than "no": server unavailable, server busy,
# quota exceeded, connection rate exceeded (paho maps 3.1.1's codes onto these).
_CONNACK_TRANSIENT = frozenset({0x88, 0x89, 0x97, 0x9F})
# getaddrinfo's "no such name" answers; EAI_AGAIN (a resolver not answering) is not one.
_NO_SUCH_HOST = frozenset(
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name)
)


def _is_refusal(exc: BaseException) -> bool:
    if isinstance(exc, socket.gaierror):
        return exc.errno in _NO_SUCH_HOST
    return isinstance(exc, ConnectionRefusedError)


def _connect_error(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror or exc})"
    return str(getattr(exc, "strerror", None) or exc)
