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


class Repo:
    """Published releases and their files, below `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, int], RepoEntry] = {}
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
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        with self._lock:
            self._cache.pop((release.name, release.version), None)
        return RepoEntry(signed, folder, ChunkMap(release))

    def get(self, name: str, version: int) -> RepoEntry | None:
        """The published release `name` v`version`, or None if this repository lacks it."""
        if not is_safe_name(name) or version < 1:
            return None
        key = (name, version)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        folder = self.root / name / str(version)
        try:
            signed = load_signed_release(folder / RELEASE_FILE)
        except EdgeAgentError:
            return None
        entry = RepoEntry(signed, folder, ChunkMap(signed.release))
        with self._lock:
            self._cache[key] = entry
        return entry

    def highest(self, name: str) -> int:
        """Highest version of `name` published from here (0 if none)."""
        folder = self.root / name
        if not is_safe_name(name) or not folder.is_dir():
            return 0
        return max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=0)
