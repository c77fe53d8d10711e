"""Many devices pull one model at once, in one process, on one `selectors` loop.

Issue 9: 200 simulated devices pull the same 5 MB model under 2% injected chunk
loss; all end verified. Reported: the time, the broker's peak RSS (< 100 MB),
the broker's bytes out as a ratio to devices x model size (<= 1.1x, from
$SYS/broker/bytes/sent) and the repair traffic.

    python tools/bench_delivery_fleet.py                        # 200 devices, 5 MB, 2% loss
    python tools/bench_delivery_fleet.py --devices 10 --size-mb 1   # a tiny run

paho's `loop_start` makes a thread per client and its select() breaks past
1,024 file descriptors, so every simulated device is a paho client driven by
paho's external-loop API (loop_read / loop_write / loop_misc, with the
on_socket_open / close / register_write callbacks) from one selector. Each one
runs the real device side (`delivery.Puller` into a `PartialTransfer` on disk);
the fleet side is a real `edge-fleet serve` process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import paho.mqtt.client as paho  # noqa: E402
from benchlib import cpu_flags  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402

from edge_agent.catalog.catalog import default_models_dir  # noqa: E402
from edge_agent.comms.base import (  # noqa: E402
    Handler,
    Message,
    MqttVersion,
    Unsubscribe,
    topic_matches,
)
from edge_agent.comms.local_broker import LocalBroker  # noqa: E402
from edge_agent.delivery.partial import PartialTransfer  # noqa: E402
from edge_agent.delivery.puller import Puller, PullerOptions  # noqa: E402
from edge_agent.procstats import status_bytes  # noqa: E402
from edge_agent.protocol.delivery import FRAME_MAGIC  # noqa: E402
from edge_agent.protocol.topics import Topics  # noqa: E402
from edge_agent.store.release import load_public_key, load_signed_release, verify  # noqa: E402


class Loop:
    """One selector for every client's socket."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()

    def attach(self, client: paho.Client) -> None:
        client.on_socket_open = self._open
        client.on_socket_close = self._close
        client.on_socket_register_write = self._want_write
        client.on_socket_unregister_write = self._no_write

    def _open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self.sel.register(sock, selectors.EVENT_READ, client)

    def _close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self.sel.unregister(sock)

    def _want_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self.sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)

    def _no_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self.sel.modify(sock, selectors.EVENT_READ, client)

    def run_once(self, timeout: float) -> None:
        for key, mask in self.sel.select(timeout):
            client: paho.Client = key.data
            if mask & selectors.EVENT_READ:
                client.loop_read()
            if mask & selectors.EVENT_WRITE and client.socket() is not None:
                client.loop_write()


