"""Soak the agent on a flaky uplink: the broker goes away and comes back, over and over.

What a box behind a bad link lives through in weeks, compressed. A real agent process
(`edge-agent run`) runs two realtime camera pipelines on one shared person-ssdlite (the
walk clip looped like a camera, every frame's result published) against a private
mosquitto. Each cycle the broker is up for `--up-s` seconds, then away for `--down-s`, in
turn in the three ways a link is lost:

- stop: mosquitto shuts down cleanly (the agent's socket is closed for it);
- kill: SIGKILL, a dropped TCP connection;
- freeze: SIGSTOP for `--freeze-s`, then SIGCONT. The socket stays open and nothing
  answers: a dead cellular link or a NAT that forgot the flow. Only the agent's keepalive
  (5 s here) can tell, and when the broker wakes it reads every connect that queued up in
  the meantime.

The fleet's own console (`DeviceConsole`, edge-fleet's code) drives and watches the agent.
After each outage it measures how long the agent takes to be online again (its birth
message), to answer a `ping`, to publish both pipelines' results again, and to empty its
outbox (telemetry's `outbox_depth`). At the end of each cycle it samples the agent's
/proc: resident memory (heap and file-backed), open file descriptors, threads, and the
size of the state folder (where the outbox keeps its sqlite file).

It passes when:
- every outage ended with the agent online, answering and publishing, within
  `--recover-s`, and its outbox drained before the next one, none of it dropped;
- telemetry's `reconnects` went up by exactly the connections the agent made (its birth
  messages), one per lost link: a connect the frozen broker swallowed is not one;
- open descriptors and threads at the end are at most 2 above the first cycle's, so a leak
  of one per reconnect shows within a few cycles;
- resident memory grew at most 10% after the first cycle (peak of the first third of the
  samples against the last third, in a run of 9 cycles or more; else first against last);
- the state folder's databases stopped growing (the outbox reuses its pages), and no
  write-ahead log grew past sqlite's automatic checkpoint (4 MB, then written over);
- every message the console heard from the agent parsed;
- the agent logged no traceback and stopped on SIGTERM with exit status 0.

    EDGE_AGENT_CACHE=.cache/edge-agent python tools/soak_agent.py               # ~40 min
    EDGE_AGENT_CACHE=.cache/edge-agent python tools/soak_agent.py --cycles 3 --up-s 8 --down-s 3

tests/integration/test_soak.py runs a short one (beside tools/soak.py's). Exit status: 0 when
it held, 1 when it did not, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.clips import write_walk
from edge_agent.comms.base import Message
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.console import DeviceConsole
from edge_agent.procstats import status_bytes
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics

Outage = Literal["stop", "kill", "freeze"]
OUTAGES: tuple[Outage, ...] = ("stop", "kill", "freeze")
DEVICE = "soak-uplink"
PIPELINES = ("cam-a", "cam-b")
KEEPALIVE_S = 5
"""The agent's MQTT keepalive here: a frozen broker is noticed within 1.5 times it."""
LEAK_MARGIN = 2
"""Descriptors or threads the last cycle may hold over the first (one in flight at the
sample, say); a leak of one per reconnect passes it by the third cycle."""
RSS_TOLERANCE = 0.10
STATE_GROWTH_TOLERANCE = 0.25
"""The state folder's databases may end this much over their largest size in the first
cycles: sqlite reuses freed pages, so a same-sized backlog needs no new ones once the first
has been held."""
WAL_LIMIT_KB = 5 * 1024
"""A write-ahead log grows to sqlite's automatic checkpoint (1000 pages, 4 MB) and is then
written over from the start; one past it means checkpoints no longer complete."""
DRAINED = 2
"""outbox_depth at or under this counts as drained: a telemetry message reports the depth
as it is made, with the results of the frames in flight still in it."""


class SoakError(Exception):
    """The soak could not run (no broker, an agent that never came up)."""


