"""One device pulls a model through a local mosquitto, against `mosquitto_pub -f`.

Issue 9: a 20 MB model takes at most 2x the time of the same bytes sent as one
message with `mosquitto_pub -f` to a `mosquitto_sub`, measured in the same run,
and the puller's RSS stays flat whatever the model's size.

    python tools/bench_delivery.py                 # 20 MB, plus 5 and 60 MB for RSS
    python tools/bench_delivery.py --sizes-mb 2    # a tiny run

For each size, in rounds: the baseline (mosquitto_sub -C 1 waiting, then the
time mosquitto_pub -f takes until the subscriber has it all), and edge-agent
(an `edge-fleet serve` process; a puller process that is connected before the
clock starts, then `delivery.pull` into a fresh store: release, broadcast,
chunk hashes, install with the whole-file hash). The puller reports its time,
its own RSS high-water mark (VmHWM) and how far the pull raised it above the RSS it
had, connected, before the pull. Not ru_maxrss: a child inherits its parent's
high-water mark at spawn, and this bench holds the blob, so ru_maxrss grew with the
model's size in a puller whose own memory did not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import cpu_flags, flags_text, load_average  # noqa: E402

from edge_agent.catalog.catalog import default_models_dir  # noqa: E402
from edge_agent.comms.local_broker import LocalBroker  # noqa: E402

_PULLER = """
import json, sys, time
from pathlib import Path
from edge_agent.procstats import status_bytes
from edge_agent.comms.session import connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.delivery.pull import pull
from edge_agent.paths import Layout
from edge_agent.store.store import ModelStore

port, state = int(sys.argv[1]), Path(sys.argv[2])
layout = Layout(cache=state / "cache", state=state)
session = connect(BrokerSettings(port=port))
before = status_bytes()["VmRSS"] // 1024
start = time.perf_counter()
result = pull(session, ModelStore(layout), layout, "blob", device_id="bench-1")
seconds = time.perf_counter() - start
peak = status_bytes()["VmHWM"] // 1024
session.stop()
print(json.dumps({"seconds": seconds, "peak_kb": peak, "growth_kb": peak - before,
                  "duplicates": result.stats.duplicates, "repaired": result.stats.repaired,
                  "chunks": result.chunks}))
"""


def baseline(broker: LocalBroker, blob: Path) -> float:
    """Seconds from mosquitto_pub's start until mosquitto_sub has the whole message."""
    sub = subprocess.Popen(
        ["mosquitto_sub", "-p", str(broker.port), "-t", "bench/blob", "-C", "1", "-N"],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.3)  # subscribed before the publish
    start = time.perf_counter()
    subprocess.run(
        ["mosquitto_pub", "-p", str(broker.port), "-t", "bench/blob", "-f", str(blob), "-q", "1"],
        check=True,
    )
    sub.wait(60)
    return time.perf_counter() - start


def ours(broker: LocalBroker, work: Path, version: int) -> dict[str, Any]:
    state = work / f"state-{version}"
    out = subprocess.run(
        [sys.executable, "-c", _PULLER, str(broker.port), str(state)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"puller failed: {out.stderr[-2000:]}")
    shutil.rmtree(state, ignore_errors=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def publish(broker: LocalBroker, blob: Path, work: Path, version: int, key: Path) -> None:
    manifest = work / "blob.toml"
    text = (default_models_dir() / "text-orientation.toml").read_text()
    manifest.write_text(text)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_agent.fleet.cli",
            "publish-model",
            str(blob),
            "--name",
            "blob",
            "--version",
            str(version),
            "--key",
            str(key),
            "--manifest",
            str(manifest),
            "-p",
            str(broker.port),
        ],
        cwd=ROOT,
        env={**os.environ, "EDGE_FLEET_REPO": str(work / "repo")},
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"publish-model failed: {done.stderr.strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[20, 5, 60])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-delivery-"))
    flags = cpu_flags()
    print(flags_text(flags), flush=True)
    print(f"load average before: {load_average()}", flush=True)
    report: dict[str, Any] = {"cpu_flags": flags, "sizes": []}
    try:
        with LocalBroker(max_packet_bytes=200 * 1024 * 1024) as broker:
            key = work / "fleet.key"
            subprocess.run(
                [sys.executable, "-m", "edge_agent.fleet.cli", "keygen", str(key)],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            server = subprocess.Popen(
                [sys.executable, "-m", "edge_agent.fleet.cli", "serve", "-p", str(broker.port)],
                cwd=ROOT,
                env={**os.environ, "EDGE_FLEET_REPO": str(work / "repo")},
                stdout=subprocess.PIPE,
                text=True,
            )
            assert server.stdout is not None
            server.stdout.readline()
            try:
                for version, size_mb in enumerate(args.sizes_mb, start=1):
                    blob = work / "blob.onnx"
                    blob.write_bytes(os.urandom(int(size_mb * 1024 * 1024)))
                    publish(broker, blob, work, version, key)
                    base, mine, rss, growth = [], [], [], []
                    for _ in range(args.rounds):
                        base.append(baseline(broker, blob))
                        run = ours(broker, work, version)
                        mine.append(run["seconds"])
                        rss.append(run["peak_kb"])
                        growth.append(run["growth_kb"])
                    row = {
                        "size_mb": size_mb,
                        "mosquitto_pub_s": statistics.median(base),
                        "edge_agent_s": statistics.median(mine),
                        "ratio": statistics.median(m / b for m, b in zip(mine, base, strict=True)),
                        "puller_peak_rss_mb": max(rss) / 1024,
                        "puller_pull_growth_mb": max(growth) / 1024,
                        "load_1m": os.getloadavg()[0],
                    }
                    report["sizes"].append(row)
                    print(
                        f"{size_mb:6.1f} MB  mosquitto_pub -f {row['mosquitto_pub_s']:.3f} s  "
                        f"edge-agent pull {row['edge_agent_s']:.3f} s  ratio {row['ratio']:.2f}x  "
                        f"puller peak RSS {row['puller_peak_rss_mb']:.0f} MB "
                        f"(+{row['puller_pull_growth_mb']:.1f} MB over the pull)  "
                        f"(load {row['load_1m']:.1f})",
                        flush=True,
                    )
            finally:
                server.terminate()
                server.wait(10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
