"""Re-hash a stored version against its release and say what is wrong, file by file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import hash_file
from edge_agent.store.release import RELEASE_FILE, Release

__all__ = ["RELEASE_FILE"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in the store: where, and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def verify_version(label: str, folder: Path, release: Release) -> list[Problem]:
    """Every file of `release` is in `folder`, a regular file, of the right size and sha256,
    and nothing else is there."""
    problems = []
    expected = {entry.path for entry in release.files} | {RELEASE_FILE}
    for entry in release.files:
        path = folder / entry.path
        try:
            digest, size = hash_file(path)
        except EdgeAgentError as exc:
            problems.append(Problem(f"{label} {entry.path}", exc.problem))
            continue
        if size != entry.size:
            problems.append(
                Problem(f"{label} {entry.path}", f"{size} bytes, the release says {entry.size}")
            )
        elif digest != entry.sha256:
            problems.append(
                Problem(
                    f"{label} {entry.path}",
                    f"sha256 {digest[:16]}, the release says {entry.sha256[:16]}",
                )
            )
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            relative = (Path(dirpath) / name).relative_to(folder).as_posix()
            if relative not in expected:
                problems.append(Problem(f"{label} {relative}", "not part of the release"))
    return problems