class LoopSession:
    """A `Communicator` on one paho client of the shared loop; drops frames at `loss`."""

    def __init__(self, loop: Loop, port: int, loss: float, rng: random.Random) -> None:
        self.mqtt_version: MqttVersion = "5"
        self.loss = loss
        self.rng = rng
        self.dropped = 0
        self.connected = False
        self.subs: dict[str, list[Handler]] = {}
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        loop.attach(self.client)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=60)

    def _on_connect(self, client: paho.Client, *_: Any) -> None:
        self.connected = True
        for topic_filter in self.subs:
            client.subscribe(topic_filter, 1)

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        payload = bytes(msg.payload)
        if payload[:4] == FRAME_MAGIC and self.rng.random() < self.loss:
            self.dropped += 1  # the injected loss: broadcast frames and repair answers alike
            return
        props = msg.properties
        message = Message(
            msg.topic,
            payload,
            msg.qos,
            msg.retain,
            getattr(props, "ResponseTopic", None) if props is not None else None,
            getattr(props, "CorrelationData", None) if props is not None else None,
        )
        for topic_filter, handlers in list(self.subs.items()):
            if topic_matches(topic_filter, msg.topic):
                for handler in list(handlers):
                    handler(message)

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
        props = None
        if response_topic or correlation_data is not None or expiry_s is not None:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if response_topic:
                props.ResponseTopic = response_topic
            if correlation_data is not None:
                props.CorrelationData = correlation_data
            if expiry_s is not None:
                props.MessageExpiryInterval = max(1, expiry_s)
        self.client.publish(topic, payload, qos=qos, retain=retain, properties=props)

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> Unsubscribe:
        new = topic_filter not in self.subs
        self.subs.setdefault(topic_filter, []).append(handler)
        if new and self.connected:
            self.client.subscribe(topic_filter, qos)

        def unsubscribe() -> None:
            handlers = self.subs.get(topic_filter, [])
            if handler in handlers:
                handlers.remove(handler)
            if not handlers and topic_filter in self.subs:
                del self.subs[topic_filter]
                self.client.unsubscribe(topic_filter)

        return unsubscribe

    def stop(self) -> None:
        self.client.disconnect()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--size-mb", type=float, default=5.0)
    parser.add_argument("--loss", type=float, default=0.02)
    parser.add_argument("--chunk-kib", type=int, default=64, choices=[64, 96, 128])
    parser.add_argument("--window", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket + 3 files per device
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    env = {**os.environ, "EDGE_FLEET_REPO": str(work / "repo"), "PYTHONPATH": str(ROOT)}
    fleet = [sys.executable, "-m", "edge_agent.fleet.cli"]
    rng = random.Random(7)
    try:
        with LocalBroker(extra_config="max_connections -1\n") as broker:
            port = ["-p", str(broker.port)]
            key = work / "fleet.key"
            subprocess.run([*fleet, "keygen", str(key)], check=True, capture_output=True)
            blob, manifest = work / "model.onnx", work / "model.toml"
            blob.write_bytes(os.urandom(int(args.size_mb * 1024 * 1024)))
            manifest.write_text((default_models_dir() / "text-orientation.toml").read_text())
            subprocess.run(
                [
                    *fleet,
                    "publish-model",
                    str(blob),
                    "--name",
                    "fleetbench",
                    "--version",
                    "1",
                    "--key",
                    str(key),
                    "--chunk-kib",
                    str(args.chunk_kib),
                    *port,
                ],
                check=True,
                capture_output=True,
                env=env,
                cwd=ROOT,
            )
            server = subprocess.Popen(
                [*fleet, "serve", "--window", str(args.window), *port],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert server.stdout is not None
            server.stdout.readline()
            signed = load_signed_release(work / "repo" / "fleetbench" / "1" / "release.json")
            release = verify(
                signed, [load_public_key(key.with_name("fleet.key.pub"))], datetime.now(UTC), None
            )
            loop = Loop()
            sent: list[int] = []
            monitor = LoopSession(loop, broker.port, 0.0, rng)
            monitor.subscribe("$SYS/broker/bytes/sent", lambda m: sent.append(int(m.payload)))
            sessions = [LoopSession(loop, broker.port, args.loss, rng) for _ in range(args.devices)]
            deadline = time.monotonic() + 30
            while not all(s.connected for s in [monitor, *sessions]):
                loop.run_once(0.05)
                if time.monotonic() > deadline:
                    raise SystemExit("not every simulated device connected within 30 s")
            seen = len(sent)
            while len(sent) < seen + 2:  # a $SYS update after everyone is connected
                loop.run_once(0.05)
            bytes_before = sent[-1]
            topics = Topics()
            options = PullerOptions(idle_s=2.0, repair_timeout_s=2.0)
            pullers = [
                Puller(
                    s,
                    topics,
                    f"sim-{i}",
                    PartialTransfer(work / "devices" / f"sim-{i}", signed),
                    options=options,
                )
                for i, s in enumerate(sessions)
            ]
            start = time.monotonic()
            for puller in pullers:
                puller.start()
            last_tick = last_misc = start
            while not all(p.done.is_set() for p in pullers):
                loop.run_once(0.01)
                now = time.monotonic()
                if now - last_tick > 0.1:
                    last_tick = now
                    for puller in pullers:
                        puller.tick(now)
                if now - last_misc > 1.0:
                    last_misc = now
                    for s in [monitor, *sessions]:
                        s.client.loop_misc()
                if now - start > args.timeout:
                    raise SystemExit("timed out")
            seconds = time.monotonic() - start
            seen = len(sent)
            while len(sent) < seen + 2:
                loop.run_once(0.05)
            bytes_out = sent[-1] - bytes_before
            peak_rss = status_bytes(broker.pid).get("VmHWM", 0) if broker.pid else 0
            verified = 0
            for puller in pullers:
                folder = puller.partial.finish()
                if all(
                    hashlib.sha256((folder / f.path).read_bytes()).hexdigest() == f.sha256
                    for f in release.files
                ):
                    verified += 1
            server.terminate()
            server.wait(10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = release.total_size
    repaired = sum(p.stats.repaired for p in pullers)
    report = {
        "devices": args.devices,
        "size_bytes": size,
        "chunk_kib": args.chunk_kib,
        "loss": args.loss,
        "seconds": seconds,
        "verified": verified,
        "broker_peak_rss_mb": peak_rss / 2**20,
        "broker_bytes_out_ratio": bytes_out / (args.devices * size),
        "frames_dropped": sum(s.dropped for s in sessions),
        "repaired_chunks": repaired,
        "repair_bytes": repaired * args.chunk_kib * 1024,
        "repair_requests": sum(p.stats.repair_requests for p in pullers),
        "duplicates": sum(p.stats.duplicates for p in pullers),
        "rejoins": sum(p.stats.rejoins for p in pullers),
        "load_1m": os.getloadavg()[0],
        "cpu_flags": cpu_flags(),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = verified == args.devices and report["broker_bytes_out_ratio"] <= 1.1
    return 0 if ok and peak_rss < 100 * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
