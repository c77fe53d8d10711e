"""Signed releases: canonical bytes, Ed25519, freeze and rollback guards, path safety."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import Manifest, QuantizationInfo, load_manifest
from edge_agent.delivery.chunks import release_id
from edge_agent.errors import EdgeAgentError
from edge_agent.store.release import (
    MAX_CHUNK,
    MIN_CHUNK,
    Release,
    SignedRelease,
    build_release,
    canonical_bytes,
    chunk_count,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    parse_signed_release,
    same_content,
    save_private_key,
    save_public_key,
    sign,
    verify,
    weights_precision,
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return load_manifest(default_models_dir() / "text-orientation.toml")


def _orient(
    folder: Path, manifest: Manifest, version: int, chunk_size: int, now: datetime
) -> Release:
    """Release `orient` of the one file model.onnx in `folder`."""
    return build_release(
        name="orient",
        version=version,
        folder=folder,
        files=["model.onnx"],
        model="model.onnx",
        manifest=manifest,
        chunk_size=chunk_size,
        now=now,
    )


@pytest.fixture
def release(tmp_path: Path, manifest: Manifest) -> Release:
    # 200 KiB + 1 byte: three full chunks of 64 KiB and a 1-byte tail.
    (tmp_path / "model.onnx").write_bytes(bytes(range(256)) * 800 + b"!")
    return _orient(tmp_path, manifest, 3, MIN_CHUNK, NOW)


def _tampered(release: Release, key: object, **changes: object) -> SignedRelease:
    signed = sign(release, key)  # type: ignore[arg-type]
    data = {**signed.release.model_dump(), **changes}
    return SignedRelease(release=Release.model_validate(data), signature=signed.signature)


def _code(call: object) -> str:
    with pytest.raises(EdgeAgentError) as info:
        call()  # type: ignore[operator]
    return info.value.code


def test_build_hashes_every_chunk_and_renames_the_manifest(release: Release) -> None:
    entry = release.files[0]
    assert entry.size == 256 * 800 + 1
    assert len(entry.chunks) == chunk_count(entry.size, MIN_CHUNK) == 4
    assert len(set(entry.chunks)) == 2  # three identical full chunks, one tail
    assert release.manifest.name == "orient"
    assert release.manifest.source is None
    assert release.expires_at - release.created_at == timedelta(days=30)


def test_signed_release_round_trips_through_json_and_verifies(release: Release) -> None:
    key = generate_key()
    signed = sign(release, key)
    assert signed.release.key_id == key_id(key.public_key())
    again = parse_signed_release(signed.to_json())
    assert canonical_bytes(again.release) == canonical_bytes(signed.release)
    assert verify(again, [key.public_key()], NOW, installed_version=2) == signed.release


def test_canonical_bytes_are_sorted_compact_json(release: Release) -> None:
    raw = canonical_bytes(release)
    assert b" " not in raw.split(b'"description"')[0]
    assert list(json.loads(raw)) == sorted(json.loads(raw))


def test_the_same_files_published_in_other_chunks_or_from_a_mirror_are_the_same_release(
    tmp_path: Path, release: Release, manifest: Manifest
) -> None:
    # same_content compared each file's chunk hashes and URL: the same model bytes
    # published again with another --chunk-kib, or from a mirror, were refused as
    # release.conflict "(other files)" on a box that held them.
    again = _orient(tmp_path, manifest, 3, MAX_CHUNK, NOW + timedelta(days=1))
    mirrored = [again.files[0].model_copy(update={"url": "https://mirror.example/m.onnx"})]
    again = again.model_copy(update={"files": mirrored})
    assert again.files[0].chunks != release.files[0].chunks
    assert same_content(release, again)
    # Other bytes, or the same bytes under another path or loaded as another model, are not.
    other = release.files[0].model_copy(update={"sha256": "0" * 64})
    moved = release.files[0].model_copy(update={"path": "other.onnx"})
    assert not same_content(release, release.model_copy(update={"files": [other]}))
    assert not same_content(release, release.model_copy(update={"files": [moved]}))
    assert not same_content(release, release.model_copy(update={"version": 4}))


@pytest.mark.parametrize(
    "changes",
    [{"version": 4}, {"expires_at": NOW + timedelta(days=3650)}, {"latency_budget_ms": 1e9}],
    ids=["version", "expiry", "budget"],
)
def test_any_change_after_signing_breaks_the_signature(
    release: Release, changes: dict[str, object]
) -> None:
    key = generate_key()
    signed = _tampered(release, key, **changes)
    assert _code(lambda: verify(signed, [key.public_key()], NOW, None)) == "release.signature"


def test_unsigned_unknown_key_and_garbage_signature_are_refused(release: Release) -> None:
    fleet, other = generate_key(), generate_key()
    trusted = [fleet.public_key()]
    unsigned = SignedRelease(release=release)
    assert _code(lambda: verify(unsigned, trusted, NOW, None)) == "release.signature"
    by_other = sign(release, other)
    assert _code(lambda: verify(by_other, trusted, NOW, None)) == "release.signature"
    garbage = SignedRelease(release=sign(release, fleet).release, signature="not base64!")
    assert _code(lambda: verify(garbage, trusted, NOW, None)) == "release.signature"


def test_expired_release_is_refused_freeze_attack(release: Release) -> None:
    key = generate_key()
    signed = sign(release, key)
    later = release.expires_at + timedelta(seconds=1)
    assert _code(lambda: verify(signed, [key.public_key()], later, None)) == "release.expired"


def test_a_box_whose_clock_is_not_set_still_refuses_a_long_expired_release(
    tmp_path: Path, manifest: Manifest, release: Release
) -> None:
    # Booted in 1970, before NTP: every expiry lay in the future, so an old, expired
    # release signed by the fleet could be replayed to a fresh box and taken.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "model.onnx").write_bytes(b"old model")
    old = _orient(tmp_path / "old", manifest, 1, MIN_CHUNK, datetime(2023, 3, 1, tzinfo=UTC))
    key = generate_key()
    in_1970 = datetime(1970, 1, 1, 0, 1, tzinfo=UTC)
    stale = sign(old, key)
    assert _code(lambda: verify(stale, [key.public_key()], in_1970, None)) == "release.expired"
    # One that is valid now is taken, whatever the clock reads.
    assert verify(sign(release, key), [key.public_key()], in_1970, None).version == 3


@pytest.mark.parametrize("installed", [3, 7])
def test_same_or_older_version_is_refused_rollback_attack(release: Release, installed: int) -> None:
    key = generate_key()
    signed = sign(release, key)
    code = _code(lambda: verify(signed, [key.public_key()], NOW, installed))
    assert code == "release.rollback"


def test_no_trusted_keys_runs_unverified_and_says_so(
    release: Release, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert verify(SignedRelease(release=release), [], NOW, None).version == 3
    assert "release_unverified" in caplog.text
    # The freeze and rollback guards still hold without keys.
    late = NOW + timedelta(days=31)
    assert (
        _code(lambda: verify(SignedRelease(release=release), [], late, None)) == "release.expired"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "../evil"),
        ("name", "a/b"),
        ("name", ".."),
        ("path", "../model.onnx"),
        ("path", "/etc/passwd"),
        ("path", "sub/../../x"),
        ("path", "a\\..\\b"),
        ("path", ""),
        # Not escapes, but each installed a version that could never serve (`.` and empty
        # parts fell out of the check, not out of the store's folder), or wrote through a
        # blob shared with another version (release.json, the store's own record).
        ("path", "./model.onnx"),
        ("path", "sub//model.onnx"),
        ("path", "sub/"),
        ("path", "release.json"),
    ],
)
def test_names_and_paths_that_escape_are_refused(release: Release, field: str, value: str) -> None:
    key = generate_key()
    if field == "name":
        changed = release.model_copy(update={"name": value})
    else:
        entry = release.files[0].model_copy(update={"path": value})
        changed = release.model_copy(update={"files": [entry], "model": value})
    signed = sign(changed, key)
    assert _code(lambda: verify(signed, [key.public_key()], NOW, None)) == "store.path"


def test_inconsistent_releases_are_invalid(release: Release) -> None:
    key = generate_key()
    trusted = [key.public_key()]
    missing_model = sign(release.model_copy(update={"model": "other.onnx"}), key)
    assert _code(lambda: verify(missing_model, trusted, NOW, None)) == "release.invalid"
    entry = release.files[0].model_copy(update={"chunks": release.files[0].chunks[:-1]})
    short = sign(release.model_copy(update={"files": [entry]}), key)
    assert _code(lambda: verify(short, trusted, NOW, None)) == "release.invalid"


@pytest.mark.parametrize("chunk", [MIN_CHUNK - 1, MAX_CHUNK + 1])
def test_chunk_size_outside_64_to_128_kib_does_not_parse(release: Release, chunk: int) -> None:
    data = SignedRelease(release=release).model_dump(mode="json")
    data["release"]["chunk_size"] = chunk
    assert _code(lambda: parse_signed_release(json.dumps(data))) == "release.invalid"


def test_fields_a_newer_edge_fleet_wrote_are_refused_as_unsupported_and_named(
    release: Release,
) -> None:
    # A fleet is never on one version: an older box told to upgrade, not to fix the release.
    data = SignedRelease(release=release).model_dump(mode="json")
    data["release"]["trust_me"] = True
    data["release"]["manifest"]["new_head_option"] = 1
    with pytest.raises(EdgeAgentError) as info:
        parse_signed_release(json.dumps(data))
    assert info.value.code == "release.unsupported"
    assert "release.trust_me" in info.value.problem
    assert "release.manifest.new_head_option" in info.value.problem
    assert "upgrade edge-agent" in info.value.fix
    data["release"]["schema_version"] = 2
    assert _code(lambda: parse_signed_release(json.dumps(data))) == "release.unsupported"
    # With anything else wrong too, it is invalid: a newer edge-fleet would not write that.
    data["release"]["version"] = 0
    assert _code(lambda: parse_signed_release(json.dumps(data))) == "release.invalid"


def _signed_without(release: Release, key: object, field: str) -> bytes:
    """The JSON an edge-fleet of before `field` existed publishes: signed without it."""
    raw = sign(release, key).release.model_dump(mode="json")  # type: ignore[arg-type]
    del raw[field]
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    signature = key.sign(canonical.encode())  # type: ignore[attr-defined]
    return json.dumps({"release": raw, "signature": base64.b64encode(signature).decode()}).encode()


def test_a_release_signed_before_a_field_existed_verifies_and_keeps_its_id(
    release: Release,
) -> None:
    # A box parses it with the field's default filled in; checked over that
    # re-serialisation, every release retained from before an upgrade read as forged, and
    # the box and an older fleet server named one release by two ids.
    key = generate_key()
    received = _signed_without(release, key, "latency_budget_ms")
    signed = parse_signed_release(received)
    assert signed.release.latency_budget_ms is None
    assert verify(signed, [key.public_key()], NOW, None) == signed.release
    raw = json.loads(received)["release"]
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert release_id(signed.release) == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert signed.to_json() == received  # what the store and the fleet's repository keep


def test_a_key_given_twice_means_the_same_to_the_signature_and_the_box(release: Release) -> None:
    key = generate_key()
    text = sign(release, key).to_json().decode()
    doubled = text.replace('"version": 3,', '"version": 3, "version": 9,', 1)
    assert doubled != text
    signed = parse_signed_release(doubled)
    assert signed.release.version == json.loads(doubled)["release"]["version"] == 9
    assert _code(lambda: verify(signed, [key.public_key()], NOW, None)) == "release.signature"


def test_keys_round_trip_and_the_private_key_is_owner_only(tmp_path: Path) -> None:
    key = generate_key()
    private, public = tmp_path / "k" / "fleet.pem", tmp_path / "k" / "fleet.pub"
    private.parent.mkdir()
    private.write_text("old contents, world-readable")
    private.chmod(0o644)
    save_private_key(key, private)
    save_public_key(key.public_key(), public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert key_id(load_private_key(private).public_key()) == key_id(load_public_key(public))
    assert len(key_id(key.public_key())) == 16
    assert _code(lambda: load_public_key(private)) == "input.invalid"
    assert _code(lambda: load_private_key(public)) == "input.invalid"
    assert _code(lambda: load_public_key(tmp_path / "absent.pub")) == "input.not_found"


@pytest.mark.parametrize("text", ["", "[1, 2]", "{}", "{not json", "\udcff"])
def test_a_file_that_is_no_release_says_what_to_use_instead(text: str) -> None:
    # The CLI's line was "release is invalid at (top): ... [release.invalid]", no fix.
    with pytest.raises(EdgeAgentError) as caught:
        parse_signed_release(text.encode("utf-8", "surrogateescape"))
    assert caught.value.code == "release.invalid"
    assert "edge-fleet publish-model" in caught.value.fix


def test_a_release_is_never_built_under_a_name_its_manifest_refuses(
    tmp_path: Path, manifest: Manifest
) -> None:
    # The manifest is renamed without validation: a release named "Lobby_Cam" was written
    # to the store and then could never be read back.
    (tmp_path / "model.onnx").write_bytes(b"x")
    for name in ("Lobby_Cam", "cam.int8", "-cam", ""):
        with pytest.raises(EdgeAgentError, match="lowercase") as caught:
            build_release(
                name=name, version=1, folder=tmp_path, files=["model.onnx"],
                model="model.onnx", manifest=manifest,
            )  # fmt: skip
        assert caught.value.code == "input.invalid"


@pytest.mark.parametrize(
    ("mode", "precision"),
    [(None, "f32"), ("int8", "int8"), ("int8-scope", "int8"), ("int8-accuracy", "int8"),
     ("weights-int8", "int8"), ("weights-int4", "int4"), ("bf16", "f32"), ("fp32", "f32")],
)  # fmt: skip
def test_the_weights_precision_is_what_calibration_made(
    manifest: Manifest, mode: str | None, precision: str
) -> None:
    # The agent's own INT8 model was listed as f32, and a calibration that fell back to the
    # FP32 model was released as int8.
    quantization = None if mode is None else QuantizationInfo(
        mode=mode, metric="top1-agreement", metric_before=1.0, metric_after=1.0,
        max_drop=0.01, samples=8, speedup=1.0, report="model.report.json",
    )  # fmt: skip
    assert (
        weights_precision(manifest.model_copy(update={"quantization": quantization})) == precision
    )
