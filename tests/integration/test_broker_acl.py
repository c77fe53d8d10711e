"""The shipped broker setup (systemd/mosquitto/) with a real fleet and a box that attacks.

One mosquitto for the module, with the shipped edge-agent.conf and ACLs and users made by
mosquitto_passwd. The agent is box dock-1 in group docks, edge-fleet runs as the fleet's
users, and box dock-2 attacks with its own valid password through mosquitto_pub and
mosquitto_sub, clients no one here wrote: what is checked is what the broker lets
through, and what the agent then does.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import cv2
import pytest

from edge_agent.clips import sample
from edge_agent.comms.local_broker import find_mosquitto
from edge_agent.fleet.repo import Repo
from edge_agent.protocol.delivery import RepairRequest, bitmap, decode_frame, encode_bits
from edge_agent.store.release import (
    generate_key,
    load_public_key,
    parse_signed_release,
    save_private_key,
    save_public_key,
    verify,
)
from tests.agent_kit import InProcessAgent, Watcher, publish_reference, write_config
from tests.broker import ShippedBroker
from tests.cli_kit import run_bounded

BOXES = {"dock-1": "dock-1-secret", "dock-2": "dock-2-secret"}
FLEET_USERS = {
    "fleet": "console-secret",
    "fleet-serve": "serve-secret",
    "fleet-viewer": "viewer-secret",
}
VIEWER = "\nuser fleet-viewer\ntopic read edge/v1/#\ntopic write edge/v1/fleet/console/+\n"
"""A user who may watch the fleet (its console echo included) but command no box."""
PASSWORDS = {**BOXES, **FLEET_USERS}
NAMESAKES = {"fleet": "box-named-fleet", "fleet-serve": "box-named-serve"}
"""Box users in boxes.passwd named as the fleet's users are (a mistake the ACL must absorb)."""
GROUP = "docks"
MEMBERS = f"\nuser dock-1\ntopic read edge/v1/group/{GROUP}/cmd\n"
"""dock-1's group line, as systemd/README.md has the operator add it."""
REFUSED = "Not authorized"
"""What mosquitto_pub prints when the broker's PUBACK refuses a publish (MQTT 5)."""


