"""Model delivery end to end on a real mosquitto: edge-fleet publishes, a device pulls.

The reference model text-orientation (6.8 MB, 52 chunks of 128 KiB) goes from
the fleet's repository through the broker into a device's store, verified,
activated behind the health gate, and serves.
"""

from __future__ import annotations

import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from edge_agent.comms.base import Message
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.delivery.pull import pull
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Classification
from edge_agent.infer import infer_frame
from edge_agent.paths import Layout
from edge_agent.protocol.delivery import RepairError, RepairRequest, bitmap, encode_bits
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.store.health import HealthGate
from edge_agent.store.release import SignedRelease, build_release, generate_key, sign
from edge_agent.store.store import ModelStore
from tests.broker import FAST, TOPICS, Fleet, device_session
from tests.conftest import sample


@pytest.mark.parametrize("mqtt_version", ["5", "3.1.1"])
def test_publish_pull_activate_and_serve(fleet: Fleet, tmp_path: Path, mqtt_version: str) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    store = ModelStore(layout)
    stages: list[str] = []
    gate = HealthGate(RuntimeOptions(cache_dir=layout.cache), timeout_s=120.0)
    device = device_session(fleet.broker, mqtt_version)  # type: ignore[arg-type]
    try:
        result = pull(
            device,
            store,
            layout,
            "orient",
            device_id="dev-1",
            trusted_keys=[fleet.key.public_key()],
            activate=True,
            gate=gate,
            progress=lambda stage, fraction: stages.append(stage),
            options=FAST,
        )
    finally:
        device.stop()
    assert result.installed
    assert result.activated
    assert result.stats.stored == fleet.chunks
    assert result.stats.duplicates == 0
    assert stages[0] == "release"
    assert stages[-1] == "done"
    assert not any(layout.transfers.iterdir())  # the store took the partial's files
    served = store.current("orient")
    assert served is not None
    original = fleet.source / fleet.signed.release.model
    assert served.path.read_bytes() == original.read_bytes()
    model = create_backend("openvino").compile(
        served.path, served.manifest, RuntimeOptions(cache_dir=layout.cache)
    )
    try:
        page = np.repeat(sample("page")[:, :, None], 3, axis=2)
        best = infer_frame(model, served.manifest, page)[0]
    finally:
        model.close()
    assert isinstance(best, Classification)
    assert best.label == "0"  # the upright page, as the reference test expects


