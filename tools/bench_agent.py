"""What the agent costs: the same pipeline under `edge-agent run` and under the local CLI.

In one run, on a private mosquitto on a free loopback port, over one 640x480 MJPG video of
edge_agent/clips.py's walk (`--frames` long), person-ssdlite on the CPU:

1. the local CLI, `edge-agent run-pipeline --model person-ssdlite --source VIDEO --json`, and
   the agent, `edge-agent run --config agent.toml` told by a fleet-side client over MQTT to
   `start_pipeline` the same spec with `results = "all"` (every frame's results published,
   as the CLI prints every frame), each in its own process, in `--rounds` rounds of
   alternating order. Per process: CPU seconds per frame over the frames after the first
   (so start-up is out of both), and peak RSS (the process's own `VmHWM` when its window
   closes; `ru_maxrss` would count the bench's own memory, which a child inherits at spawn
   as its high-water mark). Targets: the agent's CPU per
   frame at most 5% over the CLI's, and its peak RSS at most 50 MB over the CLI's;
2. the agent's idle CPU: a running agent with no pipeline, default telemetry (10 s), over
   `--idle-s` seconds;
3. start to first result with a warm compile cache: from spawning `edge-agent run` to the
   first `results/<pipeline>` message, the `start_pipeline` command sent as soon as the
   birth message arrives;
4. the command round trip: `--pings` `ping` commands one after the other, from publish to
   the `ok` answer, through mosquitto: p50 and p99.

Every figure is printed with the CPU's flags and the 1-minute load average when it was
taken; the machine must be quiet for the figures to mean anything.

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_agent.py              # the full run
    python tools/bench_agent.py --frames 90 --rounds 1 --idle-s 3 --pings 50   # a smoke run

Exit status: 0 when every target was met, 1 when one was missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchlib import MeasureError, consoles, cpu_flags, finish, flags_text, load_1m, print_machine
from rich.console import Console
from rich.table import Table

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.console import DeviceConsole
from edge_agent.procstats import status_bytes
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics

MODEL = "person-ssdlite"
PIPELINE = "bench"
CPU_TARGET = 1.05
RSS_TARGET_MB = 50.0
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class ProcessFigures:
    """One process running the pipeline once."""

    frames: int
    cpu_s: float
    """CPU seconds (user + system) over the frames after the first."""
    peak_rss_mb: float
    fps: float
    load: float = field(default_factory=load_1m)

    @property
    def cpu_ms_per_frame(self) -> float:
        return 1000.0 * self.cpu_s / max(1, self.frames)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live (or not yet reaped) process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mb(pid: int, last: float = 0.0) -> float:
    """The process's own RSS high-water mark in MB (per address space, reset by exec), or
    `last` once it has none: an exiting process (a zombie) has no memory map left. The mark
    only rises, so the last reading taken while it ran is its peak up to then."""
    hwm = status_bytes(pid).get("VmHWM")
    return last if hwm is None else max(last, hwm / 2**20)


def edge_agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "edge_agent", *args]


# --- the local CLI ---------------------------------------------------------------------------
def cli_round(video: Path) -> ProcessFigures:
    proc = subprocess.Popen(
        edge_agent("run-pipeline", "--model", MODEL, "--source", str(video), "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    frames, cpu0, cpu1, t0, t1, rss = 0, None, None, 0.0, 0.0, 0.0
    for line in proc.stdout:
        rss = peak_rss_mb(proc.pid, rss)  # every line: the CLI exits right after its summary
        if line.startswith('{"summary"'):
            cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        elif line.startswith("{"):
            frames += 1
            if cpu0 is None:
                cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
    proc.wait()
    if not rss:
        raise MeasureError("run-pipeline's memory could not be read while it ran")
    if proc.returncode != 0 or cpu0 is None or cpu1 is None or frames < 2:
        raise MeasureError(f"run-pipeline exited {proc.returncode} after {frames} frames")
    return ProcessFigures(frames - 1, cpu1 - cpu0, rss, (frames - 1) / max(t1 - t0, 1e-9))


# --- the agent -------------------------------------------------------------------------------
class Agents:
    """Starts agent processes on the bench's broker; a fleet-side session drives them."""

    def __init__(self, broker: LocalBroker, work: Path) -> None:
        self.broker = broker
        self.work = work
        self.topics = Topics()
        self.fleet: MqttSession = connect(BrokerSettings(host=broker.host, port=broker.port))
        self.count = 0

    def spawn(self) -> tuple[subprocess.Popen[bytes], DeviceConsole]:
        self.count += 1
        device = f"bench-{self.count}"
        folder = self.work / device
        folder.mkdir()
        cache = os.environ.get("EDGE_AGENT_CACHE", "")
        config = folder / "agent.toml"
        config.write_text(
            f'device_id = "{device}"\nstate_dir = "{folder / "state"}"\n'
            + (f'cache_dir = "{cache}"\n' if cache else "")
            + 'results = "all"\n'
            + f'[mqtt]\nhost = "{self.broker.host}"\nport = {self.broker.port}\n',
            encoding="utf-8",
        )
        console = DeviceConsole(self.fleet, self.topics, device)
        proc = subprocess.Popen(
            edge_agent("run", "--config", str(config)),
            stdout=subprocess.DEVNULL,
            stderr=(folder / "agent.log").open("wb"),
        )
        return proc, console

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], console: DeviceConsole) -> None:
        console.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait()

    def close(self) -> None:
        self.fleet.stop()


