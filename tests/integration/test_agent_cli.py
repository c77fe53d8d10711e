"""The agent driven by a client no one here wrote: `mosquitto_pub` in, `mosquitto_sub` out.

One agent process serves the module, on a mosquitto that takes packets up to
16 MB. Every command type in docs/PROTOCOL.md is sent as the JSON a shell script
would send; bad ones each get their error answer and the agent keeps serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edge_agent import __version__
from edge_agent.clips import bgr, sample
from edge_agent.comms.local_broker import LocalBroker, free_port
from tests.agent_kit import PREFIX, AgentProcess, InProcessAgent, Watcher, fleet, write_config
from tests.integration.mjpeg_server import MjpegServer

DEVICE = "cli-dev"
BIG = 10 * 1024 * 1024


@dataclass
class Wire:
    """mosquitto_pub and mosquitto_sub against the agent."""

    port: int
    log: Path
    agent: AgentProcess
    stream: str
    pages: Path

    def pub(
        self, payload: bytes, *, version: str = "mqttv5", flags: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [
                "mosquitto_pub",
                "-p",
                str(self.port),
                "-V",
                version,
                "-q",
                "1",
                "-t",
                f"{PREFIX}/{DEVICE}/cmd",
                *flags,
                "-s",
            ],
            input=payload,
            capture_output=True,
            timeout=30,
            check=False,
        )

    def send(
        self,
        kind: str,
        args: dict[str, Any] | None = None,
        flags: tuple[str, ...] = (),
        **envelope: Any,
    ) -> str:
        command_id = str(envelope.pop("id", f"{kind}-{time.monotonic_ns()}"))
        body = {"id": command_id, "type": kind, "args": args or {}, "sent_at": time.time()}
        done = self.pub(json.dumps({**body, **envelope}).encode(), flags=flags)
        assert done.returncode == 0, done.stderr
        return command_id

    def lines(self) -> list[tuple[str, Any]]:
        """(leaf topic, JSON) of every whole line mosquitto_sub wrote so far."""
        text = self.log.read_bytes()
        found = []
        for line in text.split(b"\n")[:-1]:  # the last piece may be half written
            topic, _, payload = line.partition(b" ")
            found.append((topic.decode().split("/", 3)[3], json.loads(payload)))
        return found

    def wait(
        self, match: Callable[[str, Any], bool], timeout: float = 30.0, what: str = "a line"
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for leaf, data in self.lines():
                if match(leaf, data):
                    return data
            assert self.agent.proc is not None
            assert self.agent.proc.poll() is None, f"the agent exited:\n{self.agent.tail()}"
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {timeout} s:\n{self.agent.tail()}")

    def answers(self, command_id: str) -> list[Any]:
        return [d for leaf, d in self.lines() if leaf == "resp" and d["id"] == command_id]

    def final(self, command_id: str, timeout: float = 30.0) -> Any:
        return self.wait(
            lambda leaf, d: (
                leaf == "resp" and d["id"] == command_id and d["status"] in ("ok", "error")
            ),
            timeout,
            f"final answer to {command_id}",
        )

    def ok(self, kind: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        answer = self.final(self.send(kind, args), timeout)
        assert answer["status"] == "ok", answer
        return answer["result"]

    def error(self, payload: bytes | str, command_id: str = "") -> Any:
        data = payload.encode() if isinstance(payload, str) else payload
        before = len(self.answers(command_id))
        done = self.pub(data)
        assert done.returncode == 0, done.stderr
        self.wait(
            lambda leaf, d: leaf == "resp" and len(self.answers(command_id)) > before,
            what=f"an answer to {data[:60]!r}",
        )
        answer = self.answers(command_id)[before]
        assert answer["status"] == "error", answer
        return answer["error"]

    def event(self, match: Callable[[Any], bool], what: str = "event") -> Any:
        return self.wait(lambda leaf, d: leaf == "events" and match(d["event"]), what=what)


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wire]:
    tmp = tmp_path_factory.mktemp("agent-cli")
    pages = tmp / "pages"
    pages.mkdir()
    # Twelve pages (six photos, upright and turned): the calibration gate needs 4 held out.
    for i, name in enumerate(["astronaut", "coffee", "chelsea", "rocket", "camera", "page"]):
        image = sample(name)
        image = bgr(image) if image.ndim == 3 else np.stack([image] * 3, axis=-1)
        cv2.imwrite(str(pages / f"{i:02d}.jpg"), image)
        cv2.imwrite(str(pages / f"{i + 6:02d}.jpg"), np.ascontiguousarray(image[::-1, ::-1]))
    (tmp / "mosquitto").mkdir()
    with ExitStack() as stack:
        broker = stack.enter_context(
            LocalBroker(max_packet_bytes=16 * 1024 * 1024, folder=tmp / "mosquitto")
        )
        published = stack.enter_context(
            fleet(
                broker.port,
                tmp / "fleet",
                [("text-orientation", "orient", v) for v in (1, 2, 3)],
            )
        )
        log = tmp / "sub.log"
        topics = ["resp", "events", "state", "telemetry", "results/#"]
        with log.open("wb") as out:
            sub = subprocess.Popen(
                ["mosquitto_sub", "-p", str(broker.port), "-V", "mqttv5", "-q", "1", "-v"]
                + [arg for t in topics for arg in ("-t", f"{PREFIX}/{DEVICE}/{t}")],
                stdout=out,
            )
        stack.callback(sub.wait, 5)
        stack.callback(sub.terminate)
        camera = MjpegServer(bgr(sample("astronaut")), free_port(), fps=10)
        camera.start()
        stack.callback(camera.stop)
        config = write_config(
            tmp / "agent.toml",
            port=broker.port,
            device=DEVICE,
            state=tmp / "state",
            trusted_keys=[published.public_key],
        )
        agent = AgentProcess(config, tmp / "agent.log").start()
        stack.callback(agent.close)
        running = Wire(broker.port, log, agent, camera.url, pages)
        running.wait(lambda leaf, d: leaf == "state" and d["online"], what="the birth")
        yield running
        assert agent.stop() == 0, agent.tail()
        # The clean stop's last word: offline, on the retained state.
        assert running.lines()[-1][0] == "state"
        assert running.lines()[-1][1]["online"] is False


def test_every_command_from_mosquitto_pub(wire: Wire) -> None:
    assert wire.ok("ping")["pong"] is True
    status = wire.ok("get_status")
    assert status["mqtt_version"] == "5"
    assert status["connected"] is True
    assert "CPU" in json.dumps(wire.ok("doctor"))
    assert "text-orientation" in wire.ok("list_models")["reference"]
    assert wire.ok("list_pipelines") == {"pipelines": []}

    # Models: deploy three versions, activate, roll back, remove one.
    deployed = wire.ok("deploy_model", {"name": "orient", "version": 1}, timeout=60)
    assert deployed["activated"] is True
    for version in (2, 3):
        result = wire.ok("deploy_model", {"name": "orient", "version": version, "activate": False})
        assert result["installed"] is True
        assert result["activated"] is False
    activate = wire.send("activate_model", {"name": "orient", "version": 2})
    assert wire.final(activate, 60)["status"] == "ok"
    assert wire.answers(activate)[0]["status"] == "accepted"
    wire.event(lambda e: e["kind"] == "model_activated" and e["version"] == 2)
    assert wire.ok("rollback_model", {"name": "orient"})["version"] == 1
    wire.event(lambda e: e["kind"] == "model_rolled_back")
    assert wire.ok("remove_model", {"name": "orient", "version": 3})["removed"] is True
    installed = {(m["version"], m["current"]) for m in wire.ok("list_models")["installed"]}
    assert installed == {(1, True), (2, False)}

    # A pipeline on a live camera: start, results, swap, stop.
    spec = {
        "id": "gate",
        "model": {"name": "orient"},
        "source": {"type": "stream", "url": wire.stream},
    }
    assert wire.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
    wire.wait(lambda leaf, d: leaf == "results/gate", what="a result")
    listed = wire.ok("list_pipelines")["pipelines"]
    assert [(p["id"], p["status"]) for p in listed] == [("gate", "running")]
    swap = {"id": "gate", "model": {"name": "text-orientation"}}
    assert wire.ok("swap_model", swap)["model"] == "text-orientation"
    wire.wait(
        lambda leaf, d: leaf == "results/gate" and d["model"] == "text-orientation",
        what="a result from the swapped-in model",
    )
    assert wire.ok("stop_pipeline", {"id": "gate"})["status"] == "stopped"

    # Telemetry interval by command: answered, and telemetry follows the new pace.
    assert wire.ok("set_telemetry", {"interval_s": 2.0}) == {"interval_s": 2.0}
    assert wire.ok("get_status")["telemetry_interval_s"] == 2.0

    # Calibrate (INT8 on a folder), with progress; and one cancelled mid-way.
    calibrate = wire.send("calibrate", {"model": "text-orientation", "data": str(wire.pages)})
    done = wire.final(calibrate, timeout=120)
    assert done["status"] == "ok", done
    assert done["result"]["name"] == "text-orientation-int8"
    assert any(a["status"] == "progress" for a in wire.answers(calibrate))
    wire.event(lambda e: e["kind"] == "calibration_done")
    doomed = wire.send("calibrate", {"model": "text-orientation", "data": str(wire.pages)})
    wire.wait(lambda leaf, d: leaf == "resp" and d["id"] == doomed, what="calibrate accepted")
    assert wire.ok("cancel", {"id": doomed}) == {"cancelled": doomed}
    cancelled = wire.final(doomed, timeout=60)
    assert cancelled["error"]["code"] == "command.cancelled"
    assert wire.ok("ping")["pong"] is True


def test_a_message_expiry_from_mosquitto_pub_stands_in_for_the_boxs_clock(wire: Wire) -> None:
    # An expires_at the box's clock reads as past, as on a box whose clock runs ahead. With
    # an MQTT 5 message expiry (-D publish message-expiry-interval) the broker held the
    # command to its lifetime on its own clock, so it runs; without one, the box's clock is
    # all there is.
    past = time.time() - 60
    expiry = ("-D", "publish", "message-expiry-interval", "30")
    vouched = wire.send("ping", flags=expiry, expires_at=past)
    assert wire.final(vouched)["status"] == "ok"
    bare = wire.send("ping", expires_at=past)
    assert wire.final(bare)["error"]["code"] == "command.expired"


def test_bad_commands_each_get_their_answer(wire: Wire) -> None:
    assert wire.error("{not json")["code"] == "command.invalid"
    assert wire.error("[1, 2]")["code"] == "command.invalid"
    unknown = wire.error(json.dumps({"id": "u1", "type": "reboot", "args": {}, "sent_at": 0}), "u1")
    assert (unknown["code"], unknown["field"]) == ("command.unknown", "type")
    envelope = wire.error(json.dumps({"id": "e1", "type": "ping", "sent_at": "yesterday"}), "e1")
    assert (envelope["code"], envelope["field"]) == ("command.invalid", "sent_at")
    bad_type = wire.error(
        json.dumps(
            {"id": "t1", "type": "set_telemetry", "args": {"interval_s": "fast"}, "sent_at": 0}
        ),
        "t1",
    )
    assert (bad_type["code"], bad_type["field"]) == ("command.invalid", "args.interval_s")
    missing = wire.error(
        json.dumps({"id": "m1", "type": "deploy_model", "args": {}, "sent_at": 0}), "m1"
    )
    assert missing["field"] == "args.name"
    expired = wire.error(
        json.dumps(
            {"id": "x1", "type": "ping", "sent_at": time.time() - 60, "expires_at": time.time() - 1}
        ),
        "x1",
    )
    assert expired["code"] == "command.expired"

    # A duplicate runs once: the second delivery gets the stored answer, not a second run.
    spec = {
        "id": "dup",
        "model": {"name": "text-orientation"},
        "source": {"type": "stream", "url": wire.stream},
    }
    payload = json.dumps(
        {"id": "d1", "type": "start_pipeline", "args": {"spec": spec}, "sent_at": time.time()}
    ).encode()
    assert wire.pub(payload).returncode == 0
    first = wire.final("d1", 60)
    assert wire.pub(payload).returncode == 0
    wire.wait(lambda leaf, d: len([a for a in wire.answers("d1") if a["status"] == "ok"]) == 2)
    second = [a for a in wire.answers("d1") if a["status"] == "ok"][1]
    assert first == second
    assert first["status"] == "ok"
    assert wire.ok("stop_pipeline", {"id": "dup"})["status"] == "stopped"
    assert wire.ok("ping")["pong"] is True


def test_payloads_python_would_take_but_json_does_not_are_refused(wire: Wire) -> None:
    # Each was run, or crashed the answer: NaN never compares as expired; a lone surrogate
    # made the answer unwritable (the id stayed "accepted" for good); 100,000 levels of
    # nesting raised RecursionError (answered "internal", id lost); true passed as 1.0 s.
    def envelope(command_id: str, kind: str, rest: str) -> str:
        return f'{{"id": "{command_id}", "type": "{kind}", "sent_at": {time.time()}, {rest}}}'

    nan = wire.error(envelope("nan1", "ping", '"expires_at": NaN'), "nan1")
    assert nan["code"] == "command.invalid"
    assert "NaN" in nan["message"]
    path = '"/tmp/\\udcff.avi"'  # the JSON escape of a lone surrogate
    spec = f'{{"id": "s", "model": {{"name": "person-ssdlite"}}, "source": {{"path": {path}}}}}'
    lone = envelope("sur1", "start_pipeline", f'"args": {{"spec": {spec}}}')
    for _ in range(2):  # and again under the same id: refused again, never "accepted"
        answer = wire.error(lone, "sur1")
        assert answer["code"] == "command.invalid"
        assert "surrogate" in answer["message"]
    deep = envelope("deep1", "ping", '"args": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    answer = wire.error(deep, "deep1")  # answered under its own id
    assert answer["code"] == "command.invalid"
    assert "nested" in answer["message"]
    for command_id, value in (("st1", "true"), ("st2", '"5"')):
        body = envelope(command_id, "set_telemetry", f'"args": {{"interval_s": {value}}}')
        answer = wire.error(body, command_id)
        assert (answer["code"], answer["field"]) == ("command.invalid", "args.interval_s")
    assert wire.ok("ping")["pong"] is True


def test_a_mic_device_alsa_would_hand_to_a_shell_is_refused_naming_the_field(
    wire: Wire, tmp_path: Path
) -> None:
    # ALSA's file PCM pipes into a shell command: this ran `touch` as the agent's user, and
    # again at every restore, the pipeline being recorded.
    proof = tmp_path / "X"
    device = f"file:'|touch {proof}'"
    spec = {
        "id": "ears",
        "model": {"name": "vad-silero"},
        "source": {"type": "mic", "device": device},
    }
    refused = wire.final(wire.send("start_pipeline", {"spec": spec}), 60)
    assert refused["status"] == "error", refused
    error = refused["error"]
    assert (error["code"], error["field"]) == ("command.invalid", "args.spec.source.device")
    assert "not a plain ALSA device name" in error["message"]
    assert "ears" not in [p["id"] for p in wire.ok("list_pipelines")["pipelines"]]
    assert not proof.exists()


def test_a_command_naming_a_model_file_by_path_is_refused(
    wire: Wire, tmp_path: Path, cache_dir: Path
) -> None:
    # A real model with its manifest beside it, on the box's disk but in no store: the
    # agent loads only what its store verified (or a pinned reference model), so a
    # command cannot make it run bytes nobody signed.
    source = next((cache_dir / "models" / "text-orientation").glob("*/*.onnx"))
    model = tmp_path / "orient.onnx"
    model.write_bytes(source.read_bytes())
    manifest = (Path(__file__).parents[2] / "models" / "text-orientation.toml").read_text()
    (tmp_path / "orient.toml").write_text(
        manifest.split("[source]")[0] + "[input]" + manifest.split("[input]")[1]
    )
    spec = {
        "id": "bypath",
        "model": {"name": str(model)},
        "source": {"type": "stream", "url": wire.stream},
    }
    refused = wire.final(wire.send("start_pipeline", {"spec": spec}), 60)
    assert refused["status"] == "error"
    assert refused["error"]["code"] == "store.path"
    assert "deploy" in refused["error"]["message"]

    spec = {
        "id": "byname",
        "model": {"name": "text-orientation"},
        "source": {"type": "stream", "url": wire.stream},
    }
    assert wire.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
    swap = wire.final(wire.send("swap_model", {"id": "byname", "model": {"name": str(model)}}), 60)
    assert (swap["status"], swap["error"]["code"]) == ("error", "store.path")
    # What can be known before the compile is in the answer too (it was "ok", and the
    # failure only a pipeline_failed event later).
    for ref, code in [
        ({"name": "no-such-model"}, "model.not_found"),
        ({"name": "vad-silero"}, "model.incompatible"),
        ({"name": "face-blazeface", "device": "TPU"}, "device.invalid"),
    ]:
        swap = wire.final(wire.send("swap_model", {"id": "byname", "model": ref}), 60)
        assert (swap["status"], swap["error"]["code"]) == ("error", code)
    assert wire.ok("stop_pipeline", {"id": "byname"})["status"] == "stopped"
    assert wire.ok("ping")["pong"] is True


def test_a_10mb_command_is_refused_by_size_and_the_agent_keeps_serving(wire: Wire) -> None:
    head = json.dumps({"id": "huge-1", "type": "ping", "sent_at": time.time(), "args": {"pad": ""}})
    payload = head[:-2].encode() + b"x" * BIG + b'"}}'
    error = wire.error(payload, "huge-1")
    assert error["code"] == "command.too_large"
    assert wire.ok("ping")["pong"] is True
    assert wire.ok("get_status")["reconnects"] == 0


def test_an_error_answer_quoting_a_huge_name_stays_small(wire: Wire) -> None:
    # The answer names the unknown argument: a 200 KB name made a 400 KB answer, stored
    # with its id (10,000 kept) and written to the log.
    name = "k" * 200_000
    payload = json.dumps({"id": "k1", "type": "ping", "args": {name: 1}, "sent_at": 0})
    error = wire.error(payload, "k1")
    assert error["code"] == "command.invalid"
    assert error["message"].startswith(f"edge-agent {__version__} does not know args.kkk")
    assert len(error["message"]) <= 1000
    assert len(error["field"]) <= 200
    assert error["field"].endswith("\u2026")


def test_a_retained_command_is_answered_and_never_run(tmp_path: Path) -> None:
    # `mosquitto_pub -r`: the broker hands the command to every new subscription, which is
    # every reconnect of a box and every box that joins later. A box that comes after it
    # must answer it and not run it; a live command with the same id still runs.
    (tmp_path / "mosquitto").mkdir()
    with LocalBroker(folder=tmp_path / "mosquitto") as broker:
        command = {"id": "ret-1", "type": "set_telemetry", "args": {"interval_s": 3600},
                   "sent_at": time.time()}  # fmt: skip
        topic = f"{PREFIX}/late-dev/cmd"
        subprocess.run(
            ["mosquitto_pub", "-p", str(broker.port), "-q", "1", "-r", "-t", topic, "-s"],
            input=json.dumps(command).encode(),
            check=True,
            timeout=10,
        )
        config = write_config(
            tmp_path / "agent.toml", port=broker.port, device="late-dev", state=tmp_path / "s"
        )
        watcher = Watcher(broker.port, "late-dev")
        agent = InProcessAgent(config)
        try:
            refused = watcher.final("ret-1")
            assert refused["error"]["code"] == "command.invalid", refused
            assert refused["error"]["field"] == "retain"
            assert "mosquitto_pub -r -n" in refused["error"]["message"]
            assert watcher.ok("get_status")["telemetry_interval_s"] == 1.0
            subprocess.run(  # the operator clears it, then sends it live: it runs
                ["mosquitto_pub", "-p", str(broker.port), "-r", "-n", "-t", topic],
                check=True,
                timeout=10,
            )
            live = watcher.send("set_telemetry", {"interval_s": 5.0}, command_id="ret-1")
            assert watcher.wait(
                lambda m: m.leaf == "resp" and m.json()["id"] == live
                and m.json()["status"] == "ok",
                what="the live command's answer",
            ).json()["result"] == {"interval_s": 5.0}  # fmt: skip
        finally:
            watcher.close()
            agent.close()


def test_a_10mb_command_the_broker_refuses_never_reaches_the_agent(tmp_path: Path) -> None:
    # mosquitto's default 1 MB max_packet_size: the broker cuts the publisher off, so
    # no answer can come; the agent must simply not notice, and go on serving.
    (tmp_path / "mosquitto").mkdir()
    with LocalBroker(folder=tmp_path / "mosquitto") as broker:
        config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "s")
        agent = InProcessAgent(config)
        watcher = Watcher(broker.port, "dev-1")
        try:
            watcher.wait_state(lambda s: s["online"])
            refused = subprocess.run(
                [
                    "mosquitto_pub",
                    "-p",
                    str(broker.port),
                    "-q",
                    "1",
                    "-t",
                    f"{PREFIX}/dev-1/cmd",
                    "-s",
                ],
                input=b'{"id":"huge-2","type":"ping","sent_at":0,"args":{"pad":"'
                + b"x" * BIG
                + b'"}}',
                capture_output=True,
                timeout=30,
                check=False,
            )
            assert refused.returncode != 0 or b"rror" in refused.stderr
            assert watcher.ok("ping")["pong"] is True
            assert watcher.answers("huge-2") == []
            assert agent.service.session.reconnects == 0
        finally:
            watcher.close()
            agent.close()


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (None, "does not exist"),
        ("device_id = \n", "unreadable"),
        ('device_id = "d"\n[mqtt]\nhost = "h"\nport = "x"\n', "mqtt.port"),
        ('device_id = "d"\ntrusted_keys = ["/nonexistent.pem"]\n[mqtt]\nhost = "h"\n', "key"),
    ],
)
def test_a_bad_config_is_one_error_line(tmp_path: Path, config: str | None, says: str) -> None:
    path = tmp_path / "agent.toml"
    if config is not None:
        path.write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "EDGE_AGENT_STATE_DIR": str(tmp_path / "state")},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("edge-agent: error:")
    assert says in lines[0]