def test_pull_of_an_installed_version_transfers_nothing(fleet: Fleet, tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    store = ModelStore(layout)
    device = device_session(fleet.broker)
    try:
        first = pull(device, store, layout, "orient", device_id="d", options=FAST)
        again = pull(device, store, layout, "orient", device_id="d", options=FAST)
    finally:
        device.stop()
    assert first.installed
    assert not again.installed
    assert again.stats.frames == 0


def test_a_version_built_on_the_box_does_not_pass_for_the_fleets_release(
    fleet: Fleet, tmp_path: Path
) -> None:
    # `calibrate install_as=orient` installs orient v1 unsigned, from this box's own bytes.
    # The fleet's signed v1 then "deployed" ok with nothing transferred, and the box served
    # its own model under the fleet's name and version.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    store = ModelStore(layout)
    published = fleet.signed.release
    local = tmp_path / "local"
    local.mkdir()
    own = (fleet.source / published.model).read_bytes()
    (local / published.model).write_bytes(own[:-1] + bytes([own[-1] ^ 1]))
    made_here = build_release(
        name="orient",
        version=published.version,
        folder=local,
        files=[published.model],
        model=published.model,
        manifest=published.manifest,
    )
    store.install(SignedRelease(release=made_here), local)
    device = device_session(fleet.broker)
    try:
        with pytest.raises(EdgeAgentError) as err:
            pull(device, store, layout, "orient", device_id="d", options=FAST)
        assert err.value.code == "release.conflict"
        assert "built on this box" in err.value.problem
        assert "publish it as v2 or higher" in str(err.value.fix)
        assert store.release("orient", published.version).release == made_here  # untouched

        # The fleet's own files, re-signed with a fresh expiry, are the same release.
        other = Layout(cache=tmp_path / "cache", state=tmp_path / "other")
        resigned = build_release(
            name="orient",
            version=published.version,
            folder=fleet.source,
            files=[published.model],
            model=published.model,
            manifest=published.manifest,
            lifetime=timedelta(days=3),
        )
        ModelStore(other).install(sign(resigned, fleet.key), fleet.source)
        again = pull(device, ModelStore(other), other, "orient", device_id="d", options=FAST)
    finally:
        device.stop()
    assert (again.installed, again.stats.frames) == (False, 0)


def test_an_old_release_on_latest_does_not_roll_a_box_back(fleet: Fleet, tmp_path: Path) -> None:
    # A version the box held was activated on the same bytes alone: an old signed release
    # replayed on `latest`, or an unsigned copy with its expiry long past, turned "deploy
    # the newest" into a rollback. Here `latest` still holds the fleet's v1.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    store = ModelStore(layout)
    published = fleet.signed.release
    newer = build_release(
        name="orient", version=2, folder=fleet.source, files=[published.model],
        model=published.model, manifest=published.manifest,
    )  # fmt: skip
    store.install(fleet.signed, fleet.source)
    store.install(sign(newer, fleet.key), fleet.source)
    store.activate("orient", 2)
    keys = [fleet.key.public_key()]
    device = device_session(fleet.broker)
    try:
        with pytest.raises(EdgeAgentError) as replayed:
            pull(device, store, layout, "orient", device_id="d", trusted_keys=keys,
                 activate=True, options=FAST)  # fmt: skip
        assert replayed.value.code == "release.rollback"
        assert "older than v2, which serves here" in replayed.value.problem
        assert store.state("orient").current == 2
        # Asked for by its version, it is the operator's choice, and it is taken.
        chosen = pull(device, store, layout, "orient", device_id="d", version=1,
                      trusted_keys=keys, activate=True, options=FAST)  # fmt: skip
        assert chosen.activated
        assert store.state("orient").current == 1
        store.activate("orient", 2)
        forged = SignedRelease(
            release=published.model_copy(update={"expires_at": datetime(2001, 1, 1, tzinfo=UTC)})
        )
        fleet.session.publish(TOPICS.release("orient", 1), forged.to_json(), retain=True)
        assert fleet.session.flush(5.0)
        with pytest.raises(EdgeAgentError) as unsigned:
            pull(device, store, layout, "orient", device_id="d", version=1,
                 trusted_keys=keys, activate=True, options=FAST)  # fmt: skip
        assert unsigned.value.code == "release.signature"
        with pytest.raises(EdgeAgentError) as expired:  # a box that runs unverified
            pull(device, store, layout, "orient", device_id="d", version=1,
                 activate=True, options=FAST)  # fmt: skip
        assert expired.value.code == "release.expired"
    finally:
        device.stop()
    assert store.state("orient").current == 2


def test_untrusted_key_is_refused_before_any_transfer(fleet: Fleet, tmp_path: Path) -> None:
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    device = device_session(fleet.broker)
    try:
        with pytest.raises(EdgeAgentError) as err:
            pull(
                device,
                ModelStore(layout),
                layout,
                "orient",
                device_id="dev-1",
                trusted_keys=[generate_key().public_key()],
                options=FAST,
            )
    finally:
        device.stop()
    assert err.value.code == "release.signature"
    assert not layout.transfers.exists() or not any(layout.transfers.iterdir())


def test_mosquitto_sub_sees_the_retained_release(fleet: Fleet) -> None:
    """A client no one here wrote reads the release where docs/PROTOCOL.md says it is."""
    out = subprocess.run(
        [
            "mosquitto_sub",
            "-p",
            str(fleet.broker.port),
            "-t",
            "edge/v1/releases/orient/latest",
            "-C",
            "1",
            "-W",
            "5",
        ],
        capture_output=True,
        check=True,
        timeout=10,
    )
    signed = SignedRelease.model_validate_json(out.stdout)
    assert signed == fleet.signed


def test_a_pull_outlives_another_box_asking_the_fleet_for_errors_in_its_name(
    fleet: Fleet, tmp_path: Path
) -> None:
    # Another box asks the fleet server, as dev-1 and with a wrong block size, for answers
    # on dev-1's reply topic, with the correlation data pullers used to count from 1: the
    # server's RepairErrors reach dev-1, and used to abort its pull. And it asks for frames
    # on dev-1's cmd topic, which the server used to send there too. Once dev-1 is heard
    # on its own topics, the server drops what comes in its name on the fleet-wide one; the
    # errors a server of an earlier build would still send, the test sends itself.
    rid = ChunkMap(fleet.signed.release).id
    reply, cmd = TOPICS.delivery_reply("dev-1"), TOPICS.device("dev-1", "cmd")
    seen: dict[str, int] = {reply: 0, cmd: 0}
    errors = threading.Event()

    def spied(message: Message) -> None:
        seen[message.topic] += 1
        errors.set()

    spy = device_session(fleet.broker)
    spy.subscribe(reply, spied, qos=0)
    spy.subscribe(cmd, spied, qos=0)
    forger = device_session(fleet.broker)
    stop = threading.Event()

    def ask(block_size: int, topic: str, guess: int) -> None:
        request = RepairRequest(
            device_id="dev-1", name="orient", version=1, release_id=rid,
            block_size=block_size, offset=0, count=1, bitmap=encode_bits(bitmap(1, [0])),
        )  # fmt: skip
        payload = request.model_dump_json().encode()
        forger.publish(TOPICS.repair, payload, qos=0, response_topic=topic,
                       correlation_data=guess.to_bytes(4, "big"))  # fmt: skip
        error = RepairError(release_id=rid, code="input.invalid", message="block_size")
        forger.publish(reply, error.model_dump_json().encode(), qos=0,
                       correlation_data=guess.to_bytes(4, "big"))  # fmt: skip

    def forge() -> None:
        ask(fleet.signed.release.chunk_size, cmd, 1)
        guess = 0
        # 40 a second: an error reaches dev-1 every 25 ms of its pull, and the budget of
        # errors in dev-1's name (256, then 8 a second) lasts 8 s. At 100 a second it ran
        # out in 2.8 s, and when those requests still spent dev-1's repair budget, a pull
        # that a loaded runner sent to repair was starved by them, and failed.
        while not stop.wait(0.025):
            guess = guess % 8 + 1
            ask(1, reply, guess)

    forging = threading.Thread(target=forge, daemon=True)
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    device = device_session(fleet.broker)
    try:
        forging.start()
        assert errors.wait(10.0)  # the forged errors reach dev-1's reply topic
        result = pull(device, ModelStore(layout), layout, "orient", device_id="dev-1",
                      options=FAST)  # fmt: skip
    finally:
        stop.set()
        forging.join()
        for session in (device, forger, spy):
            session.stop()
    assert result.installed
    assert result.stats.stored == fleet.chunks
    assert result.stats.ignored > 0  # errors came during the pull, and were not believed
    assert seen[cmd] == 0
    assert fleet.server.repairs_refused >= 1
    assert fleet.server.misnamed > 0  # the requests in its name while it pulled
