"""`edge-agent run`: the agent as a long-running service.

Wires the parts together and runs the loop that keeps them honest:
- the MQTT session (comms) with a will and a birth message carrying a
  connection sequence number (`state`, retained);
- commands from `<prefix>/<device>/cmd` and `<prefix>/group/<group>/cmd` into
  the dispatcher;
- everything published goes through the outbox, and one pump thread (pump.py)
  moves it to the broker in order, deleting a message only once the broker has
  it, answers and the newest telemetry ahead of a backlog;
- telemetry every interval; the watchdog pinged only while the MQTT loop and
  every pipeline are healthy; `STATUS=` with the FPS;
- a clean stop: STOPPING=1, pipelines stopped (and remembered), the outbox
  flushed as far as the broker allows, `{online: false}` published, then the
  disconnect.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from edge_agent import __version__
from edge_agent.agent.dispatch import Dispatcher
from edge_agent.agent.instance import hold_state
from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.models import ModelOps
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.pump import OutboxPump
from edge_agent.agent.records import AgentRecords, CommandLog
from edge_agent.agent.sink import event_priority
from edge_agent.agent.supervisor import AgentSupervisor
from edge_agent.agent.telemetry import model_telemetry, pipeline_telemetry
from edge_agent.build_id import build_id
from edge_agent.catalog.catalog import Catalog
from edge_agent.comms.base import Message
from edge_agent.comms.held_filters import HeldFilters
from edge_agent.comms.session import MqttSession, Will
from edge_agent.comms.settings import BrokerSettings, TlsSettings
from edge_agent.config.agent import AgentConfig
from edge_agent.delivery.partial import sweep
from edge_agent.integrations.hub import Integrations
from edge_agent.logs import Throttle, log_crash, log_event
from edge_agent.outbox import Outbox, Priority
from edge_agent.procstats import CpuMeter, hottest_celsius, rss_bytes, usable_cpus
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics
from edge_agent.reference import reference_dir
from edge_agent.service.sdnotify import Notifier
from edge_agent.store.release import load_public_key
from edge_agent.store.store import ModelStore

log = logging.getLogger(__name__)

_IDLE_S = 1.0
"""The longest the main loop sleeps when nothing is due. What it serves has a deadline (the
telemetry interval, the watchdog) or wakes it (`wake`, a state change, a new interval), so
this only bounds how late it sees a `stop` set without `wake()`. Polling at 4 Hz instead
kept an idle box's CPU out of its deep sleep states for nothing."""
_TICK_S = 0.25
"""The main loop's period while an integration asks for ticks (occupancy hold times)."""
_SWEEP_EVERY_S = 24 * 3600.0
"""Partial transfers idle for `delivery.partial.ABANDONED_S` go at this period too."""
THREAD_STALE_S = 60.0
"""A service thread (MQTT network or receive, outbox pump) that showed no sign of life for
this long is stuck, and the watchdog ping is withheld: each passes its loop every few
seconds, and a command handler on the receive thread takes a few at most."""


def broker_settings(config: AgentConfig) -> BrokerSettings:
    """The session settings the agent's config asks for: a fixed id, a persistent session."""
    mqtt = config.mqtt
    tls = None
    if mqtt.tls is not None:
        tls = TlsSettings(
            ca_file=mqtt.tls.ca_file,
            cert_file=mqtt.tls.cert_file,
            key_file=mqtt.tls.key_file,
            insecure=mqtt.tls.insecure,
        )
    return BrokerSettings(
        host=mqtt.host,
        port=mqtt.port,
        version=mqtt.version,
        keepalive=mqtt.keepalive,
        client_id=mqtt.client_id or f"edge-agent-{config.device_id}",
        # Commands sent while the box was away wait in the broker for it.
        persistent=True,
        session_expiry_s=mqtt.session_expiry_s,
        username=mqtt.username,
        password=mqtt.password,
        tls=tls,
        reconnect_min_s=mqtt.reconnect_min_s,
        reconnect_max_s=mqtt.reconnect_max_s,
        max_packet_bytes=AGENT_MAX_PACKET_BYTES,
    )


