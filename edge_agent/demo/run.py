"""The demo, step by step: broker, fleet, agent, deploy, pipeline, live view, summary.

Everything the fleet does here goes over MQTT exactly as a real fleet's would:
the release is signed and published retained, `edge-fleet serve`'s server
paces the chunks and answers repairs, and the agent is driven only by
commands (deploy_model, start_pipeline, get_status, stop_pipeline). The agent
runs in this process on its own thread, with a fresh state folder and the
shared compile cache, so a second demo starts in seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from edge_agent.comms.base import MqttVersion
from edge_agent.comms.session import MqttSession
from edge_agent.demo.brokers import BrokerChoice, choose_broker
from edge_agent.demo.summary import DemoSummary
from edge_agent.demo.view import LiveView
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.console import DeviceConsole, Interrupted
from edge_agent.paths import Layout
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import DEFAULT_SHARE_GROUP, Topics

log = logging.getLogger(__name__)

MODEL = "person-ssdlite"
DEVICE_ID = "demo-box"
PIPELINE = "walk"
FLEET_INSTANCE = "demo-fleet"
WALK_FRAMES = 170
"""clips.write_walk's own walk: 45 empty, 40 crossing, 40 lingering, 45 empty."""


class DemoOptions(BaseModel):
    """What `edge-agent demo` was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: str | None = Field(default=None, description="Broker URL; None starts one.")
    mqtt_version: MqttVersion | None = Field(default=None, description="None: 5 where possible.")
    frames: int = Field(default=600, ge=10, le=100_000, description="Video length in frames.")
    device: str = Field(default="CPU", description="Inference device (list) for the pipeline.")
    embedded_broker: bool = Field(
        default=False, description="Use the embedded amqtt broker even if mosquitto is here."
    )
    keep: bool = Field(default=False, description="Keep the work folder (video, keys, state).")
    timeout_s: float = Field(default=600.0, gt=0, description="Give up after this long.")


def walk_shape(frames: int) -> tuple[int, int]:
    """(empty, crossing) for a video of `frames`: clips' own walk (45, 40), repeated to fill
    a long video; a short one gets one walk squeezed in, so she is still seen."""
    if frames >= WALK_FRAMES:
        return 45, 40
    crossing = max(2, round(frames * 40 / WALK_FRAMES))
    empty = max(1, (frames - 2 * crossing) // 2)
    return empty, crossing


def _agent_env(env: Mapping[str, str]) -> dict[str, str]:
    # The demo's agent is not the box's service: it must not talk to systemd's sockets.
    skip = {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}
    return {k: v for k, v in env.items() if k not in skip}


class Demo:
    """One run of the demo. `run(stop)` returns the summary; `stop` ends it early."""

    def __init__(self, options: DemoOptions, layout: Layout, out: Console) -> None:
        self.options = options
        self.layout = layout
        self.out = out
        self.topics = Topics()
        self._step = 0
        self._work = Path(tempfile.mkdtemp(prefix="edge-agent-demo-"))
        self._stop = threading.Event()
        # What the summary reports, filled in as the steps go.
        self.broker: BrokerChoice | None = None
        self.console: DeviceConsole | None = None
        self.version: int | None = None
        self.deploy_s = 0.0
        self.where: dict[str, Any] = {}
        self.frames = 0

    def say(self, text: str) -> None:
        self._step += 1
        self.out.print(f"[bold cyan]{self._step}.[/] {text}", highlight=False, soft_wrap=True)

    def run(self, stop: threading.Event) -> DemoSummary:
        self._stop = stop
        interrupted = False
        try:
            with contextlib.ExitStack() as stack:
                try:
                    interrupted = not self._run(stack)
                except Interrupted:
                    interrupted = True
                # Taken before the agent and the broker go (the stack unwinds after).
                return self._summary(interrupted)
        finally:
            if self.options.keep:
                self.out.print(f"kept {self._work}", highlight=False)
            else:
                shutil.rmtree(self._work, ignore_errors=True)

    def _send(self, kind: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        assert self.console is not None
        return self.console.send(kind, args, stop=self._stop, **kw)

    def _checkpoint(self) -> None:
        if self._stop.is_set():
            raise Interrupted

    def _run(self, stack: contextlib.ExitStack) -> bool:
        """All the steps; False when stopped before the video ended."""
        from edge_agent.catalog.catalog import Catalog
        from edge_agent.clips import write_walk
        from edge_agent.fleet.publish import publish_release, release_for_file
        from edge_agent.fleet.repo import Repo
        from edge_agent.reference import reference_dir
        from edge_agent.store.release import generate_key, save_private_key, save_public_key

        options = self.options
        empty, crossing = walk_shape(options.frames)
        video = write_walk(self._work / "walk.avi", empty, crossing, frames=options.frames)
        self.frames = video.frames
        self.say(
            f"video: {video.frames} frames 640x480 at {video.fps:g} fps, the astronaut walks "
            f"across the coffee photo ({sum(video.visible)} frames with her in full view)"
        )

        catalog = Catalog(reference_dir("models"), self.layout.cache)
        model = catalog.resolve(MODEL)
        self.say(f"model: {MODEL} from its pinned wheel, {model.path}")
        self._checkpoint()

        broker = self.broker = choose_broker(
            options.broker, options.mqtt_version, options.embedded_broker
        )
        stack.callback(broker.close)
        settings = broker.settings
        self.say(
            f"broker: {broker.kind} at {settings.host}:{settings.port}, MQTT {settings.version}"
            + (" (amqtt speaks only 3.1.1)" if broker.kind == "amqtt" else "")
        )

        key = generate_key()
        key_path = self._work / "fleet.key"
        save_private_key(key, key_path)
        public = key_path.with_name("fleet.key.pub")
        save_public_key(key.public_key(), public)
        fleet = self._fleet(broker, stack)
        signed = release_for_file(
            model.path,
            name=MODEL,
            version=1,
            key=key,
            manifest_path=reference_dir("models") / f"{MODEL}.toml",
        )
        publish_release(
            fleet, self.topics, Repo(self._work / "fleet-repo"), signed, model.path.parent
        )
        if not fleet.flush(10.0):
            raise EdgeAgentError("the broker did not take the release", code="broker.unreachable")
        release = signed.release
        self.say(
            f"fleet: key {release.key_id}, published {MODEL} v{release.version} "
            f"({release.total_size / 2**20:.1f} MB, signed), serving chunks and repairs"
        )

        self.console = DeviceConsole(fleet, self.topics, DEVICE_ID)
        stack.callback(self.console.close)
        self._agent(broker, public, stack)
        state = self.console.wait_online(30.0, self._stop)
        self.say(
            f"agent: {DEVICE_ID} online (seq {state.seq}, MQTT {state.mqtt_version}, "
            f"inference devices {', '.join(state.devices) or 'none found'}), trusts the fleet key, "
            f"state in {self._work / 'state'}"
        )

        started = time.monotonic()
        deployed = self._send(
            "deploy_model",
            {"name": MODEL, "version": release.version, "activate": True},
            timeout=300.0,
            on_progress=lambda p: log.info("event=demo_deploy stage=%s", p.stage),
        )
        self.deploy_s = time.monotonic() - started
        self.version = int(deployed["version"])
        self.say(
            f"deploy_model: {MODEL} v{self.version} pulled in {deployed['chunks']} chunks, "
            f"verified and activated behind the health gate in {self.deploy_s:.1f} s"
        )

        self._send("start_pipeline", {"spec": self._spec(video.path)}, timeout=120.0)
        self.where = self._where()
        fallback = self.where.get("fallback")
        self.say(
            f"start_pipeline {PIPELINE}: {MODEL} on {self.where.get('device') or '?'} at "
            f"{self.where.get('precision') or '?'} precision"
            + (f" (fallback: {fallback})" if fallback else ", no fallback")
        )

        if self._watch(video.frames):
            return True
        with contextlib.suppress(EdgeAgentError, Interrupted):
            self.console.send("stop_pipeline", {"id": PIPELINE}, timeout=5.0)
        return False

    # --- parts ---------------------------------------------------------------------------------
    def _fleet(self, broker: BrokerChoice, stack: contextlib.ExitStack) -> MqttSession:
        from edge_agent.fleet.repo import Repo
        from edge_agent.fleet.server import FleetServer
        from edge_agent.fleet.server_session import connect_server

        topics = self.topics
        session, started = connect_server(
            broker.settings.model_copy(update={"client_id": FLEET_INSTANCE}),
            topics,
            FLEET_INSTANCE,
        )
        stack.callback(session.stop)
        server = FleetServer(
            session,
            Repo(self._work / "fleet-repo"),
            instance=FLEET_INSTANCE,
            topics=topics,
            # amqtt has no shared subscriptions: the one server takes repairs on the plain
            # topic. Beside a `$share` one, which the session matches too, each ran twice.
            share_group=None if broker.kind == "amqtt" else DEFAULT_SHARE_GROUP,
        )
        server.start()
        started(server)
        done = threading.Event()
        thread = threading.Thread(target=server.run, args=(done,), name="fleet", daemon=True)
        thread.start()

        def close() -> None:
            done.set()
            thread.join(5.0)
            server.close()
            session.flush(2.0)

        stack.callback(close)
        return session

    def _agent(self, broker: BrokerChoice, public: Path, stack: contextlib.ExitStack) -> None:
        from edge_agent.agent.service import AgentService
        from edge_agent.config.agent import AgentConfig, MqttConfig

        settings = broker.settings
        config = AgentConfig(
            device_id=DEVICE_ID,
            state_dir=self._work / "state",
            cache_dir=self.layout.cache,
            trusted_keys=[public],
            telemetry_interval_s=1.0,
            results="all",
            mqtt=MqttConfig(
                host=settings.host,
                port=settings.port,
                version=settings.version,
                username=settings.username,
                password=settings.password,
                keepalive=10,
                reconnect_min_s=0.2,
                reconnect_max_s=2.0,
            ),
        )
        service = AgentService(config, _agent_env(os.environ))
        done = threading.Event()
        thread = threading.Thread(target=service.run, args=(done,), name="agent", daemon=True)
        thread.start()

        def close() -> None:
            done.set()
            service.wake()
            thread.join(20.0)

        stack.callback(close)

    def _spec(self, video: Path) -> dict[str, Any]:
        return {
            "id": PIPELINE,
            "model": {"name": MODEL, "device": self.options.device},
            "source": {"type": "file", "path": str(video)},
            "events": [
                {
                    "name": "person-in-view",
                    "label": "person",
                    "min_score": 0.5,
                    "appear_frames": 3,
                    "gone_after_s": 0.5,
                }
            ],
            # Results go to MQTT only (the agent adds its own sink), not to stdout.
            "sinks": [],
        }

    def _where(self) -> dict[str, Any]:
        """Where the model runs, as get_status reports it."""
        status = self._send("get_status", timeout=30.0)
        for model in status.get("models", []):
            if model.get("name") == MODEL:
                return dict(model)
        return {}

    def _watch(self, frames: int) -> bool:
        """Show the run until the video ends (True) or `stop` (False)."""
        assert self.console is not None
        view = self.console.view
        stop = self._stop
        ended_at: list[float] = []
        # Generous: a slow box still makes 5 FPS.
        deadline = time.monotonic() + self.options.timeout_s + frames / 5.0

        def done() -> bool:
            with view.lock:
                events = list(view.events)
                tally = view.pipelines.get(PIPELINE)
            if not ended_at and any(_ended(e) for e in events):
                ended_at.append(time.monotonic())
            if time.monotonic() > deadline:
                return True
            if not ended_at:
                return False
            # Results travel behind events in the outbox: wait for the last of them.
            received = tally.frames if tally else 0
            return received >= frames or time.monotonic() - ended_at[0] > 3.0

        LiveView(self.out, view, PIPELINE).run(done, stop)
        if not ended_at and not stop.is_set():
            raise EdgeAgentError(
                f"the pipeline did not end within {self.options.timeout_s + frames / 5.0:g} s",
                "run with -v to see the agent's log",
                code="source.failed",
            )
        return bool(ended_at)

    def _summary(self, interrupted: bool) -> DemoSummary:
        tally = None
        kinds: dict[str, int] = {}
        events = telemetry = 0
        if self.console is not None:
            view = self.console.view
            with view.lock:
                tally = view.pipelines.get(PIPELINE)
                for event in view.events:
                    name = (
                        event.kind
                        if isinstance(event, msg.AgentEvent)
                        else f"detection.{event.type}"
                    )
                    kinds[name] = kinds.get(name, 0) + 1
                events = view.event_count
                telemetry = view.telemetry_count
        return DemoSummary(
            broker=self.broker.kind if self.broker else "none",
            mqtt_version=self.broker.version if self.broker else "",
            model=MODEL,
            model_version=self.version,
            device=self.where.get("device"),
            precision=self.where.get("precision"),
            fallback=self.where.get("fallback"),
            video_frames=self.frames,
            results=tally.frames if tally else 0,
            frames_with_person=tally.with_results if tally else 0,
            events=events,
            event_kinds=kinds,
            fps=round(tally.fps, 2) if tally else 0.0,
            telemetry_messages=telemetry,
            deploy_s=round(self.deploy_s, 3),
            interrupted=interrupted,
        )


def _ended(event: msg.AgentEvent | msg.DetectionEvent) -> bool:
    return (
        isinstance(event, msg.AgentEvent)
        and event.pipeline == PIPELINE
        and event.kind in ("pipeline_stopped", "pipeline_failed")
    )
