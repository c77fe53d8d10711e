"""What the agent's tests share: a fleet-side watcher, agent configs, the agent as a process.

- `Watcher`: a fleet console's view of one device over a real broker: it sends
  commands and keeps every message under `<prefix>/<device>/` with its arrival time.
- `write_config`: an agent.toml for a local broker, a state folder and the shared
  model cache (so reference models are not fetched again and compiles are cached).
- `AgentProcess`: `python -m edge_agent run --config ...` as a real process, for the
  tests about process behaviour (signals, kill -9, restarts); `InProcessAgent`
  runs the same service on a thread when only the protocol is under test.
- `Fleet`: a model published with edge-fleet's own code, and its repair server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import SecretStr

from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.agent.sink import EmitEvent, EmitResult
from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.comms.base import Message
from edge_agent.comms.session import MqttSession, Will, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.config.agent import AgentConfig, load_agent_config
from edge_agent.fleet.publish import publish_release, release_for_file
from edge_agent.fleet.repo import Repo
from edge_agent.fleet.server import FleetServer
from edge_agent.paths import Layout
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import generate_key, save_public_key
from edge_agent.store.store import ModelStore

REPO = Path(__file__).resolve().parents[1]
PREFIX = "edge/v1"


def cache_dir() -> Path:
    return Path(os.environ.get("EDGE_AGENT_CACHE", REPO / ".cache" / "edge-agent"))


@dataclass(frozen=True)
class Received:
    """One message the watcher saw."""

    topic: str
    payload: bytes
    retain: bool
    at: float
    """time.time() when it arrived."""

    @property
    def leaf(self) -> str:
        """The topic below `<prefix>/<device>/`: resp, state, results/cam, ..."""
        return self.topic.split("/", 3)[3]

    def json(self) -> Any:
        return json.loads(self.payload)


class Watcher:
    """A fleet console watching one device; `send` commands, `wait` for what comes back.

    Args:
        port: The broker's port.
        device: The device id.
        version: MQTT version of the watcher's own session.
        client_id: A fixed id makes the session persistent (it outlives a broker restart
            when the broker keeps sessions).
        username: The broker user (a guarded broker), with `password`.
    """

    def __init__(
        self,
        port: int,
        device: str,
        version: str = "5",
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.device = device
        self.messages: list[Received] = []
        self._cond = threading.Condition()
        settings = BrokerSettings(
            port=port,
            version=version,
            client_id=client_id or "",
            persistent=client_id is not None,
            username=username,
            password=None if password is None else SecretStr(password),
            reconnect_min_s=0.05,
            reconnect_max_s=0.2,
        )
        self.session = MqttSession(settings)
        self.session.subscribe(f"{PREFIX}/{device}/#", self._take, qos=1)
        self.session.start()
        if not self.session.wait_connected(10.0):
            raise AssertionError("the watcher cannot reach the broker")

    def _take(self, message: Message) -> None:
        with self._cond:
            self.messages.append(
                Received(message.topic, message.payload, message.retain, time.time())
            )
            self._cond.notify_all()

    def send(
        self,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        command_id: str | None = None,
        **envelope: Any,
    ) -> str:
        command_id = command_id or f"{kind}-{uuid.uuid4().hex[:8]}"
        body = {"id": command_id, "type": kind, "args": dict(args or {}), "sent_at": time.time()}
        self.session.publish(
            f"{PREFIX}/{self.device}/cmd", json.dumps({**body, **envelope}).encode(), qos=1
        )
        return command_id

    def wait(
        self, match: Callable[[Received], bool], timeout: float = 20.0, what: str = "a message"
    ) -> Received:
        """The first message (seen so far or arriving within `timeout`) that matches."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for message in self.messages[seen:]:
                    if match(message):
                        return message
                seen = len(self.messages)
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = [f"{m.leaf} {m.payload[:300]!r}" for m in self.messages[-15:]]
                    raise AssertionError(f"no {what} within {timeout} s; last: {tail}")
                self._cond.wait(left)

    def answers(self, command_id: str) -> list[dict[str, Any]]:
        with self._cond:
            found = [m.json() for m in self.messages if m.leaf == "resp"]
        return [a for a in found if a.get("id") == command_id]

    def final(self, command_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The command's ok or error answer."""
        message = self.wait(
            lambda m: (
                m.leaf == "resp"
                and (a := m.json()).get("id") == command_id
                and a["status"] in ("ok", "error")
            ),
            timeout,
            f"final answer to {command_id}",
        )
        answer: dict[str, Any] = message.json()
        return answer

    def ok(self, kind: str, args: Mapping[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """Send a command and return its result; fail the test on an error answer."""
        answer = self.final(self.send(kind, args), timeout)
        assert answer["status"] == "ok", answer
        return answer["result"]

    def on(self, leaf: str) -> list[Received]:
        """Messages on one leaf topic (exactly), in arrival order."""
        with self._cond:
            return [m for m in self.messages if m.leaf == leaf]

    def events(self) -> list[dict[str, Any]]:
        return [m.json()["event"] for m in self.on("events")]

    def wait_event(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 20.0, what: str = "event"
    ) -> dict[str, Any]:
        message = self.wait(
            lambda m: m.leaf == "events" and match(m.json()["event"]), timeout, what
        )
        event: dict[str, Any] = message.json()["event"]
        return event

    def wait_state(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 20.0
    ) -> dict[str, Any]:
        message = self.wait(lambda m: m.leaf == "state" and match(m.json()), timeout, "state")
        state: dict[str, Any] = message.json()
        return state

    def close(self) -> None:
        self.session.stop(2.0)


def retained_state(port: int, device: str, timeout: float = 5.0) -> dict[str, Any]:
    """What a console connecting now reads as the device's retained state."""
    watcher = Watcher(port, device)
    try:
        return watcher.wait_state(lambda s: True, timeout)
    finally:
        watcher.close()


def write_config(
    path: Path,
    *,
    port: int,
    device: str = "dev-1",
    state: Path,
    version: str = "5",
    keepalive: int = 5,
    telemetry_s: float = 1.0,
    results: str = "detections",
    trusted_keys: list[Path] | None = None,
    extra: str = "",
    mqtt_extra: str = "",
    cache: Path | None = None,
) -> Path:
    """An agent.toml; `cache` defaults to the shared model cache. `extra` goes at the top
    level (tables after its keys), `mqtt_extra` into `[mqtt]`."""
    keys = ", ".join(json.dumps(str(k)) for k in trusted_keys or [])
    path.write_text(
        f'device_id = "{device}"\n'
        f'state_dir = "{state}"\n'
        f'cache_dir = "{cache or cache_dir()}"\n'
        f"trusted_keys = [{keys}]\n"
        f"telemetry_interval_s = {telemetry_s}\n"
        f'results = "{results}"\n'
        f"{extra}\n"
        "[mqtt]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        f'version = "{version}"\n'
        f"keepalive = {keepalive}\n"
        "reconnect_min_s = 0.2\n"
        "reconnect_max_s = 1.0\n"
        f"{mqtt_extra}\n",
        encoding="utf-8",
    )
    return path


class AgentProcess:
    """`python -m edge_agent -v run --config CONFIG` as a child process."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        env = {**os.environ, "EDGE_AGENT_CACHE": str(cache_dir())}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edge_agent", "-v", "run", "--config", str(self.config)],
                stdout=log,
                stderr=log,
                env=env,
                cwd=REPO,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, and the exit code (SIGKILL and fail if it does not go in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5.0)
            raise AssertionError(
                f"the agent did not stop within {timeout} s:\n{self.tail()}"
            ) from None

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5.0)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5.0)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class InProcessAgent:
    """The agent's service on a thread of this process (no interpreter start-up to pay)."""

    def __init__(self, config: Path) -> None:
        from edge_agent.agent.service import AgentService

        env = {"EDGE_AGENT_CACHE": str(cache_dir())}
        self.service = AgentService(load_agent_config(config, env), env)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.service.run, args=(self.stop_event,))
        self.thread.start()

    def close(self, timeout: float = 20.0) -> None:
        self.stop_event.set()
        self.service.wake()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the agent did not stop in time"


@dataclass
class Fleet:
    """A published model and the fleet server that answers repairs for it."""

    key: Ed25519PrivateKey
    public_key: Path
    session: MqttSession
    server: FleetServer
    stop: threading.Event
    thread: threading.Thread

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5.0)
        self.session.stop(2.0)


def publish_reference(folder: Path, reference: str) -> tuple[Path, Path]:
    """A reference model's file and manifest copied to `folder`, ready for release_for_file."""
    resolved = Catalog(default_models_dir(), cache_dir()).resolve(reference)
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / f"model{resolved.path.suffix}"
    shutil.copyfile(resolved.path, model)
    shutil.copyfile(default_models_dir() / f"{reference}.toml", folder / "model.toml")
    return model, folder


@contextmanager
def fleet(port: int, folder: Path, models: list[tuple[str, str, int]]) -> Iterator[Fleet]:
    """Publish `models` ((reference, name, version), ...) signed by a fresh key, and serve
    repairs for them while the block runs."""
    key = generate_key()
    public = folder / "fleet.pub"
    save_public_key(key.public_key(), public)
    topics = Topics()
    session = connect(
        BrokerSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.5),
        will=lambda: Will(topics.server("s1"), b"", retain=True),
    )
    repo = Repo(folder / "repo")
    server = FleetServer(session, repo, instance="s1")
    server.start()
    for reference, name, version in models:
        model, source = publish_reference(folder / f"{name}-{version}", reference)
        signed = release_for_file(model, name=name, version=version, key=key)
        publish_release(session, topics, repo, signed, source)
    assert session.flush(10.0)
    stop = threading.Event()
    thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
    thread.start()
    running = Fleet(key, public, session, server, stop, thread)
    try:
        yield running
    finally:
        running.close()


