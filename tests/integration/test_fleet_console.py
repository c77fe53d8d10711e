"""`edge-fleet cmd | deploy | status | watch` as a user runs them, against real agents.

Each command runs as its own process (exit codes and streams are the interface), on
the suite's mosquitto; agents are real: `python -m edge_agent run` where process
behaviour matters (a clean stop), the same service on a thread elsewhere.
"""

from __future__ import annotations

import json
import math
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from edge_agent.clips import write_walk
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.store.release import generate_key, save_public_key
from tests.agent_kit import (
    PREFIX,
    AgentProcess,
    InProcessAgent,
    fleet,
    retained_state,
    write_config,
)

DEVICE = "dock-7"


def fleet_cli(
    broker: LocalBroker, *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "edge_agent.fleet.cli", *args[:1], "-p", str(broker.port)]
    return subprocess.run(
        [*command, *args[1:]], capture_output=True, text=True, timeout=timeout, check=False
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise AssertionError(
            f"not JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        ) from exc


def cells(row: str) -> list[str]:
    """A rich table row's cells, stripped."""
    return [cell.strip() for cell in row.split("│")[1:-1]]


@pytest.fixture
def agent(broker: LocalBroker, tmp_path: Path) -> Iterator[AgentProcess]:
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    running = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        # Online: what a console connecting now reads.
        retained_state(broker.port, DEVICE, timeout=30.0)
        yield running
    finally:
        running.close()


def test_cmd_prints_the_answer_and_exits_by_its_status(
    broker: LocalBroker, agent: AgentProcess
) -> None:
    done = fleet_cli(broker, "cmd", DEVICE, "ping")
    assert done.returncode == 0, done.stderr
    answer = as_json(done)
    assert (answer["status"], answer["device_id"], answer["result"]["pong"]) == ("ok", DEVICE, True)

    # The device refuses: its error answer on stdout, one line on stderr, exit 1.
    done = fleet_cli(broker, "cmd", DEVICE, "stop_pipeline", "--arg", "id=nope")
    assert done.returncode == 1, done.stderr
    assert as_json(done)["error"]["code"] == "pipeline.not_found"
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"edge-fleet: error: {DEVICE}: stop_pipeline failed")
    assert line.endswith("[pipeline.not_found]")

    # What the device would refuse for its type or arguments is refused here, before
    # anything is sent (values are JSON when they parse: 0 is a number, and out of range).
    for argv, code, needle in [
        (["set_telemetry", "--arg", "interval_s=often"], "command.invalid", "args.interval_s"),
        # Strict, as the agent validates (protocol.agent.validate_args): a string is no number.
        (["set_telemetry", "--arg", 'interval_s="5"'], "command.invalid", "args.interval_s"),
        (["remove_model", "--arg", "name=x", "--arg", "version=0"], "command.invalid", "version"),
        (["reboot"], "command.unknown", "'reboot'"),
    ]:
        done = fleet_cli(broker, "cmd", DEVICE, *argv)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert needle in line
        assert line.endswith(f"[{code}]")
    # --no-check sends it as it is (for an agent newer than this client): the device answers.
    done = fleet_cli(broker, "cmd", DEVICE, "reboot", "--no-check")
    assert done.returncode == 1, done.stderr
    assert as_json(done)["error"]["code"] == "command.unknown"

    # A usage error never reaches the device.
    done = fleet_cli(broker, "cmd", DEVICE, "ping", "--arg", "no-equals-sign")
    assert (done.returncode, done.stdout) == (2, "")
    assert "[input.invalid]" in done.stderr

    # Nobody answers: a clear line and 124, within the timeout.
    done = fleet_cli(broker, "cmd", "nobody", "ping", "--timeout", "1")
    assert (done.returncode, done.stdout) == (124, "")
    assert "no answer from nobody within 1 s (no retained state" in done.stderr
    assert done.stderr.strip().endswith("[command.timeout]")


def test_status_shows_the_device_online_then_offline_after_a_clean_stop(
    broker: LocalBroker, agent: AgentProcess
) -> None:
    done = fleet_cli(broker, "status", "--json")
    assert done.returncode == 0, done.stderr
    [online] = as_json(done)
    assert (online["device"], online["online"]) == (DEVICE, True)
    table = fleet_cli(broker, "status")
    assert f"{DEVICE} │ online" in table.stdout, table.stdout

    assert agent.stop() == 0
    done = fleet_cli(broker, "status", "--json")
    [offline] = as_json(done)
    assert (offline["device"], offline["online"]) == (DEVICE, False)
    assert offline["seq"] == online["seq"]  # the same connection's clean-stop message
    # A command to it says so, without dating the loss by the will's connect-time stamp.
    done = fleet_cli(broker, "cmd", DEVICE, "ping", "--timeout", "1")
    assert done.returncode == 124
    assert f"{DEVICE} is offline; its last connection began at" in done.stderr
    assert "offline" in fleet_cli(broker, "status").stdout


def test_watch_once_shows_the_fps_of_a_running_pipeline(
    broker: LocalBroker, tmp_path: Path
) -> None:
    walk = write_walk(tmp_path / "walk.avi", empty=5, crossing=10, frames=40)
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    spec = {
        "id": "cam",
        "model": {"name": "person-ssdlite"},
        # Played at 10 FPS, over and over: running for as long as the test watches.
        "source": {
            "type": "file",
            "path": str(walk.path),
            "realtime": True,
            "loop": True,
            "fps_cap": 10,
        },
        "sinks": [],
    }
    args_file = tmp_path / "start.json"
    args_file.write_text(json.dumps({"spec": spec}), encoding="utf-8")
    agent = InProcessAgent(config)
    try:
        started = fleet_cli(broker, "cmd", DEVICE, "start_pipeline", "--args-file", str(args_file))
        assert started.returncode == 0, started.stderr
        assert as_json(started)["result"]["status"] == "running"
        snapshot = subprocess.Popen(
            [sys.executable, "-m", "edge_agent.fleet.cli", "watch", "-p", str(broker.port),
             "--once", "3.5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        done = fleet_cli(broker, "watch", "--once", "3.5", "--json")
        table, errors = snapshot.communicate(timeout=30)
    finally:
        agent.close()
    assert done.returncode == 0, done.stderr
    [device] = as_json(done)
    assert (device["device"], device["online"], device["outbox_depth"]) == (DEVICE, True, 0)
    cam = device["pipelines"]["cam"]
    assert cam["status"] == "running"
    assert 5.0 <= cam["fps"] <= 11.0, cam
    assert cam["p95_ms"] > 0
    assert snapshot.returncode == 0, errors
    row = next(line for line in table.splitlines() if DEVICE in line)
    assert cells(row)[:4] == [DEVICE, "online", "cam", "running"], table
    assert any(f"{fps:.1f}" in row for fps in [x / 10 for x in range(50, 111)]), row


def test_deploy_to_a_group_collects_every_members_answer(
    broker: LocalBroker, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger.pub"
    save_public_key(generate_key().public_key(), stranger)
    with fleet(broker.port, tmp_path / "fleet", [("text-orientation", "orient", 1)]) as f:
        agents = []
        try:
            # dock-3 trusts another fleet's key only: its part must fail, and say why.
            for device, key in (("dock-1", f.public_key), ("dock-2", f.public_key),
                                ("dock-3", stranger)):  # fmt: skip
                config = write_config(
                    tmp_path / f"{device}.toml",
                    port=broker.port,
                    device=device,
                    state=tmp_path / device,
                    trusted_keys=[key],
                    extra='group = "docks"',
                )
                agents.append(InProcessAgent(config))
            for device in ("dock-1", "dock-2", "dock-3"):
                assert retained_state(broker.port, device, 30.0)["group"] == "docks"

            done = fleet_cli(broker, "deploy", "orient", "1", "--group", "docks")
            assert done.returncode == 1, done.stderr
            assert "deploy_model to group docks: dock-1, dock-2, dock-3" in done.stderr
            # Progress, a line per step when stderr is not a terminal.
            assert re.search(r"^dock-2: transfer \d+%$", done.stderr, re.MULTILINE), done.stderr
            rows = {line.split()[1]: line for line in done.stdout.splitlines() if "dock-" in line}
            assert sorted(rows) == ["dock-1", "dock-2", "dock-3"], done.stdout
            for device in ("dock-1", "dock-2"):
                assert cells(rows[device])[:4] == [device, "ok", "1", ""], done.stdout
                assert cells(rows[device])[4].startswith("activated")
            assert cells(rows["dock-3"])[:4] == ["dock-3", "error", "-", "release.signature"]

            # To one device, as JSON: it has v1 already, and says so; exit 0.
            done = fleet_cli(broker, "deploy", "orient", "latest", "--to", "dock-1", "--json")
            assert done.returncode == 0, done.stderr
            entry = as_json(done)["dock-1"]
            assert entry["outcome"] == "ok"
            assert entry["answer"]["result"]["version"] == 1

            missing = fleet_cli(broker, "deploy", "orient", "1", "--group", "nobody")
            assert missing.returncode == 1
            assert "no online device says it is in group 'nobody'" in missing.stderr
        finally:
            for running in agents:
                running.close()


def test_a_box_on_a_newer_edge_agent_is_seen_and_answered(broker: LocalBroker) -> None:
    # A fleet mid-upgrade: the box's messages carry a field this console does not know.
    # Refused whole, the box was left out of status (and group deploys), and its answer
    # was waited for until the timeout, as if it had never run the command.
    box = "new-box"
    state = {"online": True, "seq": 3, "ts": time.time(), "agent_version": "9.0", "protocol": 2}
    mosquitto_pub(broker, f"{PREFIX}/{box}/state", state, retain=True)
    done = fleet_cli(broker, "status", "--json")
    assert done.returncode == 0, done.stderr
    [seen] = as_json(done)
    assert (seen["device"], seen["online"], seen["agent_version"]) == (box, True, "9.0")
    assert "State.protocol" in done.stderr
    assert "upgrade edge-fleet" in done.stderr

    # The newer box answers a ping with a field this console lacks.
    newer, commands = hand_made_box(broker, box)
    try:
        asking = subprocess.Popen(
            [sys.executable, "-m", "edge_agent.fleet.cli", "cmd", "-p", str(broker.port),
             box, "ping", "--timeout", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        command = json.loads(commands.get(timeout=20))
        answer = {"id": command["id"], "status": "ok", "device_id": box, "ts": time.time(),
                  "result": {"pong": True}, "trace": "abc"}  # fmt: skip
        newer.publish(f"{PREFIX}/{box}/resp", json.dumps(answer).encode(), qos=1)
        out, err = asking.communicate(timeout=30)
    finally:
        newer.stop()
    assert asking.returncode == 0, err
    assert json.loads(out)["result"] == {"pong": True}
    assert "Response.trace" in err


def hand_made_box(
    broker: LocalBroker, box: str, topic: str = ""
) -> tuple[MqttSession, queue.Queue[bytes]]:
    """A session standing in for `box`, and the commands sent to it (on `topic`, its own
    cmd topic by default); returned once it is subscribed (its own probe came back), so
    none sent after is missed."""
    topic = topic or f"{PREFIX}/{box}/cmd"
    commands: queue.Queue[bytes] = queue.Queue()
    session = connect(BrokerSettings(port=broker.port))
    session.subscribe(topic, lambda m: commands.put(m.payload), qos=1)
    while True:
        session.publish(topic, b"probe", qos=1)
        try:
            if commands.get(timeout=0.5) == b"probe":
                return session, commands
        except queue.Empty:
            continue


def mosquitto_pub(broker: LocalBroker, topic: str, body: dict[str, Any], retain: bool) -> None:
    """One hand-made message, from a client no one here wrote."""
    flags = ["-r"] if retain else []
    done = subprocess.run(
        ["mosquitto_pub", "-p", str(broker.port), "-V", "mqttv5", "-q", "1", *flags,
         "-t", topic, "-m", json.dumps(body)],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _telemetry(ts: float) -> dict[str, Any]:
    return {
        "schema": 1, "ts": ts, "interval_s": 10.0,
        "pipelines": {"cam": {"fps": 10.0, "frames": 100, "dropped_frames": 0, "stages": {}}},
        "models": {},
        "agent": {"cpu_percent": 5.0, "rss_bytes": 1, "outbox_depth": 0, "outbox_bytes": 0,
                  "outbox_dropped": 0, "reconnects": 1, "uptime_s": 99.0},
    }  # fmt: skip


def test_watch_dates_what_it_saw_arrive_and_tells_clocks_and_replays(broker: LocalBroker) -> None:
    # What the boxes' own ts cannot say, the arrival can: a broker forwards a retained
    # state live with its retain flag cleared, and that is how watch knows it saw it come.
    now = time.time()
    day = 86400.0

    def state(device: str, **fields: Any) -> None:
        mosquitto_pub(broker, f"{PREFIX}/{device}/state", fields, retain=True)

    state("old-box", online=False, seq=4, ts=now - 30 * day)
    state("gone-box", online=True, seq=2, ts=now - 30 * day)
    echoes: queue.Queue[str] = queue.Queue()
    spy = connect(BrokerSettings(port=broker.port))
    try:
        spy.subscribe(f"{PREFIX}/fleet/console/+", lambda m: echoes.put(m.topic), qos=0)
        time.sleep(0.5)  # subscribed before watch connects: its echo must not pass unseen
        watching = subprocess.Popen(
            [sys.executable, "-m", "edge_agent.fleet.cli", "watch", "-p", str(broker.port),
             "--once", "6", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        echoes.get(timeout=20)  # watch has its retained states: what follows arrives live
        live = time.time()
        cam = [{"id": "cam", "model": "m", "status": "running"}]
        state("ahead-box", online=True, seq=1, ts=live + 365 * day, pipelines=cam)
        state("behind-box", online=True, seq=1, ts=live - 3 * 3600, pipelines=cam)
        # A box back from a 15-minute outage: its birth, then its outbox, oldest first,
        # and one older still that a slow path delivered last.
        state("replay-box", online=True, seq=1, ts=live, pipelines=cam)
        tele = f"{PREFIX}/replay-box/telemetry"
        for ts in (live - 900, live - 890, live - 1200):
            mosquitto_pub(broker, tele, _telemetry(ts), retain=False)
        state("gone-box", online=False, seq=2, ts=now - 30 * day)  # its will
        gone = time.time()
        out, err = watching.communicate(timeout=30)
    finally:
        spy.stop()
    assert watching.returncode == 0, err
    boxes = {entry["device"]: entry for entry in json.loads(out)}
    assert boxes["ahead-box"]["flags"] == ["clock +365d"]
    assert boxes["ahead-box"]["last_seen_from"] == "arrival"
    # Behind can only be told from a birth that arrived live: a retained one may be old.
    assert boxes["behind-box"]["flags"] == ["clock -3h"]
    assert boxes["replay-box"]["pipelines"]["cam"]["fps"] == 10.0
    assert boxes["replay-box"]["flags"] == ["replaying 15m behind"]
    assert boxes["replay-box"]["in_trouble"] is True
    # Its will came live: dated by its arrival, not by the connect 30 days ago.
    assert boxes["gone-box"]["last_seen_from"] == "arrival"
    assert live <= boxes["gone-box"]["last_seen"] <= gone + 1
    assert (boxes["old-box"]["last_seen_from"], boxes["old-box"]["flags"]) == ("device_clock", [])
    table = fleet_cli(broker, "watch", "--once", "1")
    row = next(line for line in table.stdout.splitlines() if "old-box" in line)
    assert "connected 30d ago" in row, table.stdout


def test_cmd_says_when_the_boxs_clock_is_far_off(broker: LocalBroker) -> None:
    box = "skewed-box"
    skewed, commands = hand_made_box(broker, box)
    try:
        for offset, said in ((2 * 86400.0, "2d ahead of"), (-7200.0, "2h behind"), (0.0, None)):
            asking = subprocess.Popen(
                [sys.executable, "-m", "edge_agent.fleet.cli", "cmd", "-p", str(broker.port),
                 box, "ping", "--timeout", "20"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            command = json.loads(commands.get(timeout=20))
            answer = {"id": command["id"], "status": "ok", "device_id": box,
                      "ts": time.time() + offset, "result": {"pong": True}}  # fmt: skip
            skewed.publish(f"{PREFIX}/{box}/resp", json.dumps(answer).encode(), qos=1)
            out, err = asking.communicate(timeout=30)
            assert asking.returncode == 0, err
            assert json.loads(out)["result"] == {"pong": True}
            warned = [line for line in err.splitlines() if "clock" in line]
            if said is None:
                assert warned == [], err
            else:
                assert warned == [
                    f"edge-fleet: warning: {box}'s clock is {said} this console's (its "
                    "answer's ts); its timestamps are off by as much: check its NTP"
                ], err
    finally:
        skewed.stop()


# Two whole runs of the CLI (1.3-2.5 s each); the calendar itself is held to every
# such value in tests/unit/test_fleet_console.py.
@pytest.mark.parametrize("ts", [math.inf, math.nan])
def test_a_box_whose_will_has_a_bad_timestamp_is_said_offline_at_an_unknown_time(
    broker: LocalBroker, ts: float
) -> None:
    # The hint for an offline box dates its will's ts by the local calendar: Infinity, NaN
    # or a year past 9999 ended `cmd` and `deploy --to` in a traceback instead of it.
    box = "odd-box"
    mosquitto_pub(broker, f"{PREFIX}/{box}/state", {"online": False, "seq": 1, "ts": ts}, True)
    verbs = [["cmd", box, "ping"], ["deploy", "m", "1", "--to", box]]
    for verb in verbs if ts == math.inf else verbs[:1]:
        done = fleet_cli(broker, *verb, "--timeout", "1")
        assert done.returncode == 124, done.stderr
        assert "Traceback" not in done.stderr
        assert f"({box} is offline; its last connection began at an unknown time)" in done.stderr


def fleet_spawn(broker: LocalBroker, *args: str) -> subprocess.Popen[str]:
    """`fleet_cli`, started: the test answers as a box meanwhile."""
    return subprocess.Popen(
        [sys.executable, "-m", "edge_agent.fleet.cli", args[0], "-p", str(broker.port), *args[1:]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@contextmanager
def fleet_running(broker: LocalBroker, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`fleet_spawn` for a `with` block: a command still running as the block ends (an
    assertion failed before the test stopped it) is killed. `Popen`'s own exit waited for
    it, and a watch never ends by itself: the test hung instead of failing."""
    with fleet_spawn(broker, *args) as running:
        try:
            yield running
        finally:
            if running.poll() is None:
                running.kill()


def lines_of(stream: Iterable[str], printed: list[str]) -> queue.Queue[str]:
    """Each line of `stream` (a running watch's stdout) as it comes, and in `printed` too."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            printed.append(line)
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def row_of(table: str, device: str) -> list[str]:
    """The cells of `device`'s row in a printed table (its title may name it too)."""
    return next(cells(line) for line in table.splitlines() if line.startswith(f"│ {device} "))


def answer(box: MqttSession, name: str, command: bytes, status: str, **fields: Any) -> None:
    """`box` answers `command` as `name`, with `fields` (progress, result, error) as they are."""
    sent = json.loads(command)
    body = {"id": sent["id"], "status": status, "device_id": name, "ts": time.time(), **fields}
    box.publish(f"{PREFIX}/{name}/resp", json.dumps(body).encode(), qos=1)


def test_an_error_answer_without_its_body_is_an_error(broker: LocalBroker) -> None:
    # `cmd` tested the body, not the status: it printed the answer and exited 0; `deploy`
    # showed the box as silent ("timeout, no answer") and exited 1 for it.
    box = "terse-box"
    session, commands = hand_made_box(broker, box)
    try:
        asking = fleet_spawn(broker, "cmd", box, "ping", "--timeout", "20")
        answer(session, box, commands.get(timeout=20), "error")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 1, err
        assert json.loads(out)["status"] == "error"
        assert err.strip().splitlines()[-1] == (
            f"edge-fleet: error: {box}: ping failed: failed without a reason [internal]"
        )
        asking = fleet_spawn(broker, "deploy", "m", "1", "--to", box, "--timeout", "20")
        answer(session, box, commands.get(timeout=20), "error")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 1, err
        assert row_of(out, box) == [box, "error", "-", "internal", "failed without a reason"], out
    finally:
        session.stop()


def test_watch_once_says_the_link_was_lost_during_its_wait(broker: LocalBroker) -> None:
    # The link's loss was noticed only by a look taken while it was up, and `--once`
    # looked first after the wait: a broker gone meanwhile passed for a quiet fleet, exit 0.
    mosquitto_pub(broker, f"{PREFIX}/dock-1/state", {"online": True, "seq": 1, "ts": 1.0}, True)
    echoes: queue.Queue[str] = queue.Queue()
    spy = connect(BrokerSettings(port=broker.port))
    try:
        spy.subscribe(f"{PREFIX}/fleet/console/+", lambda m: echoes.put(m.topic), qos=0)
        time.sleep(0.5)  # subscribed before watch connects: its echo must not pass unseen
        watching = fleet_spawn(broker, "watch", "--once", "4")
        echoes.get(timeout=20)  # watch has its states and is waiting
    finally:
        spy.stop()
    broker.stop()
    stopped = time.time()
    out, err = watching.communicate(timeout=30)
    assert watching.returncode == 124, err
    assert "lost the broker during the watch" in err
    # Dated when it went (the console looks twice a second), not when the wait ended.
    said = re.search(r"this console lost the broker at (\d\d:\d\d:\d\d)", out)
    assert said is not None, out
    near = {time.strftime("%H:%M:%S", time.localtime(stopped + d)) for d in (-1, 0, 1, 2)}
    assert said.group(1) in near, (said.group(1), near)
    assert "dock-1" in out


def test_deploy_to_a_box_that_had_not_finished_says_it_was_in_progress(
    broker: LocalBroker,
) -> None:
    # It was shown as "no answer", as a box that never heard of the deploy: the operator
    # sent it again, or went looking for an agent that was running it.
    box = "slow-box"
    session, commands = hand_made_box(broker, box)
    try:
        # One wait each (2 s apiece): the table for a box that said progress, the JSON
        # for one that said no more than accepted.
        asking = fleet_spawn(broker, "deploy", "m", "1", "--to", box, "--timeout", "2")
        command = commands.get(timeout=20)
        answer(session, box, command, "accepted")
        answer(session, box, command, "progress", progress={"stage": "pull", "fraction": 0.8})
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 124, err
        assert row_of(out, box) == [
            box, "timeout", "-", "command.timeout", "in progress at pull 80% when the wait ended"
        ], out  # fmt: skip
        asking = fleet_spawn(broker, "deploy", "m", "1", "--to", box, "--timeout", "2", "--json")
        command = commands.get(timeout=20)
        answer(session, box, command, "accepted")
        out, err = asking.communicate(timeout=30)
        assert asking.returncode == 124, err
        assert json.loads(out)[box] == {
            "outcome": "timeout", "answer": None, "started": True, "progress": None
        }  # fmt: skip
    finally:
        session.stop()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_group_deploy_stopped_prints_what_it_gathered(broker: LocalBroker, signum: int) -> None:
    # Ctrl-C ended it with no table: box-a's ok, box-b's progress, gone with the wait.
    for box in ("box-a", "box-b"):
        body = {"online": True, "seq": 1, "ts": time.time(), "group": "docks"}
        mosquitto_pub(broker, f"{PREFIX}/{box}/state", body, retain=True)
    boxes, commands = hand_made_box(broker, "box-a", f"{PREFIX}/group/docks/cmd")
    said: queue.Queue[str] = queue.Queue()
    try:
        with fleet_running(
            broker, "deploy", "m", "1", "--group", "docks", "--timeout", "60"
        ) as asking:
            command = commands.get(timeout=20)
            answer(boxes, "box-a", command, "ok", result={"version": 1, "activated": True})
            answer(boxes, "box-b", command, "accepted")
            answer(boxes, "box-b", command, "progress", progress={"stage": "pull", "fraction": 0.5})

            def read() -> None:
                for line in asking.stderr or []:
                    said.put(line)

            reader = threading.Thread(target=read)
            reader.start()
            while said.get(timeout=20).strip() != "box-b: pull 50%":
                pass  # the console has every answer sent: what a stop must not lose
            asking.send_signal(signum)
            asking.wait(timeout=30)
            reader.join(timeout=30)
            out = asking.stdout.read() if asking.stdout else ""
    finally:
        boxes.stop()
    err = "".join(said.queue)
    assert asking.returncode == 128 + signum, err
    assert "Traceback" not in err
    assert row_of(out, "box-a") == ["box-a", "ok", "1", "", "activated"], out
    assert row_of(out, "box-b") == [
        "box-b", "interrupted", "-", "", "in progress at pull 50% when stopped"
    ], out  # fmt: skip
    assert "edge-fleet: deploy_model stopped before every answer came: box-b may" in err


def test_a_piped_watch_prints_the_fleet_once_then_what_changed(broker: LocalBroker) -> None:
    # Into a log, the whole table every 2 s: 5,000 rows each time, a change not to be found.
    cam = [{"id": "cam", "model": "m", "status": "running"}]
    for box in ("box-a", "box-b", "box-c"):
        body = {"online": True, "seq": 1, "ts": time.time(), "pipelines": cam}
        mosquitto_pub(broker, f"{PREFIX}/{box}/state", body, retain=True)
    printed: queue.Queue[str] = queue.Queue()

    def table() -> str:
        """The lines printed up to the next table's foot."""
        lines = [printed.get(timeout=20)]
        while not lines[-1].startswith("└"):
            lines.append(printed.get(timeout=20))
        return "".join(lines)

    with fleet_running(broker, "watch") as watching:

        def read() -> None:
            for line in watching.stdout or []:
                printed.put(line)

        reader = threading.Thread(target=read)
        reader.start()
        first = table()
        assert all(f"│ {box} " in first for box in ("box-a", "box-b", "box-c")), first
        # New figures from box-a change nothing it stands on; box-b going offline does.
        mosquitto_pub(broker, f"{PREFIX}/box-a/telemetry", _telemetry(time.time()), False)
        time.sleep(3)  # past the 2 s between prints: box-a's figures have had their chance
        body = {"online": False, "seq": 1, "ts": time.time(), "pipelines": cam}
        mosquitto_pub(broker, f"{PREFIX}/box-b/state", body, retain=True)
        then = table()
        watching.send_signal(signal.SIGINT)
        watching.wait(timeout=30)
        reader.join(timeout=30)
        err = watching.stderr.read() if watching.stderr else ""
    assert watching.returncode == 0, err
    assert "3 devices: 2 online, 1 offline" in then, then
    assert "│ box-b " in then, then
    assert "│ box-a " not in then, then
    assert "│ box-c " not in then, then


def test_a_piped_watch_says_when_a_quiet_box_goes_silent_and_when_it_speaks_again(
    broker: LocalBroker,
) -> None:
    # Silence is the one flag that time alone sets, and the case where no message will
    # come to say it: printed only at a roster change, a box that went quiet (its will
    # lost with a broker restarted without sessions) was never reported by the piped
    # watch an alerting script reads. A box sending every 0.2 s, judged after 3 s: past the
    # 2 s a piped watch leaves between prints, so it is not caught by a look that happened
    # to come late.
    cam = [{"id": "cam", "model": "m", "status": "running"}]
    for box in ("quiet-box", "kept-box"):
        body = {"online": True, "seq": 1, "ts": time.time(), "pipelines": cam}
        mosquitto_pub(broker, f"{PREFIX}/{box}/state", body, retain=True)
    tele = f"{PREFIX}/quiet-box/telemetry"
    printed: list[str] = []

    def printout() -> tuple[str, dict[str, list[str]]]:
        """The next fleet line (none before the first table) and the rows of the table
        after it, by device."""
        deadline = time.monotonic() + 10
        fleet_line, rows = "", {}
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"not printed: {printed}") from None
            if " devices: " in line:
                fleet_line = line
            elif line.startswith("│ ") and not line.startswith("│ device "):
                row = cells(line)
                if row[0]:  # a device's first row (a second pipeline's has no name)
                    rows[row[0]] = row
            elif line.startswith("└"):
                return fleet_line, rows

    watching = fleet_spawn(broker, "watch", "--silent-after", "3")
    try:
        lines = lines_of(watching.stdout or [], printed)
        _, first = printout()  # the whole table: the watch has its retained states
        assert set(first) == {"quiet-box", "kept-box"}, first
        first_table = len(printed)
        sent = time.monotonic()
        mosquitto_pub(broker, tele, {**_telemetry(time.time()), "interval_s": 0.2}, False)
        went, rows = printout()
        assert time.monotonic() - sent >= 3.0, rows
        assert list(rows) == ["quiet-box"], rows
        assert any(flag.startswith("silent ") for flag in rows["quiet-box"]), rows
        assert "1 in trouble" in went, went
        silent_at = len(printed)
        # It speaks again, every 0.2 s as it says (one message alone may be old by the
        # watch's next look, up to 2 s on).
        speaking = threading.Event()
        quiet = connect(BrokerSettings(port=broker.port))

        def speak() -> None:
            while not speaking.wait(0.2):
                body = {**_telemetry(time.time()), "interval_s": 0.2}
                quiet.publish(tele, json.dumps(body).encode(), qos=1)

        speaker = threading.Thread(target=speak, daemon=True)
        speaker.start()
        try:
            back, rows = printout()
        finally:
            speaking.set()
            speaker.join(timeout=30)
            quiet.stop()
        assert list(rows) == ["quiet-box"], rows
        assert not any(flag.startswith("silent ") for flag in rows["quiet-box"]), rows
        assert "0 in trouble" in back, back
        watching.send_signal(signal.SIGTERM)
        _, err = watching.communicate(timeout=30)
    finally:
        watching.kill()  # a failed assertion must not leave it watching forever
        watching.wait(timeout=30)
    assert watching.returncode == 0, err
    # Its first telemetry changed nothing it stands on: nothing was printed for it, and
    # nothing while the clock ran towards its silence (a line per tick would be spam).
    fleet_lines = [line for line in printed[first_table:silent_at] if " devices: " in line]
    assert len(fleet_lines) == 1, printed
    # A box known only retained is never judged silent: its row was never printed again.
    assert [line for line in printed[first_table:] if "kept-box" in line] == [], printed


def test_a_piped_watch_prints_a_box_in_trouble_again_when_its_flags_change(
    broker: LocalBroker,
) -> None:
    # Printed only as it went into trouble or out: a box that trusts no key (in trouble
    # for good) whose camera then died, and whose outbox then began to throw messages
    # away, was never printed again, and the log's reader saw neither.
    cam = [{"id": "cam", "model": "m", "status": "running"}]
    body = {"online": True, "seq": 1, "ts": time.time(), "pipelines": cam, "unverified": True}
    mosquitto_pub(broker, f"{PREFIX}/odd-box/state", body, retain=True)
    tele = f"{PREFIX}/odd-box/telemetry"

    def telemetry(fps: float, outbox_dropped: int) -> None:
        body = _telemetry(time.time())
        body["pipelines"]["cam"]["fps"] = fps
        body["agent"]["outbox_dropped"] = outbox_dropped
        mosquitto_pub(broker, tele, body, retain=False)

    printed: list[str] = []

    def printout() -> str:
        """What is printed up to the next table's foot."""
        deadline = time.monotonic() + 10
        got: list[str] = []
        while not got or not got[-1].startswith("└"):
            try:
                got.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"not printed: {printed}") from None
        return "".join(got)

    with fleet_running(broker, "watch") as watching:
        lines = lines_of(watching.stdout or [], printed)
        first = printout()
        assert "unverified" in row_of(first, "odd-box")[-1], first
        telemetry(fps=0.0, outbox_dropped=0)
        died = printout()
        assert "1 in trouble" in died, died
        assert "fps0" in died, died
        since = len(printed)
        # The same flags again, new figures: nothing to print.
        telemetry(fps=0.0, outbox_dropped=0)
        time.sleep(3)  # past the 2 s between prints
        telemetry(fps=0.0, outbox_dropped=3)
        dropping = printout()
        assert "outbox-drops" in dropping, dropping
        assert "fps0" in dropping, dropping
        assert sum(" devices: " in line for line in printed[since:]) == 1, printed
        # The camera back and the outbox no longer dropping: still in trouble (unverified),
        # and printed for the flags it lost.
        telemetry(fps=10.0, outbox_dropped=3)
        back = printout()
        assert "1 in trouble" in back, back
        assert "fps0" not in back, back
        assert "outbox-drops" not in back, back
        assert "unverified" in back, back
        watching.send_signal(signal.SIGTERM)
        _, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, err
