"""The model store on real files with a real model: install, gate, activate, roll back,
and every rejection leaving the old version serving and nothing behind."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.catalog.catalog import Catalog, ResolvedModel, default_models_dir
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Classification
from edge_agent.infer import infer_frame
from edge_agent.paths import Layout
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.store.health import HealthGate, HealthGateError, HealthReport, ProbeRequest, check
from edge_agent.store.release import SignedRelease, generate_key
from edge_agent.store.store import ModelStore
from tests.integration.store_kit import ir_folder, nan_folder, onnx_folder, release_for, resign

Resolve = Callable[[str], ResolvedModel]
GATE = HealthGate(RuntimeOptions(device="CPU"))


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return generate_key()


@pytest.fixture(scope="module")
def orientation(resolve: Resolve) -> ResolvedModel:
    return resolve("text-orientation")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, orientation: ResolvedModel) -> Path:
    """onnx/ (v1 bytes), ir/ (other bytes of the same model), nan/ (compiles, outputs NaN)."""
    root = tmp_path_factory.mktemp("models")
    onnx_folder(orientation, root / "onnx")
    ir_folder(orientation, root / "ir")
    nan_folder(root / "nan")
    return root


@pytest.fixture
def store(tmp_path: Path, cache_dir: Path) -> ModelStore:
    return ModelStore(Layout(cache=cache_dir, state=tmp_path / "state"))


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    cache_dir: Path,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
) -> Path:
    """A store with `orient` v2 (ONNX) current, deployed once through the real health gate."""
    state = tmp_path_factory.mktemp("served") / "state"
    store = ModelStore(Layout(cache=cache_dir, state=state))
    signed = release_for("orient", 2, models / "onnx", orientation.manifest, key)
    store.deploy(signed, models / "onnx", GATE, trusted_keys=[key.public_key()])
    return store.root


@pytest.fixture
def serving(store: ModelStore, served: Path) -> ModelStore:
    """`orient` v2 (ONNX) current: a copy of `served`, as the gate costs 0.6 s a deploy.

    `cp -a` keeps the hard links between the version folder and its blobs, the modes of the
    read-only blobs and the times, so the copy is the store the deploy left."""
    store.root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(served), str(store.root)], check=True)
    return store


def _snapshot(store: ModelStore) -> tuple[object, ...]:
    blobs = sorted(p.name for p in (store.root / "blobs").iterdir())
    tmp = sorted(p.name for p in (store.root / "tmp").iterdir())
    return (store.names(), store.versions("orient"), store.state("orient"), blobs, tmp)


def _first_inference(store: ModelStore, frame: npt.NDArray[np.uint8]) -> str:
    """Resolve `orient` through the catalog (store first), compile it, classify a frame."""
    catalog = Catalog(default_models_dir(), store.root.parent, store=store)
    resolved = catalog.resolve("orient")
    assert resolved.path.is_relative_to(store.root)
    model = create_backend("openvino").compile(resolved.path, resolved.manifest, RuntimeOptions())
    with model:
        best = infer_frame(model, resolved.manifest, frame)[0]
    assert isinstance(best, Classification)
    return best.label


def test_deploy_serves_through_the_catalog_and_beats_the_reference_name(
    serving: ModelStore, astronaut: npt.NDArray[np.uint8], orientation: ResolvedModel
) -> None:
    assert serving.state("orient").current == 2
    assert serving.verify() == []
    assert _first_inference(serving, astronaut) == "0"
    assert _first_inference(serving, np.ascontiguousarray(np.rot90(astronaut, 2))) == "180"
    # The same name as a reference model: the store's version wins.
    current = serving.current("orient")
    assert current is not None
    assert current.manifest.source is None
    assert current.path.read_bytes() == orientation.path.read_bytes()


def test_second_version_activates_rolls_back_and_keeps_current_and_previous(
    serving: ModelStore, models: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    trusted = [key.public_key()]
    for version in (3, 4, 5):
        folder = models / ("ir" if version % 2 else "onnx")
        signed = release_for("orient", version, folder, orientation.manifest, key)
        serving.deploy(signed, folder, GATE, trusted_keys=trusted)
    state = serving.state("orient")
    assert (state.current, state.previous, state.highest) == (5, 4, 5)
    assert serving.versions("orient") == [3, 4, 5]  # keep=3: v2 evicted, never 4 or 5
    current = serving.current("orient")
    assert current is not None
    assert current.path.name == "model.xml"
    assert (current.path.parent / "model.bin").is_file()  # an IR finds its weights beside it
    assert serving.rollback("orient") == 4
    assert serving.state("orient").previous == 5  # rolling back twice undoes it
    assert serving.rollback("orient") == 5
    with pytest.raises(EdgeAgentError) as info:
        serving.remove("orient", 5)
    assert info.value.code == "input.invalid"
    serving.remove("orient", 3)
    assert serving.versions("orient") == [4, 5]
    # v3's IR blobs are shared with v5, so they stay; nothing unreferenced does.
    assert all(b.stat().st_nlink > 1 for b in (serving.root / "blobs").iterdir())
    assert serving.verify() == []


def _truncated(folder: Path) -> None:
    path = folder / "model.onnx"
    path.write_bytes(path.read_bytes()[:-1000])


def _extended(folder: Path) -> None:
    with (folder / "model.onnx").open("ab") as fh:
        fh.write(b"\0" * 10)


def _flipped(folder: Path) -> None:
    path = folder / "model.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_flipped, _truncated, _extended], ids=lambda f: f.__name__)
def test_bytes_that_differ_from_the_release_are_refused(
    serving: ModelStore,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    tmp_path: Path,
    damage: Callable[[Path], None],
) -> None:
    onnx = onnx_folder(orientation, tmp_path / "bad")
    signed = release_for("orient", 3, onnx, orientation.manifest, key)
    damage(onnx)
    before = _snapshot(serving)
    with pytest.raises(EdgeAgentError) as info:
        serving.deploy(signed, onnx, GATE, trusted_keys=[key.public_key()])
    assert info.value.code == "transfer.digest"
    assert _snapshot(serving) == before
    assert serving.verify() == []


def _expired(signed: SignedRelease, key: Ed25519PrivateKey) -> SignedRelease:
    past = datetime.now(UTC) - timedelta(days=2)
    return resign(signed.release, key, created_at=past, expires_at=past + timedelta(days=1))


REJECTIONS: dict[str, tuple[Callable[[SignedRelease, Ed25519PrivateKey], SignedRelease], str]] = {
    "missing-signature": (lambda s, k: SignedRelease(release=s.release), "release.signature"),
    "untrusted-key": (lambda s, k: resign(s.release, generate_key()), "release.signature"),
    "altered-after-signing": (
        lambda s, k: SignedRelease(
            release=s.release.model_copy(update={"latency_budget_ms": 1e6}),
            signature=s.signature,
        ),
        "release.signature",
    ),
    "expired": (_expired, "release.expired"),
    "older-version": (lambda s, k: resign(s.release, k, version=1), "release.rollback"),
    "same-version": (lambda s, k: resign(s.release, k, version=2), "release.rollback"),
    "traversal-name": (lambda s, k: resign(s.release, k, name="../orient"), "store.path"),
    "traversal-path": (
        lambda s, k: resign(
            s.release,
            k,
            model="../../model.onnx",
            files=[s.release.files[0].model_copy(update={"path": "../../model.onnx"})],
        ),
        "store.path",
    ),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_bad_releases_are_refused_with_their_code_and_leave_nothing(
    serving: ModelStore,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    astronaut: npt.NDArray[np.uint8],
    case: str,
) -> None:
    make, code = REJECTIONS[case]
    good = release_for("orient", 3, models / "ir", orientation.manifest, key)
    before = _snapshot(serving)
    with pytest.raises(EdgeAgentError) as info:
        serving.deploy(make(good, key), models / "ir", GATE, trusted_keys=[key.public_key()])
    assert info.value.code == code
    assert _snapshot(serving) == before
    assert not (serving.root / "orient").exists()
    assert _first_inference(serving, astronaut) == "0"


def test_garbage_that_is_validly_signed_fails_the_gate_and_is_removed(
    serving: ModelStore,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    tmp_path: Path,
    astronaut: npt.NDArray[np.uint8],
) -> None:
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(np.random.default_rng(9).bytes(300_000))
    signed = release_for("orient", 3, folder, orientation.manifest, key)
    before = _snapshot(serving)
    with pytest.raises(EdgeAgentError) as info:
        serving.deploy(signed, folder, GATE, trusted_keys=[key.public_key()])
    assert info.value.code == "health.failed"
    assert "does not compile" in info.value.problem
    after = _snapshot(serving)
    assert after[:2] == before[:2]  # names, versions
    assert after[3:] == before[3:]  # blobs, tmp
    assert serving.state("orient").highest == 3  # v3 stays burnt: a fix is v4
    assert _first_inference(serving, astronaut) == "0"


def test_model_with_nan_outputs_fails_the_gate(
    serving: ModelStore,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    astronaut: npt.NDArray[np.uint8],
) -> None:
    signed = release_for("orient", 3, models / "nan", orientation.manifest, key)
    with pytest.raises(EdgeAgentError) as info:
        serving.deploy(signed, models / "nan", GATE, trusted_keys=[key.public_key()])
    assert info.value.code == "health.failed"
    assert "non-finite" in info.value.problem
    assert serving.versions("orient") == [2]
    assert serving.state("orient").current == 2
    assert _first_inference(serving, astronaut) == "0"


def test_a_planned_priority_list_passes_on_any_of_its_devices_and_no_other(
    models: Path, orientation: ResolvedModel, cache_dir: Path
) -> None:
    # The agent plans a version on each device list its pipelines ask for: one asking for
    # GPU,CPU runs on this box's CPU (there is no GPU), and so may the new version. Read
    # as one device name, "GPU,CPU" was never among those executing, and every version
    # failed the gate on such a box.
    def gated(planned: str | None, any_device: bool = False) -> HealthReport:
        request = ProbeRequest(
            model=models / "onnx" / "model.onnx",
            manifest=orientation.manifest,
            options=RuntimeOptions(device="GPU,CPU", cache_dir=cache_dir),
            backend="openvino",
            planned_device=planned,
            any_device=any_device,
            latency_budget_ms=None,
            runs=1,
        )
        return check(request)

    assert gated("GPU,CPU").ok, gated("GPU,CPU").reason
    refused = gated("GPU")
    assert not refused.ok
    assert refused.reason == "runs on CPU, planned GPU"
    # Nothing planned: the fallback from the missing GPU fails it, unless any device will
    # do (the agent's gate when no version serves its pipelines to compare with).
    assert not gated(None).ok
    assert gated(None, any_device=True).ok


def test_latency_budget_is_enforced(
    serving: ModelStore, models: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    signed = release_for(
        "orient", 3, models / "ir", orientation.manifest, key, latency_budget_ms=1e-4
    )
    with pytest.raises(HealthGateError) as info:
        serving.deploy(signed, models / "ir", GATE, trusted_keys=[key.public_key()])
    assert info.value.code == "health.failed"
    assert "over the budget" in info.value.problem
    # The release that failed, for the agent's model_health_failed event: a deploy of
    # `latest` knows the version only once it is resolved.
    assert (info.value.name, info.value.version) == ("orient", 3)


def test_a_stuck_gate_is_killed_and_does_not_block_the_next_deployment(
    serving: ModelStore, models: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    stuck = HealthGate(RuntimeOptions(device="CPU"), timeout_s=0.05)
    v3 = release_for("orient", 3, models / "ir", orientation.manifest, key)
    with pytest.raises(EdgeAgentError) as info:
        serving.deploy(v3, models / "ir", stuck, trusted_keys=[key.public_key()])
    assert info.value.code == "health.failed"
    assert "no verdict" in info.value.problem
    v4 = release_for("orient", 4, models / "ir", orientation.manifest, key)
    serving.deploy(v4, models / "ir", GATE, trusted_keys=[key.public_key()])
    assert serving.state("orient").current == 4


def test_updates_wait_for_the_lock_and_a_dead_holder_frees_it(
    store: ModelStore, tmp_path: Path
) -> None:
    store.root.mkdir(parents=True)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(store.root / ".lock"),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"locked"
        impatient = ModelStore(Layout(cache=tmp_path, state=store.root.parent), lock_timeout_s=0.2)
        with pytest.raises(EdgeAgentError) as info:
            impatient.rollback("orient")
        assert info.value.code == "command.busy"
    finally:
        os.kill(holder.pid, 9)
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with pytest.raises(EdgeAgentError) as info:
        impatient.rollback("orient")
    assert info.value.code == "store.not_found"  # got the lock; there is just nothing to do


def test_quota_refuses_what_cannot_fit_beside_current_and_previous(
    tmp_path: Path,
    cache_dir: Path,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
) -> None:
    size = orientation.path.stat().st_size
    store = ModelStore(Layout(cache=cache_dir, state=tmp_path / "s"), quota_bytes=size * 3 // 2)
    trusted = [key.public_key()]
    store.deploy(release_for("orient", 1, models / "onnx", orientation.manifest, key),
                 models / "onnx", None, trusted_keys=trusted)  # fmt: skip
    before = _snapshot(store)
    v2 = release_for("orient", 2, models / "ir", orientation.manifest, key)
    with pytest.raises(EdgeAgentError) as info:
        store.install(v2, models / "ir", trusted_keys=trusted)
    assert info.value.code == "store.quota"
    assert _snapshot(store) == before


def test_verify_finds_damaged_bytes_and_activation_refuses_them(
    serving: ModelStore, models: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    v3 = release_for("orient", 3, models / "ir", orientation.manifest, key)
    serving.install(v3, models / "ir", trusted_keys=[key.public_key()])
    weights = serving.version_dir("orient", 3) / "model.bin"
    weights.chmod(0o644)
    with weights.open("r+b") as fh:
        fh.seek(100)
        fh.write(b"rot")
    (serving.version_dir("orient", 3) / "stray.txt").write_text("?")
    problems = [str(p) for p in serving.verify()]
    assert len(problems) == 2
    assert any("model.bin" in p and "sha256" in p for p in problems)
    assert any("stray.txt" in p for p in problems)
    with pytest.raises(EdgeAgentError) as info:
        serving.activate("orient", 3, GATE)
    assert info.value.code == "store.corrupt"
    assert serving.state("orient").current == 2


def test_a_rotted_blob_is_replaced_for_the_next_version_of_its_bytes(
    serving: ModelStore, models: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    # The next version of the same bytes was linked to the blob already there, unhashed:
    # it served the rot too, and the error's own advice, "publish and deploy a higher
    # version", could never work.
    weights = serving.version_dir("orient", 2) / "model.onnx"
    weights.chmod(0o644)
    with weights.open("r+b") as fh:
        fh.seek(100)
        fh.write(b"rot")
    v3 = release_for("orient", 3, models / "onnx", orientation.manifest, key)
    serving.install(v3, models / "onnx", trusted_keys=[key.public_key()])
    fresh = serving.version_dir("orient", 3) / "model.onnx"
    assert fresh.read_bytes() == (models / "onnx" / "model.onnx").read_bytes()
    assert fresh.stat().st_ino != weights.stat().st_ino
    serving.activate("orient", 3, GATE)
    assert serving.state("orient").current == 3
    # v2 keeps its own damaged copy, and says so.
    problems = [str(p) for p in serving.verify()]
    assert len(problems) == 1
    assert "v2" in problems[0] or "/2/" in problems[0]
    assert "sha256" in problems[0]


def test_link_takes_a_finished_transfer_without_copying(
    serving: ModelStore, orientation: ResolvedModel, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    folder = ir_folder(orientation, tmp_path / "transfer")
    inode = (folder / "model.bin").stat().st_ino
    signed = release_for("orient", 3, folder, orientation.manifest, key)
    serving.install(signed, folder, trusted_keys=[key.public_key()], link=True)
    assert (folder / "model.bin").stat().st_ino == inode  # the transfer is its owner's
    assert (serving.version_dir("orient", 3) / "model.bin").stat().st_ino == inode
    assert serving.installed("orient", 3) == signed.release
    assert serving.verify() == []


def test_what_a_newer_edge_agent_left_in_the_store_stops_no_other_name(
    serving: ModelStore,
    models: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # After a downgrade: a state.json with a field this version lacks made `orient`
    # unreadable, and every install and activation of any other name then failed at its
    # eviction, after it had taken effect (answered store.corrupt for a change made).
    state = serving.root / "models" / "orient" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "pinned": [2]}))
    caplog.set_level(logging.WARNING, logger="edge_agent.store.store")
    trusted = [key.public_key()]
    for version in (1, 2, 3, 4):  # past keep=3: an eviction runs for each
        signed = release_for("other", version, models / "onnx", orientation.manifest, key)
        serving.deploy(signed, models / "onnx", None, trusted_keys=trusted)
    assert serving.state("other").current == 4
    assert serving.state("orient").current == 2  # read for what this version knows
    said = [r for r in caplog.records if r.getMessage() == "store_state_fields_dropped"]
    assert len(said) == 1, "said once, not at every read"
    # A version a newer edge-agent installed says so, rather than that it is damaged.
    stored = serving.version_dir("orient", 2) / "release.json"
    data = json.loads(stored.read_text())
    data["release"]["new_field"] = 1
    stored.chmod(0o644)
    stored.write_text(json.dumps(data))
    with pytest.raises(EdgeAgentError) as info:
        serving.release("orient", 2)
    assert info.value.code == "release.unsupported"
    assert "new_field" in info.value.problem
    # Its name's state is still known, and the next name's update still goes through.
    signed = release_for("other", 5, models / "onnx", orientation.manifest, key)
    serving.deploy(signed, models / "onnx", None, trusted_keys=trusted)
    assert serving.state("other").current == 5
