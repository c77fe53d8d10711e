"""The store's guards on a real store with the real text-orientation model:

- the serving version is re-hashed before it is handed out for loading, so bytes that
  changed since activation never compile (a validly signed release says nothing about
  what is on disk now);
- the previous version cannot be removed, so there is always something to roll back to;
- a name's `state.json` that does not read is set aside and rebuilt, keeping the rollback
  guard, so the fleet's commands mend the name without a shell, and a reader mending it
  never undoes an update made meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.catalog.catalog import Catalog, ResolvedModel, default_models_dir
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import file_lock
from edge_agent.paths import Layout
from edge_agent.store import store as store_module
from edge_agent.store.release import generate_key
from edge_agent.store.store import ModelStore
from tests.integration.store_kit import ir_folder, onnx_folder, release_for

Resolve = Callable[[str], ResolvedModel]


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return generate_key()


@pytest.fixture(scope="module")
def orientation(resolve: Resolve) -> ResolvedModel:
    return resolve("text-orientation")


@pytest.fixture(scope="module")
def onnx(tmp_path_factory: pytest.TempPathFactory, orientation: ResolvedModel) -> Path:
    return onnx_folder(orientation, tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def ir(tmp_path_factory: pytest.TempPathFactory, orientation: ResolvedModel) -> Path:
    """The same model as IR: other bytes, so v2 shares no blob with v5 (a shared blob is
    one inode, and damage to v5's file would be damage to v2's too)."""
    return ir_folder(orientation, tmp_path_factory.mktemp("ir"))


@pytest.fixture
def store(
    tmp_path: Path,
    cache_dir: Path,
    onnx: Path,
    ir: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
) -> ModelStore:
    """`hm` v2 (IR) then v5 (ONNX) deployed, signed and trusted: current 5, previous 2."""
    store = ModelStore(Layout(cache=cache_dir, state=tmp_path / "state"))
    for version, folder in ((2, ir), (5, onnx)):
        signed = release_for("hm", version, folder, orientation.manifest, key)
        store.deploy(signed, folder, None, trusted_keys=[key.public_key()])
    assert (store.state("hm").current, store.state("hm").previous) == (5, 2)
    return store


def _model(store: ModelStore, version: int) -> Path:
    path = store.version_dir("hm", version) / "model.onnx"
    path.chmod(0o644)  # the store makes its blobs read-only; a tester or rot does not ask
    return path


def _flipped(store: ModelStore) -> None:
    path = _model(store, 5)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _flipped_keeping_mtime(store: ModelStore) -> None:
    """The same size, the same inode and the same mtime: only the bytes say it changed."""
    path = _model(store, 5)
    before = path.stat()
    with path.open("r+b") as fh:
        fh.seek(before.st_size // 3)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x80]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino, after.st_mtime_ns) == (
        before.st_size,
        before.st_ino,
        before.st_mtime_ns,
    )


def _truncated(store: ModelStore) -> None:
    path = _model(store, 5)
    path.write_bytes(path.read_bytes()[:-1000])


def _stray_external_data(store: ModelStore) -> None:
    # ONNX Runtime and OpenVINO read an ONNX model's external weights from beside it:
    # an unsigned file there is bytes that would load.
    (store.version_dir("hm", 5) / "model.onnx.data").write_bytes(b"\0" * 64)


@pytest.mark.parametrize(
    "damage",
    [_flipped, _flipped_keeping_mtime, _truncated, _stray_external_data],
    ids=lambda f: f.__name__.strip("_"),
)
def test_a_damaged_current_version_is_refused_before_it_loads(
    store: ModelStore, cache_dir: Path, ir: Path, damage: Callable[..., None]
) -> None:
    catalog = Catalog(default_models_dir(), cache_dir, store=store, allow_paths=False)
    assert catalog.resolve("hm").path == store.version_dir("hm", 5) / "model.onnx"
    damage(store)  # after a good load: nothing remembered from it may excuse the change
    with pytest.raises(EdgeAgentError) as info:
        catalog.resolve("hm")  # what start_pipeline does with model `hm`
    assert info.value.code == "store.corrupt"
    assert "hm v5" in info.value.problem
    assert "rollback" in info.value.fix
    with pytest.raises(EdgeAgentError):
        store.current("hm")
    # The pointer did not move, and the operator's way out works: v2 is intact and serves.
    assert store.state("hm").current == 5
    assert store.rollback("hm") == 2
    resolved = catalog.resolve("hm")
    assert resolved.path == store.version_dir("hm", 2) / "model.xml"
    assert resolved.path.read_bytes() == (ir / "model.xml").read_bytes()


def test_the_previous_version_cannot_be_removed_so_rollback_still_works(
    store: ModelStore, onnx: Path, orientation: ResolvedModel, key: Ed25519PrivateKey
) -> None:
    with pytest.raises(EdgeAgentError) as info:
        store.remove("hm", 2)
    assert info.value.code == "input.invalid"
    assert "previous" in info.value.problem
    assert store.versions("hm") == [2, 5]
    assert store.state("hm").previous == 2
    assert store.rollback("hm") == 2
    # Rolled back, v5 is now the previous one, and as untouchable.
    with pytest.raises(EdgeAgentError) as info:
        store.remove("hm", 5)
    assert info.value.code == "input.invalid"
    # A version that is neither current nor previous still goes.
    store.activate("hm", 5)
    v6 = release_for("hm", 6, onnx, orientation.manifest, key)
    store.deploy(v6, onnx, None, trusted_keys=[key.public_key()])
    assert (store.state("hm").current, store.state("hm").previous) == (6, 5)
    store.remove("hm", 2)
    assert store.versions("hm") == [5, 6]
    assert store.rollback("hm") == 5
    assert store.verify() == []


def test_an_unreadable_state_is_set_aside_and_an_activation_mends_the_name(
    store: ModelStore,
    ir: Path,
    orientation: ResolvedModel,
    key: Ed25519PrivateKey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A power cut on a card that lies about fsync: 0 bytes. Every command on `hm` and
    # every listing answered store.corrupt, and only a shell could mend it.
    folder = store.root / "models" / "hm"
    (folder / "state.json").write_bytes(b"")
    caplog.set_level(logging.ERROR, logger="edge_agent.store.store")

    listed = {(e.version, e.current, e.previous) for e in store.entries()}
    assert listed == {(2, False, False), (5, False, False)}, "listed, with nothing serving"
    store.activate("hm", 2)  # what the fleet's activate_model does
    state = store.state("hm")
    assert (state.current, state.previous, state.highest) == (2, None, 5)
    # The rollback guard came back from the installed versions: v4 is still refused.
    v4 = release_for("hm", 4, ir, orientation.manifest, key)
    with pytest.raises(EdgeAgentError) as info:
        store.install(v4, ir, trusted_keys=[key.public_key()])
    assert info.value.code == "release.rollback"
    # The damaged file is kept for a look, and said once, at ERROR, with the way out.
    [aside] = folder.glob("state.json.damaged-*")
    assert aside.read_bytes() == b""
    said = [r for r in caplog.records if r.getMessage() == "store_state_damaged"]
    assert len(said) == 1
    assert said[0].levelno == logging.ERROR
    assert "activate" in said[0].fields["fix"]  # type: ignore[attr-defined]
    assert store.verify() == []


def test_a_state_a_newer_agent_wrote_is_read_not_set_aside(store: ModelStore) -> None:
    path = store.root / "models" / "hm" / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pinned": [2]}))
    assert (store.state("hm").current, store.state("hm").previous) == (5, 2)
    assert not list(path.parent.glob("state.json.damaged-*"))


def test_a_reader_mending_a_state_never_undoes_an_activation_made_meanwhile(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader holds no update lock. Its mend checked that the file still held the bytes
    # that did not read, then renamed it aside: an activation that wrote current=2 in
    # between was set aside, and the rebuilt state (no current version) written over it.
    # The reader is held here between its check and its rename.
    path = store.root / "models" / "hm" / "state.json"
    path.write_bytes(b"")
    at_rename, go_on, asked_again = threading.Event(), threading.Event(), threading.Event()
    real_rename = Path.rename

    def held_rename(self: Path, target: Path) -> Path:
        if threading.current_thread().name == "reader" and self == path:
            at_rename.set()
            assert go_on.wait(30), "the test never let the reader go on"
        return real_rename(self, target)

    @contextmanager
    def watched_lock(lock: Path, timeout_s: float) -> Iterator[None]:
        # The activation asks for a lock besides the update lock: with the reader holding
        # it, it waits there, and the reader may go on.
        if threading.current_thread().name == "activation" and lock.name != ".lock":
            asked_again.set()
        with file_lock(lock, timeout_s):
            yield

    monkeypatch.setattr(Path, "rename", held_rename)
    monkeypatch.setattr(store_module, "file_lock", watched_lock)
    reader = threading.Thread(target=lambda: store.state("hm"), name="reader")
    activation = threading.Thread(target=lambda: store.activate("hm", 2), name="activation")
    reader.start()
    try:
        assert at_rename.wait(30)
        activation.start()
        # Either it ran to its end (no lock kept it from the file the reader had checked),
        # or it waits for the reader.
        while activation.is_alive() and not asked_again.wait(0.01):
            pass
    finally:
        go_on.set()
        reader.join(30)
        if activation.ident is not None:
            activation.join(30)
    assert not reader.is_alive()
    assert not activation.is_alive()
    assert json.loads(path.read_bytes())["current"] == 2
    assert (store.state("hm").current, store.state("hm").previous) == (2, None)
    assert [p.read_bytes() for p in path.parent.glob("state.json.damaged-*")] == [b""]
