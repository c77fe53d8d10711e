"""Sign a model file and publish it: into the fleet's repository, then retained on MQTT."""

from __future__ import annotations

from pathlib import Path

from edge_agent.comms.base import Communicator
from edge_agent.fleet.repo import Repo, RepoEntry
from edge_agent.protocol.topics import Topics
from edge_agent.store.release import SignedRelease, release_for_file

__all__ = ["publish_release", "release_for_file"]


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