AGENT_MAX_PACKET_BYTES = 16 * 1024 * 1024
"""What the agent takes from the broker on MQTT 5 (3.1.1 has no such limit: the broker's
`message_size_limit` is the only one there). Its largest honest message is a release's
manifest, 4.4 MB for a 4 GB model at 64 KiB chunks; commands are answered too large past
`max_command_bytes` (at most 8 MiB) and chunks stop at 128 KiB. Without it a 100 MB
message on a topic the agent follows (the broker's own default limit is 256 MB) was
copied whole into its memory, 290 MB at the peak, before any check could refuse it."""


class AgentService:
    """The whole agent. `run(stop)` blocks until `stop` is set, then shuts down cleanly."""

    def __init__(self, config: AgentConfig, env: Mapping[str, str]) -> None:
        self.config = config
        # Read now, before a package replaced under the running agent could be read instead.
        self.build = build_id()
        self.layout = config.layout(env)
        # First: nothing of the state folder is read or written while another agent serves it.
        self._state_lock = hold_state(self.layout)
        try:
            self._open(config, env)
        except BaseException:
            self._state_lock.release()
            raise

    def _open(self, config: AgentConfig, env: Mapping[str, str]) -> None:
        self.topics = Topics(config.topic_prefix)
        self.device = config.device_id
        self.records = AgentRecords(self.layout.agent)
        self.outbox = Outbox(self.layout.outbox, int(config.outbox_quota_mb * 1024 * 1024))
        self.commands = CommandLog(self.layout.agent / "commands.sqlite")
        keys = [load_public_key(path) for path in config.trusted_keys]
        if not keys:
            log_event(
                log,
                logging.WARNING,
                "release_unverified",
                device=self.device,
                detail="no trusted_keys configured: model releases are not verified",
            )
        self.store = ModelStore(self.layout)
        # Names only: a command naming a file on disk would load bytes nothing verified.
        self.catalog = Catalog(
            reference_dir("models"), self.layout.cache, self.store, allow_paths=False
        )
        self.pool = TrackedPool(self.catalog)
        self.interval_s = self.records.record.telemetry_interval_s or config.telemetry_interval_s
        self.pipelines = Pipelines(
            self.pool,
            self.layout,
            self.records,
            config.results,
            self._emit_result,
            self._emit_event,
            max_running=config.max_pipelines,
            protected=[*config.named_files(), self.catalog.models_dir],
        )
        self.models = ModelOps(
            self.store,
            self.catalog,
            self.layout,
            self.pipelines,
            self._emit_event,
            keys,
            self.device,
        )
        self.models.topics = self.topics
        self.models.sweep_scratch()  # before the dispatcher exists: no calibration runs yet
        self.supervisor = AgentSupervisor(
            self.pipelines, self.models, self.records, self._set_interval, self._status_extra
        )
        self.dispatcher = Dispatcher(
            self.device, self.supervisor, self._answer, self.commands, config.max_command_bytes
        )
        self.notifier = Notifier(env)
        self._seq = self.records.record.seq
        self._contested = Throttle(_CONTESTED_S)
        self._cpu = CpuMeter()
        # Monotonic: uptime is a duration, and a box's clock steps (NTP after a boot in
        # 1970, backwards too). Stepped back past the uptime, time.time() made it negative,
        # which the telemetry model refuses: every telemetry message failed from then on.
        self._started = time.monotonic()
        self._wake = threading.Event()
        self._urgent = threading.Event()  # an answer or event is waiting: send now
        self._stop = threading.Event()
        self._reschedule = threading.Event()
        self._state_dirty = threading.Event()
        self._kick = threading.Event()  # the main loop has something to do now
        self._device_names: list[str] | None = None
        self._will_payload = b""
        """The will of the current connection (set before each connect): said again, to
        the byte, at a clean stop."""
        self._pump_thread: threading.Thread | None = None
        self._outbox_pump: OutboxPump | None = None
        self.session = MqttSession(
            broker_settings(config),
            will=self._will,
            on_connected=self._on_connected,
            held=HeldFilters(self.layout.agent / "mqtt-filters.json"),
        )
        self.models.comm = self.session
        self.integrations = Integrations(
            config.integrations,
            self.device,
            self.topics,
            lambda topic, payload: self._queue(topic, payload, Priority.CRITICAL, retain=True),
            self.pipelines.handles,
            env,
            state=self._birth,
            wanted=self._recorded_labels,
            subscribe=lambda topic_filter, handler: self.session.subscribe(
                topic_filter, handler, qos=1
            ),
        )

    def _recorded_labels(self) -> dict[str, list[str]]:
        """The pipelines this agent is to run, and the labels of their event rules, as its
        record holds them (read raw: it was checked when it was written)."""
        wanted: dict[str, list[str]] = {}
        for pipeline, spec in self.records.record.pipelines.items():
            rules = spec.get("events")
            wanted[pipeline] = [
                rule["label"]
                for rule in (rules if isinstance(rules, list) else [])
                if isinstance(rule, dict) and isinstance(rule.get("label"), str)
            ]
        return wanted

    # --- publishing: everything through the outbox ---------------------------------------------
    def _queue(self, topic: str, payload: bytes, priority: Priority, retain: bool = False) -> None:
        queued = self.outbox.put(topic, payload, priority, qos=1, retain=retain)
        if queued is None and self.outbox.refusing:
            # The state disk refuses the outbox (full, read-only): the message goes straight
            # to the broker rather than nowhere, if the link is up. It may overtake messages
            # still on disk, and the outbox counts it as refused (not kept to resend): those
            # counts in telemetry are the operator's signal. Results and telemetry go at QoS
            # 0, held nowhere, as nothing would send them again anyway; dropping them too
            # left a box with a full disk dark to its console while its link was up.
            if self.session.connected.is_set():
                qos = 1 if priority == Priority.CRITICAL else 0
                self.session.publish(topic, payload, qos=qos, retain=retain)
            return
        if priority == Priority.CRITICAL:
            self._urgent.set()
        self._wake.set()

    def _answer(self, response: msg.Response) -> None:
        self._queue(
            self.topics.device(self.device, "resp"),
            response.model_dump_json(exclude_none=True).encode(),
            Priority.CRITICAL,
        )

    def _emit_event(self, event: msg.AgentEvent | msg.DetectionEvent) -> None:
        self.integrations.on_event(event)
        message = msg.EventMessage(device_id=self.device, event=event)
        if isinstance(event, msg.AgentEvent):
            # Every change to what `state` lists (a model activated or rolled back, a
            # pipeline started, swapped, stopped or failed) comes with an event.
            self._state_changed()
        self._queue(
            self.topics.device(self.device, "events"),
            message.model_dump_json(exclude_none=True).encode(),
            event_priority(event),
        )

    def _emit_result(self, pipeline: str, result: msg.ResultMessage) -> None:
        self.integrations.on_result(pipeline, result)
        self._queue(
            self.topics.device(self.device, f"results/{pipeline}"),
            # Without None: a result of a pipeline without zones says nothing of them.
            result.model_dump_json(exclude_none=True).encode(),
            Priority.RESULT,
        )

    # --- state: birth and will --------------------------------------------------------------
    def _will(self) -> Will:
        # Asked before every connect: this connection's seq, persisted before use.
        try:
            self._seq = self.records.next_seq()
        except OSError as exc:
            # A full or read-only state disk must not kill the network thread: the seq
            # still goes up in memory (and with the clock), it just is not remembered.
            self._seq = max(self._seq + 1, int(time.time()))
            log_event(log, logging.ERROR, "seq_not_saved", seq=self._seq, error=str(exc))
        self._will_payload = self._offline()
        return Will(self._state_topic, self._will_payload)

    def _offline(self) -> bytes:
        # The will and the clean-stop message: {online: false, seq, ts}, and what a console
        # needs to ask about a dark box when it matters most (after an upgrade: are the dark
        # ones the upgraded ones? which site?). Only those: the will is held by the broker
        # for every connection, and models and pipelines are stale once the box is gone.
        offline = msg.State(
            online=False,
            seq=self._seq,
            ts=time.time(),
            agent_version=__version__,
            agent_build=self.build,
            group=self.config.group,
            config_hash=self.config.config_hash(),
        )
        return offline.model_dump_json(
            include={"online", "seq", "ts", "agent_version", "agent_build", "group", "config_hash"},
            exclude_none=True,
        ).encode()

    @property
    def _state_topic(self) -> str:
        return self.topics.device(self.device, "state")

    def _birth(self) -> msg.State:
        return msg.State(
            online=True,
            seq=self._seq,
            ts=time.time(),
            agent_version=__version__,
            agent_build=self.build,
            mqtt_version=self.session.mqtt_version,
            group=self.config.group,
            devices=self._devices(),
            models=self.models.states(),
            pipelines=self.pipelines.states(),
            config_hash=self.config.config_hash(),
            unverified=not self.models.trusted_keys,
        )

    def _devices(self) -> list[str]:
        # Asked once: enumerating devices loads every plugin, too slow for each reconnect.
        if self._device_names is None:
            try:
                import openvino as ov

                self._device_names = list(ov.Core().available_devices)
            except Exception as exc:  # a broken driver must not stop the birth message
                log_event(log, logging.WARNING, "devices_unavailable", error=str(exc))
                self._device_names = []
        return self._device_names

    def _on_connected(self, session: MqttSession) -> None:
        self._publish_state()
        log_event(log, logging.INFO, "mqtt_connected", device=self.device, seq=self._seq)
        self.integrations.on_connected()
        self._wake.set()

    def _publish_state(self) -> None:
        # Directly, not through the outbox: the birth is about this connection, and an
        # old state is worth nothing once a newer one exists.
        self._state_dirty.clear()
        try:
            birth = self._birth().model_dump_json(exclude_none=True).encode()
            self.session.publish(self._state_topic, birth, qos=1, retain=True)
        except BaseException:
            self._state_dirty.set()  # tried again on the main loop's next turn (a tick)
            raise

    def _state_changed(self) -> None:
        # The main loop publishes it: a burst of changes (a deploy's activation and swap)
        # goes out as one state, and a failed publish is retried there.
        self._state_dirty.set()
        self._kick.set()

    def _on_state(self, message: Message) -> None:
        # Ours are {online: true} at this connection's seq or an older one, and {online:
        # false} at this seq. A stale will (an older connection's, published by the broker
        # after our birth) must not leave the box marked offline: answer it with a birth.
        try:
            data = json.loads(message.payload)
        except (ValueError, RecursionError):  # RecursionError: 200,000 nested brackets
            data = None
        seq = data.get("seq") if isinstance(data, dict) else None
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
        online = data.get("online") if isinstance(data, dict) else None
        if seq is not None and online is True and seq <= self._seq:
            return  # a birth of this connection or an older one
        if seq is not None and online is False and seq == self._seq:
            return  # this connection's own clean-stop message (or its will)
        if online is False and seq is not None and seq < self._seq:
            log_event(log, logging.INFO, "stale_will_answered", stale_seq=seq, seq=self._seq)
            self._state_changed()
            return
        # Anything else was not written by this agent: offline past the seq it reached,
        # a seq that is not a number, not JSON. A client with write access to the topic,
        # or a second box given this device id. The retained state must say what this box
        # is, so it is answered every time. That cannot ping-pong: an agent never answers
        # {online: true} at or below its own seq, so of two boxes on one id the one with
        # the lower seq answers each of the other's states once. The warning is throttled.
        if self._contested.ready():
            log_event(
                log,
                logging.WARNING,
                "state_contested",
                topic=self._state_topic,
                seq=self._seq,
                fix="check that no other box uses this device id, and that only the agent "
                "may publish on its state topic (broker ACL)",
            )
        # Through the main loop, as every state change: a burst of foreign states is
        # answered with one birth, not a birth each (a store scan and a retained publish)
        # on the thread every command waits behind.
        self._state_changed()

    # --- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        """Serve until `stop` is set; returns the process exit code.

        Call `wake()` after setting `stop` to have the loop see it at once; otherwise it
        does within `_IDLE_S`.
        """
        self._stop = stop
        try:
            self.dispatcher.end_interrupted()  # before any command can come in
        except Exception:  # the command log unreadable: its old ids stay as they were
            log_crash(log, "interrupted_commands_failed")
        self.session.subscribe(self.topics.device(self.device, "cmd"), self._on_command)
        if self.config.group:
            self.session.subscribe(
                f"{self.topics.prefix}/group/{self.config.group}/cmd", self._on_command
            )
        self.session.subscribe(self._state_topic, self._on_state)
        self._devices()
        self.session.start()
        # The pump before the restore: the birth says online as soon as the session is up,
        # and commands run at once; with the pump started after it, their answers waited
        # for every recorded pipeline to compile and start (15.8 s for 20 cameras).
        pump = threading.Thread(target=self._pump, name="outbox-pump", daemon=True)
        self._pump_thread = pump
        pump.start()
        try:
            restored = self.pipelines.restore()
        except Exception:
            # A bug there (OpenVINO's own error on a full cache disk was one) ended the
            # agent before it came online, and every restart met the same record until
            # systemd gave up: a box that runs no pipeline still takes commands to mend it.
            log_crash(log, "pipelines_restore_failed")
            restored = []
        log_event(log, logging.INFO, "agent_started", device=self.device, restored=len(restored))
        self._state_changed()  # the birth may have gone out before the pipelines were back
        self.notifier.ready(self._status_line())
        next_telemetry = time.monotonic() + self.interval_s
        next_sweep = time.monotonic()  # abandoned partial transfers: at start, then daily
        # A third of WatchdogSec, not half: a ping comes a little late on a busy box, and
        # one withheld at half left a gap of just over WatchdogSec, which systemd kills.
        watchdog_every = (self.notifier.watchdog_s or 0) / 3
        next_watchdog = time.monotonic()
        # Each step on its own: one that fails (a full disk, a damaged file) is logged and
        # tried again on its next turn, and never stops the others, the watchdog least of all:
        # a restart would meet the same disk, and systemd gives up after a few.
        failed = _Failures("agent_loop_failed")
        try:
            while not stop.is_set():
                now = time.monotonic()
                due = min(next_telemetry, next_watchdog if watchdog_every else next_telemetry)
                # Ticks, and a state publish that failed, go on a short period. (Offline,
                # the connect publishes the state itself.)
                pending = self._state_dirty.is_set() and self.session.connected.is_set()
                short = self.integrations.ticking or pending
                self._kick.wait(max(0.0, min(due - now, _TICK_S if short else _IDLE_S)))
                self._kick.clear()
                if stop.is_set():
                    break
                now = time.monotonic()
                if self._reschedule.is_set():  # set_telemetry: the new interval from now
                    self._reschedule.clear()
                    next_telemetry = min(next_telemetry, now + self.interval_s)
                if self._state_dirty.is_set() and self.session.connected.is_set():
                    failed.guard("state", self._publish_state)
                failed.guard("integrations", self.integrations.tick)
                if now >= next_sweep:
                    next_sweep = now + _SWEEP_EVERY_S
                    failed.guard("transfers", self._sweep_transfers)
                if now >= next_telemetry:
                    next_telemetry = now + self.interval_s
                    failed.guard("telemetry", self._publish_telemetry)
                    failed.guard("status", lambda: self.notifier.status(self._status_line()))
                if watchdog_every and now >= next_watchdog:
                    next_watchdog = now + watchdog_every
                    failed.guard("watchdog", self._feed_watchdog)
        finally:
            try:
                self._shutdown(pump)
            finally:
                self._state_lock.release()  # last: the next agent may start now
        return 0

    def _sweep_transfers(self) -> None:
        # A partial is swept when a pull of its name starts, or after 14 days idle; a
        # cancelled deploy of a model never deployed again left up to a whole model on the
        # state disk, counted against no quota, for as long as the agent ran.
        sweep(self.layout.transfers, keep=self.layout.transfers)

    def wake(self) -> None:
        """Have the main loop look at its `stop` (and everything else) now; thread-safe."""
        self._kick.set()

    def _on_command(self, message: Message) -> None:
        self.dispatcher.handle(message.payload, message.expiry_s, message.retain)

    def _pump(self) -> None:
        """The outbox pump thread's body (pump.py)."""
        self._outbox_pump = OutboxPump(
            self.outbox,
            self.session,
            wake=self._wake,
            urgent=self._urgent,
            stop=self._stop,
            failed=_Failures("outbox_pump_failed").record,
        )
        self._outbox_pump.run()

    def _feed_watchdog(self) -> None:
        if self._healthy():
            self.notifier.watchdog()

    def _healthy(self) -> bool:
        if self._stop.is_set():
            # Stopping: the pump ends on its own as soon as it sees it, and the loop may
            # check once more before it does (an ERROR line on every clean stop).
            return True
        threads = [self.session._net, self.session._dispatch]
        if not all(t.is_alive() for t in threads):
            log_event(log, logging.ERROR, "watchdog_withheld", reason="mqtt loop stopped")
            return False
        if self._pump_thread is not None and not self._pump_thread.is_alive():
            log_event(log, logging.ERROR, "watchdog_withheld", reason="outbox pump stopped")
            return False
        # Alive is not well: a receive thread blocked in a handler (on a hung state disk)
        # kept every ping going, and systemd never restarted an agent that answered nothing.
        stuck = self.session.stale(THREAD_STALE_S)
        pump = self._outbox_pump
        if pump is not None and time.monotonic() - pump.beat > THREAD_STALE_S:
            stuck.append("outbox-pump")
        if stuck:
            log_event(
                log,
                logging.ERROR,
                "watchdog_withheld",
                reason="stuck threads",
                threads=",".join(stuck),
            )
            return False
        stale = self.pipelines.stale(max(60.0, 3 * self.interval_s))
        if stale:
            log_event(
                log,
                logging.ERROR,
                "watchdog_withheld",
                reason="stale pipelines",
                pipelines=",".join(stale),
            )
            return False
        return True

    def _set_interval(self, seconds: float) -> None:
        self.interval_s = seconds
        self._reschedule.set()
        self._kick.set()

    def _status_line(self) -> str:
        stats = self.outbox.stats()
        link = "connected" if self.session.connected.is_set() else "broker unreachable"
        return (
            f"{len(self.pipelines.states())} pipelines, {self.pipelines.fps():.1f} FPS, "
            f"outbox {stats.depth}, {link}"
        )

    def _status_extra(self) -> dict[str, Any]:
        return {
            "device_id": self.device,
            "mqtt_version": self.session.mqtt_version,
            "connected": self.session.connected.is_set(),
            "reconnects": self.session.reconnects,
            "outbox": self.outbox.stats().model_dump(mode="json"),
            "telemetry_interval_s": self.interval_s,
            "jobs": self.dispatcher.jobs.running(),
        }

    # --- telemetry -----------------------------------------------------------------------------
    def _publish_telemetry(self) -> None:
        tick = self.pipelines.tick()
        outbox = self.outbox.stats()
        agent = msg.AgentTelemetry(
            cpu_percent=round(self._cpu.percent(), 2),
            cpu_cores=usable_cpus(),
            rss_bytes=rss_bytes(),
            temperature_c=hottest_celsius(),
            outbox_depth=outbox.depth,
            outbox_bytes=outbox.bytes,
            outbox_dropped=outbox.dropped_critical
            + outbox.dropped_result
            + outbox.dropped_telemetry,
            reconnects=self.session.reconnects,
            uptime_s=round(time.monotonic() - self._started, 3),
        )
        telemetry = msg.Telemetry(
            ts=time.time(),
            interval_s=self.interval_s,
            pipelines={k: pipeline_telemetry(s) for k, s in tick.stats.items()},
            models=model_telemetry(tick.stats, tick.models, tick.reports),
            agent=agent,
        )
        self._queue(
            self.topics.device(self.device, "telemetry"),
            telemetry.model_dump_json(by_alias=True).encode(),
            Priority.TELEMETRY,
        )
        self.integrations.on_telemetry(telemetry)

    # --- stop ----------------------------------------------------------------------------------
    def _shutdown(self, pump: threading.Thread) -> None:
        log_event(log, logging.INFO, "agent_stopping", device=self.device)
        self.notifier.stopping()
        self.dispatcher.close(2.0)
        self.pipelines.close(5.0)
        self._wake.set()
        pump.join(5.0)
        # The pump has stopped, so nothing holds a sequence number: what waits in memory is
        # kept if the disk takes it by now.
        if not pump.is_alive():
            self.outbox.move_to_disk()
        if self.session.connected.is_set():
            # The will's own bytes, so a clean stop and a lost link read alike: the console
            # dates an offline state as its connection's start, which a stop stamped with
            # its own time was not.
            self.session.publish(self._state_topic, self._will_payload, qos=1, retain=True)
            self.session.flush(2.0)
        self.session.stop(3.0)
        self.integrations.close()
        self.outbox.close()
        self.commands.close()
        self.notifier.close()


_FAILED_LOG_S = 60.0
"""A step that keeps failing is logged with its traceback at most this often."""
_CONTESTED_S = 60.0
"""A state this agent did not write is logged at most this often (see _on_state)."""


class _Failures:
    """Failures of a loop that must keep going, logged without flooding the journal."""

    def __init__(self, event: str) -> None:
        self._event = event
        self._count = 0
        self._throttle = Throttle(_FAILED_LOG_S)  # per step

    def guard(self, step: str, call: Callable[[], object]) -> None:
        """Run `call`; a failure is recorded, not raised."""
        try:
            call()
        except Exception:
            self.record(step)

    def record(self, step: str) -> None:
        """Call from an `except` block."""
        self._count += 1
        if self._throttle.ready(step):
            log_crash(log, self._event, step=step, failures=self._count)