def trusting_config(f: Fleet, port: int, folder: Path, device: str, **extra: Any) -> Path:
    """`write_config` for an agent of `device` under `folder` (agent.toml, state/) that
    trusts the releases `f` signs; `extra` as write_config takes it."""
    return write_config(
        folder / "agent.toml",
        port=port,
        device=device,
        state=folder / "state",
        trusted_keys=[f.public_key],
        **extra,
    )


def agent_pipelines(
    state: Path,
    cache: Path,
    on_event: EmitEvent,
    on_result: EmitResult = lambda pipeline, result: None,
) -> Pipelines:
    """The agent's pipeline manager on a real pool, its state (record, store) in `state`:
    built again on the same folder, it is the manager of an agent started again."""
    layout = Layout(cache=cache, state=state)
    pool = TrackedPool(Catalog(default_models_dir(), cache, ModelStore(layout)))
    return Pipelines(
        pool,
        layout,
        AgentRecords(layout.state),
        "all",
        on_result,
        on_event,
        max_running=AgentConfig.model_fields["max_pipelines"].default,
    )


def photo_pipelines(
    folder: Path, cache: Path, photo: npt.NDArray[np.uint8], on_event: EmitEvent
) -> tuple[Pipelines, dict[str, Any]]:
    """The agent's pipeline manager on a real pool, state under `folder`, and the spec of a
    face-blazeface pipeline over a folder of three copies of `photo` (RGB)."""
    photos = folder / "photos"
    photos.mkdir()
    for i in range(3):
        cv2.imwrite(str(photos / f"{i}.jpg"), photo[:, :, ::-1])
    pipelines = agent_pipelines(folder / "state", cache, on_event)
    spec = {
        "id": "cam",
        "model": {"name": "face-blazeface"},
        "source": {"type": "folder", "path": str(photos)},
    }
    return pipelines, spec