def spec(video: Path) -> dict[str, Any]:
    return {
        "id": PIPELINE,
        "model": {"name": MODEL},
        "source": {"type": "file", "path": str(video)},
        "sinks": [],
    }


def _ended(console: DeviceConsole) -> bool:
    with console.view.lock:
        return any(
            isinstance(e, msg.AgentEvent)
            and e.pipeline == PIPELINE
            and e.kind in ("pipeline_stopped", "pipeline_failed")
            for e in console.view.events
        )


def _received(console: DeviceConsole) -> int:
    with console.view.lock:
        tally = console.view.pipelines.get(PIPELINE)
        return tally.frames if tally else 0


def agent_round(agents: Agents, video: Path, frames: int) -> ProcessFigures:
    proc, console = agents.spawn()
    try:
        console.wait_online(60.0)
        console.send("start_pipeline", {"spec": spec(video)}, timeout=120.0)
        deadline = time.monotonic() + 600.0
        while _received(console) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        cpu0, n0, t0 = cpu_seconds(proc.pid), _received(console), time.monotonic()
        # The window closes on the last frame's result, as the CLI's closes on its summary
        # line: the pipeline's teardown after it is in neither.
        while time.monotonic() < deadline and _received(console) < frames:
            time.sleep(0.005)
        cpu1, n1, t1 = cpu_seconds(proc.pid), _received(console), time.monotonic()
        rss = peak_rss_mb(proc.pid)  # the agent runs on: its mark is there to read
        while time.monotonic() < deadline and not _ended(console):
            time.sleep(0.02)
    except EdgeAgentError as exc:
        raise MeasureError(f"agent: {exc}") from None
    finally:
        Agents.stop(proc, console)
    if n1 < frames:
        raise MeasureError(f"agent published {n1} of {frames} frames")
    return ProcessFigures(n1 - n0, cpu1 - cpu0, rss, (n1 - n0) / max(t1 - t0, 1e-9))