class Cycle(BaseModel):
    """One outage and the recovery after it."""

    model_config = ConfigDict(extra="forbid")

    outage: Outage = Field(description="How the broker went away.")
    down_s: float = Field(description="Seconds the broker was away.")
    reconnected: bool = Field(description="The agent made a new connection (its seq went up).")
    online_s: float | None = Field(description="Broker back to the agent's birth message.")
    ping_ms: float | None = Field(description="The first ping after it, round trip.")
    results_s: float | None = Field(description="Broker back to results from every pipeline.")
    drained_s: float | None = Field(description="Broker back to an empty outbox.")
    backlog: int = Field(
        description="Largest outbox depth in the telemetry the console received after the "
        "outage: after a stop or a kill the agent may be back and drained before the console "
        "has subscribed again, and the console then sees none of it."
    )
    rss_mb: float = Field(description="Agent resident memory at the end of the cycle.")
    rss_anon_mb: float = Field(description="Its anonymous part (heap).")
    fds: int = Field(description="Agent open file descriptors at the end of the cycle.")
    threads: int = Field(description="Agent threads at the end of the cycle.")
    state_kb: float = Field(description="Size of the agent's state folder.")
    db_kb: float = Field(description="Of which its files but the sqlite -wal and -shm files.")
    wal_kb: float = Field(description="The largest sqlite write-ahead log in it.")
    problems: list[str] = Field(description="What went wrong in this cycle.")


class UplinkReport(BaseModel):
    """What the flaky-uplink soak measured, and whether it held."""

    model_config = ConfigDict(extra="forbid")

    cycles: list[Cycle] = Field(description="Every outage, in order.")
    reconnects: int = Field(description="Lost links the agent's telemetry counted in the cycles.")
    connections: int = Field(description="Connections the agent made in the cycles (births).")
    outbox_dropped: int = Field(description="Messages the outbox dropped, ever.")
    results: dict[str, int] = Field(description="Result messages the console received.")
    rss_growth: float = Field(description="Memory growth after the first cycle, a fraction.")
    rss_judged_by: str = Field(description="'thirds' or 'first and last'.")
    stop_s: float = Field(description="SIGTERM to exit.")
    exit_code: int | None = Field(description="The agent's exit status.")
    tracebacks: int = Field(description="Tracebacks in the agent's log.")
    problems: list[str] = Field(description="Every way the run fell short; empty when it held.")

    @property
    def passed(self) -> bool:
        return not self.problems