class Sub:
    """mosquitto_sub as one user, its debug lines read as they come: when the broker
    acknowledged the subscriptions, and the topic of every message it delivered."""

    _PUBLISH = re.compile(r"received PUBLISH \([^']*'(?P<topic>[^']*)'")

    def __init__(
        self, port: int, user: str, filters: Sequence[str], client_id: str | None = None
    ) -> None:
        # Line-buffered: into a pipe, its debug lines (the SUBACK) would wait in its stdio
        # buffer until a message came.
        command = ["stdbuf", "-oL", "mosquitto_sub", "-V", "5", "-p", str(port), "-u", user]
        command += ["-P", PASSWORDS[user]]
        command += ["-d", "-q", "1", "-F", "%t", *(["-i", client_id] if client_id else [])]
        for topic_filter in filters:
            command += ["-t", topic_filter]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait(self, needle: str, timeout: float = 10.0) -> None:
        """Until a line holds `needle` (`received SUBACK`: subscribed; a topic: delivered)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(needle in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"mosquitto_sub never said {needle!r}: {self.lines}")
                self._cond.wait(min(left, 0.2))

    def delivered(self) -> list[str]:
        """The topics of the messages the broker delivered, in order."""
        with self._cond:
            return [m["topic"] for line in self.lines if (m := self._PUBLISH.search(line))]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(5.0)
        self._reader.join(5.0)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


STALE_ENTITY = "homeassistant/binary_sensor/dock-1/gone_person_occupancy/config"


def box_pub(
    port: int, user: str, topic: str, payload: str, *flags: str, password: str | None = None
) -> str:
    """mosquitto_pub as `user` (with `password`, else its own) at QoS 1, MQTT 5; what it
    printed (the broker's refusal)."""
    done = subprocess.run(
        ["mosquitto_pub", "-V", "5", "-q", "1", "-p", str(port), "-u", user,
         "-P", password or PASSWORDS[user], "-t", topic, "-m", payload, *flags],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    return done.stdout + done.stderr


def fleet_cli(
    broker: ShippedBroker, verb: str, *args: str, user: str = "fleet"
) -> subprocess.CompletedProcess[str]:
    """`edge-fleet VERB ARGS` on the fleet's listener as `user`."""
    return run_bounded(
        [sys.executable, "-m", "edge_agent.fleet.cli", verb, "-p", str(broker.fleet_port),
         "-u", user, "-P", PASSWORDS[user], *args],
        timeout=120.0,
    )  # fmt: skip


@dataclass
class Site:
    broker: ShippedBroker
    agent: InProcessAgent
    console: Watcher
    """A console as the fleet user, following dock-1."""
    tap: Sub
    """mosquitto_sub as the fleet user on the servers' presence and the chunk broadcasts."""
    folder: Path
    """Holds the fleet's key pair (fleet.key, fleet.pub) and its repository (repo)."""
    config: Path
    """dock-1's agent.toml."""

    def ping(self) -> None:
        """A round trip to dock-1: whatever reached the broker before it has been handled."""
        self.console.ok("ping", timeout=10.0)


@contextmanager
def serving(broker: ShippedBroker, repo: Path, log: Path) -> Iterator[None]:
    """`edge-fleet serve` as its own user, stopped as systemd stops it (SIGTERM)."""
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "edge_agent.fleet.cli", "serve", "-p", str(broker.fleet_port),
             "-u", "fleet-serve", "-P", PASSWORDS["fleet-serve"], "--repo", str(repo),
             "--instance", "s1"],
            stdout=out, stderr=out,
        )  # fmt: skip
    try:
        yield
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(10.0)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if find_mosquitto() is None:
        pytest.fail("mosquitto is not installed: run `make system-deps`")
    folder = tmp_path_factory.mktemp("acl")
    key = generate_key()
    save_private_key(key, folder / "fleet.key")
    save_public_key(key.public_key(), folder / "fleet.pub")
    model, _ = publish_reference(folder / "orient", "text-orientation")
    password = folder / "dock-1.password"
    password.write_text(BOXES["dock-1"] + "\n")
    password.chmod(0o600)
    with contextlib.ExitStack() as stack:
        boxes = {**BOXES, **NAMESAKES}
        broker = ShippedBroker(
            folder / "broker", boxes, FLEET_USERS, acl_extra=MEMBERS, fleet_acl_extra=VIEWER
        )
        stack.enter_context(broker)
        published = fleet_cli(
            broker, "publish-model", str(model), "--name", "orient", "--version", "1",
            "--key", str(folder / "fleet.key"), "--repo", str(folder / "repo"),
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
        tap = Sub(
            broker.fleet_port, "fleet", ["edge/v1/fleet/servers/+", "edge/v1/delivery/+/+/chunks"]
        )
        stack.callback(tap.close)
        stack.enter_context(serving(broker, folder / "repo", folder / "serve.log"))
        console = Watcher(
            broker.fleet_port, "dock-1", username="fleet", password=PASSWORDS["fleet"]
        )
        stack.callback(console.close)
        # An entity an earlier run of dock-1 left retained: the agent clears it at connect.
        assert REFUSED not in box_pub(broker.port, "dock-1", STALE_ENTITY, "{}", "-r")
        config = write_config(
            folder / "dock-1.toml",
            port=broker.port,
            device="dock-1",
            state=folder / "dock-1",
            results="all",
            trusted_keys=[folder / "fleet.pub"],
            extra=f'group = "{GROUP}"\n[integrations.homeassistant]\nenabled = true\n',
            mqtt_extra=f'username = "dock-1"\npassword_file = "{password}"\n',
        )
        site = Site(broker, InProcessAgent(config), console, tap, folder, config)
        stack.callback(lambda: site.agent.close())  # the agent a test restarted, if one did
        console.wait_state(lambda s: s["online"], timeout=30.0)
        tap.wait("'edge/v1/fleet/servers/s1'", timeout=30.0)
        yield site


def test_the_fleet_commands_and_deploys_to_a_group_under_the_shipped_acl(site: Site) -> None:
    ping = fleet_cli(site.broker, "cmd", "dock-1", "ping")
    assert ping.returncode == 0, ping.stderr
    assert json.loads(ping.stdout)["result"]["pong"] is True

    # One group command, which the box hears through its group line, and a deploy by the
    # paced broadcast that `serve` runs as its own, narrower user.
    deploy = fleet_cli(site.broker, "deploy", "orient", "1", "--group", GROUP, "--json")
    assert deploy.returncode == 0, deploy.stderr
    answer = json.loads(deploy.stdout)["dock-1"]["answer"]
    assert answer["status"] == "ok", answer
    assert (answer["result"]["version"], answer["result"]["activated"]) == (1, True)
    assert "edge/v1/delivery/orient/1/chunks" in site.tap.delivered()

    # `status` knows it has every state from its own echo under edge/v1/fleet/console/.
    status = fleet_cli(site.broker, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [(d["device"], d["online"]) for d in json.loads(status.stdout)] == [("dock-1", True)]

    # Three edge-fleet processes of the console's user came and went while this console
    # was connected as the same user: on the fleet's listener none took another's place.
    assert site.console.session.reconnects == 0
    site.ping()
    assert site.agent.service.session.rejected == 0, "the ACL refused something the box sent"


def test_a_box_can_command_neither_another_box_nor_a_group(site: Site) -> None:
    forged = {topic: f"forged-{uuid.uuid4().hex[:8]}" for topic in
              ("edge/v1/dock-1/cmd", f"edge/v1/group/{GROUP}/cmd")}  # fmt: skip
    for topic, command_id in forged.items():
        ping = json.dumps({"id": command_id, "type": "ping", "args": {}, "sent_at": time.time()})
        assert REFUSED in box_pub(site.broker.port, "dock-2", topic, ping), topic
    # The refusals are the ACL's: the same user and password may answer for its own box.
    assert REFUSED not in box_pub(site.broker.port, "dock-2", "edge/v1/dock-2/resp", "{}")

    # Each forged command was refused before this ping was sent: had one reached dock-1,
    # its answer would be in already.
    site.ping()
    for command_id in forged.values():
        assert site.console.answers(command_id) == []


def test_a_box_reads_no_other_boxs_answers_results_or_group(site: Site) -> None:
    spy = Sub(
        site.broker.port,
        "dock-2",
        ["edge/v1/dock-1/#", "edge/v1/+/resp", "edge/v1/+/results/#", "edge/v1/group/+/cmd",
         "edge/v1/releases/+/+"],
    )  # fmt: skip
    try:
        # What any box may read comes through: the subscriptions are in place.
        spy.wait("'edge/v1/releases/orient/1'")
        photos = site.folder / "photos"
        photos.mkdir()
        for i in range(2):
            cv2.imwrite(str(photos / f"{i}.jpg"), sample("astronaut")[:, :, ::-1])
        spec = {"id": "cam", "model": {"name": "text-orientation"},
                "source": {"type": "folder", "path": str(photos)}, "sinks": []}  # fmt: skip
        site.console.ok("start_pipeline", {"spec": spec}, timeout=60.0)
        site.console.wait(lambda m: m.leaf == "results/cam", what="a result")
        # Home Assistant's occupancy state comes after its discovery configs.
        site.console.wait(lambda m: m.leaf == "occupancy/cam/person", what="occupancy")
        group_ping = f"group-{uuid.uuid4().hex[:8]}"
        body = {"id": group_ping, "type": "ping", "args": {}, "sent_at": time.time()}
        site.console.session.publish(f"edge/v1/group/{GROUP}/cmd", json.dumps(body).encode(), qos=1)
        assert site.console.final(group_ping)["status"] == "ok"
        site.ping()
    finally:
        spy.close()
    assert set(spy.delivered()) == {"edge/v1/releases/orient/1", "edge/v1/releases/orient/latest"}
    # Results, HA discovery and occupancy were all the box's to write.
    assert site.agent.service.session.rejected == 0
    # And its own entity configs to read back: the one an earlier run left came to it, and
    # its clear was not refused (above). (A mosquitto_sub as dock-1 to look would take over
    # the agent's session: the broker names clients by user.)
    ha = site.agent.service.integrations.homeassistant
    assert ha is not None
    assert ha.swept == 1


def test_a_box_can_replace_neither_a_release_nor_another_boxs_state(site: Site) -> None:
    junk = json.dumps({"release": {"name": "orient"}, "signature": "x"})
    for topic in (
        "edge/v1/releases/orient/latest",
        "edge/v1/releases/orient/1",
        "edge/v1/releases/orient/2",
        "edge/v1/dock-1/state",
        "edge/v1/fleet/servers/s1",
        "edge/v1/delivery/orient/1/status",
    ):
        assert REFUSED in box_pub(site.broker.port, "dock-2", topic, junk, "-r"), topic
    held = subprocess.run(
        ["mosquitto_sub", "-p", str(site.broker.fleet_port), "-u", "fleet",
         "-P", PASSWORDS["fleet"], "-t", "edge/v1/releases/#", "-t", "edge/v1/dock-1/state",
         "--retained-only", "-W", "1", "-F", "%t %x"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    retained = {
        topic: bytes.fromhex(payload)
        for topic, payload in (line.split(" ") for line in held.stdout.splitlines())
    }
    assert sorted(retained) == [
        "edge/v1/dock-1/state", "edge/v1/releases/orient/1", "edge/v1/releases/orient/latest"
    ]  # fmt: skip
    assert retained["edge/v1/releases/orient/latest"] == retained["edge/v1/releases/orient/1"]
    signed = parse_signed_release(retained["edge/v1/releases/orient/latest"])
    trusted = [load_public_key(site.folder / "fleet.pub")]
    assert verify(signed, trusted, signed.release.created_at, None).version == 1
    assert json.loads(retained["edge/v1/dock-1/state"])["online"] is True


def test_a_box_user_named_as_a_fleet_user_has_a_boxs_rights_only(site: Site) -> None:
    # One ACL file served both listeners, and its `user fleet` lines held on either: a
    # boxes.passwd entry named `fleet` commanded every box, and one named `fleet-serve`
    # wrote every box's delivery topic.
    port = site.broker.port
    for user, topic in (
        ("fleet", "edge/v1/dock-9/cmd"),
        ("fleet-serve", "edge/v1/dock-9/delivery"),
    ):
        said = box_pub(port, user, topic, "{}", password=NAMESAKES[user])
        assert REFUSED in said, (user, said)
        # Logged in as a box, as it is: its own box topics take what it says.
        own = box_pub(port, user, f"edge/v1/{user}/resp", "{}", password=NAMESAKES[user])
        assert own == "", (user, own)


def test_publish_model_says_so_when_its_user_may_not_publish(site: Site) -> None:
    done = fleet_cli(
        site.broker, "publish-model", str(site.folder / "orient" / "model.onnx"),
        "--name", "orient", "--version", "2", "--key", str(site.folder / "fleet.key"),
        "--repo", str(site.folder / "serve-repo"), user="fleet-serve",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    # In the broker's words, and saying where the release is now: it blamed the ACL for a
    # refusal of any kind, and left unsaid that the fleet's repository kept the release.
    assert "the broker refused the release on edge/v1/releases/orient/: " in done.stderr
    assert "Not authorized (reason code 135, user fleet-serve)" in done.stderr
    assert f"the fleet's repository {site.folder / 'serve-repo'} holds orient v2" in done.stderr
    assert "`fleet` in systemd/mosquitto/fleet.acl" in done.stderr
    assert "published" not in done.stdout


def test_a_command_the_broker_refuses_is_said_at_once_not_waited_for(site: Site) -> None:
    # MQTT 5 brokers answer a refused publish in a round trip; the console waited out the
    # whole timeout (600 s for a deploy) and then blamed the boxes: "no answer ... check
    # the agent is running", every member of a group `timeout`.
    started = time.monotonic()
    ping = fleet_cli(site.broker, "cmd", "dock-1", "ping", "--timeout", "120", user="fleet-serve")
    assert ping.returncode == 2, ping.stderr
    assert (
        "the broker refused ping on edge/v1/dock-1/cmd: Not authorized (reason code 135), "
        "user fleet-serve; no device got it"
    ) in ping.stderr
    assert ping.stderr.rstrip().endswith("[broker.refused]"), ping.stderr
    # A user who may watch but not command: the fleet reads, the group command is refused.
    status = fleet_cli(site.broker, "status", "--json", user="fleet-viewer")
    assert status.returncode == 0, status.stderr
    assert "dock-1" in {entry["device"] for entry in json.loads(status.stdout)}
    deploy = fleet_cli(
        site.broker, "deploy", "orient", "1", "--group", GROUP, "--timeout", "120",
        user="fleet-viewer",
    )  # fmt: skip
    assert deploy.returncode == 2, deploy.stderr
    assert "the broker refused deploy_model on edge/v1/group/docks/cmd" in deploy.stderr
    # One who may not even write its console's echo is told so at once, with the fix, not
    # "the broker did not answer" after the whole --wait. What came is shown, and the exit
    # says it may be a part of the fleet.
    unsettled = fleet_cli(site.broker, "status", "--wait", "120", user="fleet-serve")
    assert unsettled.returncode == 124, unsettled.stderr
    assert "the broker refused this console's echo (Not authorized" in unsettled.stderr
    assert "let its user write edge/v1/fleet/console/#" in unsettled.stderr
    assert "states may be missing" in unsettled.stderr
    assert time.monotonic() - started < 60


def test_a_box_using_another_boxs_client_id_does_not_knock_it_off(site: Site) -> None:
    # The id the agent asks for, and the one the broker gives it (its user name).
    for client_id in ("edge-agent-dock-1", "dock-1"):
        intruder = Sub(site.broker.port, "dock-2", ["edge/v1/dock-2/cmd"], client_id=client_id)
        try:
            intruder.wait("received SUBACK")
            site.ping()
        finally:
            intruder.close()
    assert site.agent.service.session.reconnects == 0
    assert not [s for s in site.console.on("state") if not s.json()["online"]]


def _repair_of_chunk_0(site: Site, device: str) -> str:
    """A repair request for the first chunk of the published orient v1, as `device`."""
    published = Repo(site.folder / "repo").get("orient", 1)
    assert published is not None
    return RepairRequest(
        device_id=device, name="orient", version=1, release_id=published.chunks.id,
        block_size=published.chunks.chunk_size, offset=0, count=1,
        bitmap=encode_bits(bitmap(1, [0])),
    ).model_dump_json()  # fmt: skip


def test_serve_answers_a_boxs_repair_on_its_own_topic_and_on_no_boxs_cmd(site: Site) -> None:
    published = Repo(site.folder / "repo").get("orient", 1)
    assert published is not None
    request = _repair_of_chunk_0(site, "dock-2")
    # A repair request is the one message whose reply topic its sender names. Aimed at
    # dock-1's commands, it gets serve's answer refused: its user may not write there.
    said = box_pub(
        site.broker.port, "dock-2", "edge/v1/dock-2/delivery/repair", request,
        "-D", "publish", "response-topic", "edge/v1/dock-1/cmd",
    )  # fmt: skip
    assert REFUSED not in said
    # The box's own reply topic, asked on one connection: two of one box user would share
    # a client id, and the second would knock the first off.
    asked = subprocess.run(
        ["mosquitto_rr", "-p", str(site.broker.port), "-u", "dock-2", "-P", BOXES["dock-2"],
         "-t", "edge/v1/dock-2/delivery/repair", "-e", "edge/v1/dock-2/delivery", "-m", request,
         "-W", "10", "-F", "%x"],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    frame = decode_frame(bytes.fromhex(asked.stdout.strip()))
    assert frame is not None
    assert frame.repair
    assert (frame.release_id, frame.index) == (published.chunks.id, 0)
    # Served in order: had the first answer reached dock-1, it would have come before.
    site.ping()
    assert not [m for m in site.console.on("cmd") if m.payload.startswith(b"EAD1")]
    assert not [m for m in site.console.on("resp") if m.json()["id"] == ""]


def test_a_box_joins_leaves_and_asks_for_repairs_in_its_own_name_only(site: Site) -> None:
    # On the fleet-wide ctl and repair topics, which every box wrote, dock-2 could leave
    # dock-1's broadcasts and spend dock-1's repairs in its name.
    in_dock1s_name = _repair_of_chunk_0(site, "dock-1")
    leave = json.dumps({"kind": "leave", "device_id": "dock-1", "reason": "complete"})
    # The broker refuses dock-1's own topics, and the fleet-wide ones, to dock-2.
    for topic, payload in [
        ("edge/v1/dock-1/delivery/repair", in_dock1s_name),
        ("edge/v1/dock-1/delivery/ctl/orient/1", leave),
        ("edge/v1/delivery/repair", in_dock1s_name),
        ("edge/v1/delivery/orient/1/ctl", leave),
    ]:
        assert REFUSED in box_pub(site.broker.port, "dock-2", topic, payload), topic
    # On its own topics the broker takes them, and serve drops them: nothing reaches
    # dock-1's reply topic. Its own request, sent after, is answered: serve had read them.
    tap = Sub(site.broker.fleet_port, "fleet", ["edge/v1/+/delivery"])
    try:
        tap.wait("received SUBACK")
        for topic, payload in [
            ("edge/v1/dock-2/delivery/repair", in_dock1s_name),
            ("edge/v1/dock-2/delivery/ctl/orient/1", leave),
        ]:
            assert REFUSED not in box_pub(site.broker.port, "dock-2", topic, payload), topic
        own = in_dock1s_name.replace('"dock-1"', '"dock-2"')
        assert REFUSED not in box_pub(
            site.broker.port, "dock-2", "edge/v1/dock-2/delivery/repair", own
        )
        tap.wait("'edge/v1/dock-2/delivery'")
        assert "edge/v1/dock-1/delivery" not in tap.delivered()
    finally:
        tap.close()
    log = (site.folder / "serve.log").read_text()
    assert "fleet_misnamed" in log


def test_a_command_sent_while_the_box_is_away_reaches_it_when_it_is_back(site: Site) -> None:
    # The broker keeps the agent's persistent session under the box's user name, the client
    # id it now has: the command waits there as it did under edge-agent-<device>.
    site.agent.close()
    site.console.wait_state(lambda s: not s["online"])
    command_id = site.console.send("ping")
    assert site.console.session.flush(5.0)
    site.agent = InProcessAgent(site.config)
    assert site.console.final(command_id)["status"] == "ok"
