"""A release's chunks, numbered across its files in order, and where each one lives.

Both sides use the same numbering: chunk `i` of the release is chunk `j` of
file `k`, at byte `j * chunk_size` of that file. The broadcast, the repair
requests and the device's bitmap all speak in these global indices.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from edge_agent.store.release import Release, ReleaseFile, canonical_bytes


def release_id(release: Release) -> str:
    """16 hex digits naming one exact release (its signed content) on the wire."""
    return hashlib.sha256(canonical_bytes(release)).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """Where chunk `index` of a release lives and what it must hash to."""

    index: int
    file: ReleaseFile
    offset: int
    length: int
    sha256: str


class ChunkMap:
    """Global chunk index -> file, offset, length and expected hash."""

    def __init__(self, release: Release) -> None:
        self.release = release
        self.id = release_id(release)
        self.chunk_size = release.chunk_size
        refs: list[ChunkRef] = []
        for entry in release.files:
            for j, digest in enumerate(entry.chunks):
                offset = j * release.chunk_size
                length = min(release.chunk_size, entry.size - offset)
                refs.append(ChunkRef(len(refs), entry, offset, length, digest))
        self.refs = refs

    def __len__(self) -> int:
        return len(self.refs)

    def __getitem__(self, index: int) -> ChunkRef:
        return self.refs[index]

    def matches(self, index: int, data: bytes) -> bool:
        """True if `data` is exactly chunk `index`."""
        if not 0 <= index < len(self.refs):
            return False
        ref = self.refs[index]
        return len(data) == ref.length and hashlib.sha256(data).hexdigest() == ref.sha256


def read_chunk(folder: Path, ref: ChunkRef) -> bytes:
    """Read one chunk of a release whose files are below `folder` (the fleet's copy)."""
    fd = os.open(folder / ref.file.path, os.O_RDONLY)
    try:
        return os.pread(fd, ref.length, ref.offset)
    finally:
        os.close(fd)