def idle_and_pings(agents: Agents, idle_s: float, pings: int) -> dict[str, float]:
    proc, console = agents.spawn()
    try:
        console.wait_online(60.0)
        time.sleep(2.0)  # past start-up
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(idle_s)
        idle = 100.0 * (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        idle_load = load_1m()
        times = []
        for _ in range(pings):
            started = time.perf_counter()
            console.send("ping", timeout=10.0)
            times.append(1000.0 * (time.perf_counter() - started))
    except EdgeAgentError as exc:
        raise MeasureError(f"agent: {exc}") from None
    finally:
        Agents.stop(proc, console)
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return {
        "idle_cpu_percent": idle,
        "idle_load": idle_load,
        "ping_p50_ms": statistics.median(times),
        "ping_p99_ms": cuts[98],
        "ping_load": load_1m(),
    }


def first_result(agents: Agents, video: Path) -> dict[str, float]:
    started = time.monotonic()
    proc, console = agents.spawn()
    try:
        console.wait_online(60.0)
        online = time.monotonic()
        console.send("start_pipeline", {"spec": spec(video)}, timeout=120.0)
        while _received(console) == 0:
            if time.monotonic() - started > 120.0:
                raise MeasureError("no result within 120 s")
            time.sleep(0.002)
        first = time.monotonic()
    except EdgeAgentError as exc:
        raise MeasureError(f"agent: {exc}") from None
    finally:
        Agents.stop(proc, console)
    return {
        "start_to_online_s": online - started,
        "start_to_first_result_s": first - started,
        "first_result_load": load_1m(),
    }


# --- report ----------------------------------------------------------------------------------
def figures_table(cli: list[ProcessFigures], agent: list[ProcessFigures]) -> Table:
    table = Table(
        title=f"{MODEL} on CPU, same video: local CLI vs agent",
        caption=flags_text(cpu_flags()) + "\nload: 1-minute load average after each round",
        caption_justify="left",
    )
    for column in ("process", "CPU ms/frame", "peak RSS MB", "FPS", "frames", "load"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for name, runs in (("edge-agent run-pipeline", cli), ("edge-agent run (agent)", agent)):
        for run in runs:
            table.add_row(
                name,
                f"{run.cpu_ms_per_frame:.2f}",
                f"{run.peak_rss_mb:.0f}",
                f"{run.fps:.1f}",
                str(run.frames),
                f"{run.load:.2f}",
            )
    return table


def verdicts(
    out: Console, cli: list[ProcessFigures], agent: list[ProcessFigures]
) -> tuple[dict[str, Any], bool]:
    cpu_ratio = statistics.median(a.cpu_ms_per_frame for a in agent) / statistics.median(
        c.cpu_ms_per_frame for c in cli
    )
    rss_delta = statistics.median(a.peak_rss_mb for a in agent) - statistics.median(
        c.peak_rss_mb for c in cli
    )
    cpu_ok, rss_ok = cpu_ratio <= CPU_TARGET, rss_delta <= RSS_TARGET_MB
    mark = {True: "[green]met[/]", False: "[red]missed[/]"}
    out.print(
        f"agent CPU per frame / CLI: {cpu_ratio:.3f} (target <= {CPU_TARGET}) {mark[cpu_ok]}; "
        f"agent peak RSS - CLI: {rss_delta:+.0f} MB (target <= {RSS_TARGET_MB:.0f}) "
        f"{mark[rss_ok]}"
    )
    return {"cpu_ratio": cpu_ratio, "rss_delta_mb": rss_delta}, cpu_ok and rss_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=900, help="video length (default 900)")
    parser.add_argument("--rounds", type=int, default=3, help="CLI/agent rounds (default 3)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="idle window (default 30)")
    parser.add_argument("--pings", type=int, default=1000, help="ping commands (default 1000)")
    parser.add_argument("--json", type=Path, default=None, help="also write a JSON report")
    args = parser.parse_args()
    out, err = consoles(140)

    def say(text: str) -> None:
        err.print(text, highlight=False)

    import openvino

    from edge_agent import __version__
    from edge_agent.clips import write_walk

    report = print_machine(out, {"edge-agent": __version__, "openvino": openvino.__version__})
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp, LocalBroker() as broker:
        work = Path(tmp)
        video = write_walk(work / "walk.avi", frames=args.frames)
        agents = Agents(broker, work)
        cli: list[ProcessFigures] = []
        agent: list[ProcessFigures] = []
        try:
            say("warming the compile cache (one CLI run)")
            cli_round(video.path)
            for index in range(args.rounds):
                order = [("cli", cli), ("agent", agent)]
                for kind, runs in order if index % 2 == 0 else order[::-1]:
                    say(f"  round {index + 1}/{args.rounds}: {kind}")
                    if kind == "cli":
                        runs.append(cli_round(video.path))
                    else:
                        runs.append(agent_round(agents, video.path, video.frames))
            say(f"idle agent for {args.idle_s:g} s, then {args.pings} pings")
            extra = idle_and_pings(agents, args.idle_s, args.pings)
            say("start to first result")
            extra.update(first_result(agents, video.path))
        except MeasureError as exc:
            say(f"[red]error:[/] {exc}")
            return 2
        finally:
            agents.close()
    out.print(figures_table(cli, agent))
    ratios, met = verdicts(out, cli, agent)
    flags = flags_text(cpu_flags())
    out.print(
        f"agent idle CPU: {extra['idle_cpu_percent']:.2f}% of one core over {args.idle_s:g} s "
        f"(load {extra['idle_load']:.2f}; {flags})"
    )
    out.print(
        f"start to first result (warm cache): {extra['start_to_first_result_s']:.2f} s, "
        f"of which start to online {extra['start_to_online_s']:.2f} s "
        f"(load {extra['first_result_load']:.2f}; {flags})"
    )
    out.print(
        f"ping round trip over {args.pings}: p50 {extra['ping_p50_ms']:.2f} ms, "
        f"p99 {extra['ping_p99_ms']:.2f} ms (load {extra['ping_load']:.2f}; {flags})"
    )
    report.update(
        {
            "cli": [asdict(r) for r in cli],
            "agent": [asdict(r) for r in agent],
            **ratios,
            **extra,
            "targets_met": met,
        }
    )
    finish(out, report, args.json)
    if args.json is None:
        say(json.dumps(ratios))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
