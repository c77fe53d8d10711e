"""Sign a model file and publish it: into the fleet's repository, then retained on MQTT."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.catalog.manifest import load_manifest
from edge_agent.comms.base import Communicator
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.repo import Repo, RepoEntry
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import (
    DEFAULT_CHUNK,
    DEFAULT_LIFETIME,
    Precision,
    SignedRelease,
    build_release,
    sign,
)


def release_for_file(
    path: Path,
    *,
    name: str | None,
    version: int,
    key: Ed25519PrivateKey,
    manifest_path: Path | None = None,
    precision: Precision | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    lifetime: timedelta = DEFAULT_LIFETIME,
) -> SignedRelease:
    """A signed release of a model file and its manifest (beside it as `<stem>.toml`).

    An IR's `.xml` brings its `.bin`.

    Raises:
        EdgeAgentError: input.not_found, config.invalid, release.invalid.
    """
    if not path.is_file():
        raise EdgeAgentError(f"model file {path} does not exist", code="input.not_found")
    sidecar = manifest_path or path.with_suffix(".toml")
    if not sidecar.is_file():
        raise EdgeAgentError(
            f"{path} has no manifest beside it ({sidecar.name})",
            "write one like models/*.toml, or pass --manifest",
            code="input.not_found",
        )
    manifest = load_manifest(sidecar)
    files = [path.name]
    if path.suffix.lower() == ".xml":
        files.append(path.with_suffix(".bin").name)
    release = build_release(
        name=name or manifest.name,
        version=version,
        folder=path.parent,
        files=files,
        model=path.name,
        manifest=manifest,
        precision=precision or ("int8" if manifest.quantization else "f32"),
        chunk_size=chunk_size,
        lifetime=lifetime,
    )
    return sign(release, key)


def publish_release(
    comm: Communicator, topics: Topics, repo: Repo, signed: SignedRelease, source: Path
) -> RepoEntry:
    """Copy the files into `repo`, then publish the release retained on its topics.

    The version's own topic always; `<name>/latest` only when it is the highest
    version in the repository, so publishing an old version again never moves
    devices backwards (they would refuse it anyway: release.rollback).
    """
    entry = repo.add(signed, source)
    release = signed.release
    payload = signed.to_json()
    comm.publish(topics.release(release.name, release.version), payload, qos=1, retain=True)
    if release.version >= repo.highest(release.name):
        comm.publish(topics.release_latest(release.name), payload, qos=1, retain=True)
    return entry