def open_fds(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def threads(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/task").iterdir())


def folder_kb(folder: Path) -> tuple[float, float, float]:
    """The folder's size, that of its files but sqlite's -wal and -shm, and its largest
    write-ahead log, in KB."""
    sizes = {p: p.stat().st_size / 1024 for p in folder.rglob("*") if p.is_file()}
    wal = [kb for p, kb in sizes.items() if p.name.endswith("-wal")]
    db = [kb for p, kb in sizes.items() if not p.name.endswith(("-wal", "-shm"))]
    return sum(sizes.values()), sum(db), max(wal, default=0.0)


def rss_growth(samples: list[float]) -> tuple[float, str]:
    """Peak of the last third against the first third, given 9 samples or more."""
    if len(samples) >= 9:
        third = len(samples) // 3
        return max(samples[-third:]) / max(samples[:third]) - 1, "thirds"
    return samples[-1] / samples[0] - 1, "first and last"


def write_config(path: Path, port: int, state: Path) -> Path:
    cache = os.environ.get("EDGE_AGENT_CACHE", "")
    path.write_text(
        f'device_id = "{DEVICE}"\n'
        f'state_dir = "{state}"\n'
        + (f'cache_dir = "{cache}"\n' if cache else "")
        + 'results = "all"\n'
        "telemetry_interval_s = 1.0\n"
        "[mqtt]\n"
        'host = "127.0.0.1"\n'
        f"port = {port}\n"
        f"keepalive = {KEEPALIVE_S}\n"
        "reconnect_min_s = 0.2\n"
        "reconnect_max_s = 2.0\n",
        encoding="utf-8",
    )
    return path


def pipeline_spec(name: str, video: Path, fps: float) -> dict[str, object]:
    return {
        "id": name,
        "model": {"name": "person-ssdlite"},
        "source": {
            "type": "file",
            "path": str(video),
            "realtime": True,
            "loop": True,
            "fps_cap": fps,
        },
    }


class Uplink:
    """The agent, its broker and the console watching it, for one soak."""

    def __init__(self, work: Path, broker: LocalBroker) -> None:
        self.broker = broker
        self.state = work / "state"
        self.log = work / "agent.log"
        config = write_config(work / "agent.toml", broker.port, self.state)
        self.session: MqttSession = connect(
            BrokerSettings(port=broker.port, reconnect_min_s=0.05, reconnect_max_s=0.2)
        )
        self.console = DeviceConsole(self.session, Topics(), DEVICE)
        # Every telemetry message, not only the latest the console keeps: those made during
        # an outage wait in the outbox and arrive together, each with the depth it saw.
        self.depths: list[tuple[float, int]] = []
        self._lock = threading.Lock()  # depths and births, taken on the session's thread
        self.session.subscribe(Topics().device(DEVICE, "telemetry"), self._on_telemetry)
        # The seq of every birth message: one per connection the broker accepted. (The seq
        # itself goes up with every attempt, failed ones too, as Sparkplug's bdSeq does.)
        self.births: set[int] = set()
        self.session.subscribe(Topics().device(DEVICE, "state"), self._on_state)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
                stdout=log,
                stderr=log,
            )

    def _on_telemetry(self, message: Message) -> None:
        try:
            telemetry = msg.Telemetry.model_validate_json(message.payload)
        except ValueError:
            return  # the console counts bad messages, and the judge reads its tally
        with self._lock:
            self.depths.append((time.monotonic(), telemetry.agent.outbox_depth))

    def _on_state(self, message: Message) -> None:
        if not message.payload:
            return
        try:
            state = msg.State.model_validate_json(message.payload)
        except ValueError:
            return
        if state.online:
            with self._lock:
                self.births.add(state.seq)  # a console that reconnects reads it again

    def births_after(self, seq: int) -> int:
        with self._lock:
            return sum(1 for b in self.births if b > seq)

    def depths_since(self, since: float) -> list[int]:
        """outbox_depth of every telemetry message received after `since` (monotonic)."""
        with self._lock:
            return [depth for at, depth in self.depths if at > since]

    def state_msg(self) -> msg.State | None:
        with self.console.view.lock:
            return self.console.view.state

    def telemetry(self) -> msg.Telemetry | None:
        with self.console.view.lock:
            return self.console.view.telemetry

    def bad_messages(self) -> int:
        with self.console.view.lock:
            return self.console.view.bad_messages

    def last_results(self) -> dict[str, float]:
        with self.console.view.lock:
            tallies = self.console.view.pipelines
            return {name: tallies[name].last_received for name in PIPELINES if name in tallies}

    def results(self) -> dict[str, int]:
        with self.console.view.lock:
            tallies = self.console.view.pipelines
            return {name: tallies[name].frames if name in tallies else 0 for name in PIPELINES}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(5.0)
        self.console.close()
        self.session.stop(2.0)


def wait_for(check: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Whether `check()` held within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return False


def take_away(broker: LocalBroker, outage: Outage) -> None:
    if outage == "stop":
        broker.stop()
    elif outage == "kill":
        broker.kill()
    else:
        broker.freeze()


def bring_back(broker: LocalBroker, outage: Outage) -> None:
    if outage == "freeze":
        broker.thaw()
    else:
        broker.start()


def current_seq(up: Uplink) -> int:
    state = up.state_msg()
    if state is None:
        raise SoakError("no state message from the agent")
    return state.seq


def current_reconnects(up: Uplink) -> int:
    telemetry = up.telemetry()
    if telemetry is None:
        raise SoakError("no telemetry from the agent")
    return telemetry.agent.reconnects


def disconnects(outage: Outage, down_s: float) -> bool:
    """Whether the agent must lose its connection: a freeze shorter than two keepalives may
    pass unnoticed (paho pings after one keepalive of silence and gives up after another),
    and then the connection rightly lives on."""
    return outage != "freeze" or down_s >= 2 * KEEPALIVE_S


def run_cycle(up: Uplink, outage: Outage, up_s: float, down_s: float, recover_s: float) -> Cycle:
    problems: list[str] = []
    state = up.state_msg()
    seq = state.seq if state is not None else -1
    take_away(up.broker, outage)
    time.sleep(down_s)
    bring_back(up.broker, outage)
    back = time.monotonic()
    must_reconnect = disconnects(outage, down_s)

    def since_back() -> float:
        return time.monotonic() - back

    def online() -> bool:
        now = up.state_msg()
        return now is not None and now.online and (now.seq > seq or not must_reconnect)

    # Every figure counts from the broker's return. A frozen broker is only noticed by the
    # keepalive, which may run out after the thaw: that wait is part of the figure.
    online_s = since_back() if wait_for(online, recover_s) else None
    if online_s is None:
        problems.append(f"{outage}: not online again within {recover_s:g} s")
    ping_ms = None
    if online_s is not None:
        started = time.perf_counter()
        try:
            up.console.send("ping", timeout=10.0)
            ping_ms = 1000 * (time.perf_counter() - started)
        except EdgeAgentError as exc:
            problems.append(f"{outage}: ping after the outage: {exc}")

    def publishing() -> bool:
        last = up.last_results()
        return len(last) == len(PIPELINES) and min(last.values()) > back

    results_s = since_back() if wait_for(publishing, recover_s) else None
    if results_s is None:
        problems.append(f"{outage}: results stopped: last {up.last_results()}")

    def drained() -> bool:
        depths = up.depths_since(back)
        return bool(depths) and depths[-1] <= DRAINED

    drained_s = since_back() if wait_for(drained, max(recover_s, up_s)) else None
    if drained_s is None:
        problems.append(f"{outage}: the outbox did not drain: {up.depths_since(back)[-5:]}")
    rest = up_s - since_back()
    if rest > 0:
        time.sleep(rest)
    backlog = max(up.depths_since(back), default=0)
    if not up.alive():
        problems.append(f"the agent exited ({up.proc.returncode}) after a {outage}")
        memory: dict[str, int] = {}
        fds = count = 0
    else:
        memory = status_bytes(up.proc.pid)
        fds, count = open_fds(up.proc.pid), threads(up.proc.pid)
    mb = 2**20
    state_kb, db_kb, wal_kb = folder_kb(up.state)
    return Cycle(
        outage=outage,
        down_s=down_s,
        reconnected=bool((now := up.state_msg()) and now.seq > seq),
        online_s=None if online_s is None else round(online_s, 3),
        ping_ms=None if ping_ms is None else round(ping_ms, 1),
        results_s=None if results_s is None else round(results_s, 3),
        drained_s=None if drained_s is None else round(drained_s, 3),
        backlog=backlog,
        rss_mb=round(memory.get("VmRSS", 0) / mb, 1),
        rss_anon_mb=round(memory.get("RssAnon", 0) / mb, 1),
        fds=fds,
        threads=count,
        state_kb=round(state_kb, 1),
        db_kb=round(db_kb, 1),
        wal_kb=round(wal_kb, 1),
        problems=problems,
    )


def judge(
    cycles: list[Cycle],
    telemetry: msg.Telemetry | None,
    reconnects: int,
    connections: int,
    bad_messages: int,
) -> tuple[list[str], float, str]:
    problems = [p for c in cycles for p in c.problems]
    if bad_messages:
        problems.append(f"{bad_messages} messages from the agent did not parse")
    if not cycles:
        return ["no cycle ran"], 0.0, "none"
    last = cycles[-1]
    for what, series in (
        ("descriptors", [c.fds for c in cycles]),
        ("threads", [c.threads for c in cycles]),
    ):
        if series[-1] > series[0] + LEAK_MARGIN:
            problems.append(f"open {what} grew over the cycles: {series}")
    growth, judged_by = rss_growth([c.rss_mb for c in cycles])
    if growth > RSS_TOLERANCE:
        problems.append(f"resident memory grew {growth:.1%} after the first cycle")
    early = max(c.db_kb for c in cycles[: max(1, min(3, len(cycles) // 3))])
    if last.db_kb > early * (1 + STATE_GROWTH_TOLERANCE) + 256:
        problems.append(f"the state databases kept growing: {early:.0f} KB to {last.db_kb:.0f} KB")
    if (wal := max(c.wal_kb for c in cycles)) > WAL_LIMIT_KB:
        problems.append(f"a write-ahead log reached {wal:.0f} KB: checkpoints do not complete")
    if telemetry is None:
        problems.append("no telemetry at the end")
    else:
        if telemetry.agent.outbox_dropped:
            problems.append(f"the outbox dropped {telemetry.agent.outbox_dropped} messages")
        needed = sum(disconnects(c.outage, c.down_s) for c in cycles)
        if connections < needed:
            problems.append(f"{connections} new connections for {needed} lost links")
        # Exact: every lost link is followed by one new connection (a birth message), and
        # a connect a dead link swallowed is neither.
        if reconnects != connections:
            problems.append(
                f"telemetry counted {reconnects} reconnects for {connections} new connections"
            )
    return problems, growth, judged_by


def soak(
    work: Path,
    cycles: int,
    up_s: float,
    down_s: float,
    recover_s: float,
    fps: float,
    say: Callable[[str], None],
    outages: tuple[Outage, ...] = OUTAGES,
    freeze_s: float = 17.0,
) -> UplinkReport:
    video = write_walk(work / "walk.avi", empty=5, crossing=10).path
    with LocalBroker() as broker:
        up = Uplink(work, broker)
        try:
            up.console.wait_online(120.0)
            for name in PIPELINES:
                up.console.send(
                    "start_pipeline", {"spec": pipeline_spec(name, video, fps)}, timeout=120.0
                )
            if not wait_for(lambda: len(up.last_results()) == len(PIPELINES), 60.0):
                raise SoakError("the pipelines published nothing; see the agent's log")
            time.sleep(up_s)  # warm-up: compiles done, the first telemetry out
            seq0, reconnects0 = current_seq(up), current_reconnects(up)
            done: list[Cycle] = []
            for i in range(cycles):
                outage = outages[i % len(outages)]
                down = freeze_s if outage == "freeze" else down_s
                cycle = run_cycle(up, outage, up_s, down, recover_s)
                done.append(cycle)
                say(
                    f"cycle {i + 1}/{cycles} {cycle.outage}: online {cycle.online_s} s, "
                    f"results {cycle.results_s} s, drained {cycle.drained_s} s "
                    f"(backlog {cycle.backlog}), rss {cycle.rss_mb} MB, fds {cycle.fds}, "
                    f"threads {cycle.threads}, state {cycle.state_kb} KB (wal {cycle.wal_kb} KB)"
                    + (f"; {cycle.problems}" if cycle.problems else "")
                )
                if not up.alive():
                    break
            # The last telemetry of the last cycle's up phase, made after its reconnect.
            telemetry = up.telemetry()
            reconnects = current_reconnects(up) - reconnects0
            connections = up.births_after(seq0)
            problems, growth, judged_by = judge(
                done, telemetry, reconnects, connections, up.bad_messages()
            )
            started = time.monotonic()
            exit_code: int | None = None
            if up.alive():
                up.proc.send_signal(signal.SIGTERM)
                try:
                    exit_code = up.proc.wait(15.0)
                except subprocess.TimeoutExpired:
                    problems.append("the agent did not stop within 15 s of SIGTERM")
            stop_s = time.monotonic() - started
            if exit_code not in (0, None):
                problems.append(f"the agent exited with status {exit_code}")
            tracebacks = up.log.read_text(errors="replace").count("Traceback")
            if tracebacks:
                problems.append(f"{tracebacks} tracebacks in the agent's log")
            return UplinkReport(
                cycles=done,
                reconnects=reconnects,
                connections=connections,
                outbox_dropped=telemetry.agent.outbox_dropped if telemetry else 0,
                results=up.results(),
                rss_growth=round(growth, 4),
                rss_judged_by=judged_by,
                stop_s=round(stop_s, 3),
                exit_code=exit_code,
                tracebacks=tracebacks,
                problems=problems,
            )
        finally:
            up.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=60, help="outages, in turn stop/kill/freeze")
    parser.add_argument("--up-s", type=float, default=30.0, help="seconds the broker is up")
    parser.add_argument("--down-s", type=float, default=10.0, help="seconds it is away")
    parser.add_argument(
        "--freeze-s",
        type=float,
        default=17.0,
        help="seconds a frozen broker stays frozen: over two keepalives (10 s) the agent "
        "drops the link, and past about 16 s a reconnect has hung on it too",
    )
    parser.add_argument(
        "--recover-s", type=float, default=20.0, help="time allowed to be back after an outage"
    )
    parser.add_argument("--fps", type=float, default=10.0, help="pace of each camera")
    parser.add_argument(
        "--outages",
        nargs="+",
        choices=OUTAGES,
        default=list(OUTAGES),
        help="the ways the broker goes away, taken in turn",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        with tempfile.TemporaryDirectory(prefix="soak-uplink-") as tmp:
            work = args.keep or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            report = soak(
                work,
                args.cycles,
                args.up_s,
                args.down_s,
                args.recover_s,
                args.fps,
                say,
                tuple(args.outages),
                args.freeze_s,
            )
    except (EdgeAgentError, SoakError) as exc:
        print(f"soak_agent: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        for key, value in report.model_dump().items():
            if key != "cycles":
                print(f"{key}: {value}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
