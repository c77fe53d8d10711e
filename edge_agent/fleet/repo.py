"""The fleet's copy of what it published: `<repo>/<name>/<version>/` with release.json.

`edge-fleet publish-model` adds to it and `edge-fleet serve` reads chunks from
it. Names from the wire are checked before they become paths.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from edge_agent.delivery.chunks import ChunkMap
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import is_safe_name
from edge_agent.store.release import SignedRelease, check_paths, load_signed_release

RELEASE_FILE = "release.json"


@dataclass(frozen=True, slots=True)
class RepoEntry:
    signed: SignedRelease
    folder: Path
    chunks: ChunkMap


_Stamp = tuple[int, int, int]
"""A release file's inode, mtime and size: what changes when it is published again."""


class Repo:
    """Published releases and their files, below `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Each entry with the stamp of the file it was read from: `publish-model` runs in
        # another process than `serve`, and a re-publish (a fresh expiry: a new release id)
        # was never seen by a running `serve`, which then refused every join of it.
        self._cache: dict[tuple[str, int], tuple[_Stamp, RepoEntry]] = {}
        self._lock = threading.Lock()

    def add(self, signed: SignedRelease, source: Path) -> RepoEntry:
        """Copy a release's files (relative to `source`) into the repository.

        Raises:
            EdgeAgentError: store.path for unsafe names; release.rollback if that
                version was already published with other content.
        """
        release = signed.release
        check_paths(release)
        folder = self.root / release.name / str(release.version)
        if (folder / RELEASE_FILE).exists():
            old = load_signed_release(folder / RELEASE_FILE)
            if [f.sha256 for f in old.release.files] != [f.sha256 for f in release.files]:
                raise EdgeAgentError(
                    f"{release.name} v{release.version} was already published with other files",
                    "publish a higher --version; versions only go up",
                    code="release.rollback",
                )
        staging = folder.with_name(f".{release.version}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        for entry in release.files:
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / entry.path, target)
        (staging / RELEASE_FILE).write_bytes(signed.to_json())
        # Set aside, not deleted, before the new folder goes in: a `serve` reading chunks
        # meanwhile misses them for two renames, not for a whole tree's removal.
        aside = folder.with_name(f".{release.version}.old")
        shutil.rmtree(aside, ignore_errors=True)
        if folder.exists():
            folder.rename(aside)
        staging.rename(folder)
        shutil.rmtree(aside, ignore_errors=True)
        with self._lock:
            self._cache.pop((release.name, release.version), None)
        return RepoEntry(signed, folder, ChunkMap(release))

    def get(self, name: str, version: int, recheck: bool = True) -> RepoEntry | None:
        """The published release `name` v`version`, or None if this repository lacks it.

        `recheck=False` takes what was read before without a look at the file: for the
        acks of a broadcast, a message per frame from every box, where a stat each cost
        more than the rest of their handling.
        """
        if not is_safe_name(name) or version < 1:
            return None
        key = (name, version)
        folder = self.root / name / str(version)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and not recheck:
            return cached[1]
        try:
            info = (folder / RELEASE_FILE).stat()
        except OSError:
            # Between the two renames of a re-publish, or gone: what was read last, if any.
            return cached[1] if cached is not None else None
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            signed = load_signed_release(folder / RELEASE_FILE)
        except EdgeAgentError:
            return None
        entry = RepoEntry(signed, folder, ChunkMap(signed.release))
        with self._lock:
            self._cache[key] = (stamp, entry)
        return entry

    def highest(self, name: str) -> int:
        """Highest version of `name` published from here (0 if none)."""
        folder = self.root / name
        if not is_safe_name(name) or not folder.is_dir():
            return 0
        return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=0)
